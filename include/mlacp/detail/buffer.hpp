// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// A buffer that serves passes of any shape: the View a pass asks for (ensure), laid over one allocation sized by the
// largest pass seen so far. A layer that takes any batch and length per call (issue 34) reuses its workspaces this way:
// the allocation grows when a pass needs more and never shrinks, so calls that alternate shapes allocate nothing once
// the largest has run, and a shape's View is exactly its extents (row-major, contiguous), as the kernels expect.
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstddef>
#include <string>

namespace mlacp::detail {

/// The View of the current pass (`view()`: extents of the last ensure, unmanaged, over `storage`) and the allocation
/// under it (at least one value, so that a laid-out View never has a null data(), even with no element). The View is
/// valid while the Buffer lives and until the next ensure of other extents; what must outlive the owner (a caller's
/// output) is not a Buffer. V: a contiguous LayoutRight or LayoutLeft View type.
template <class V>
class Buffer {
 public:
  using view_type = V;
  using value_type = typename V::non_const_value_type;
  using memory_space = typename V::memory_space;
  using storage_type = Kokkos::View<value_type*, memory_space>;

  /// The View of the last ensure (empty before the first).
  const V& view() const { return view_; }
  /// Values the allocation holds (the largest pass's).
  std::size_t capacity() const { return storage_.extent(0); }
  /// Bytes of the allocation.
  std::size_t bytes() const { return capacity() * sizeof(value_type); }
  /// Whether a View is laid out (false before the first ensure, and after release()).
  bool laid_out() const { return laid_out_; }
  /// Returns the allocation to Kokkos.
  void release() {
    view_ = V();
    storage_ = storage_type();
    laid_out_ = false;
  }

  /// The View of extents `n...` over the allocation, which is replaced by one of exactly that many values (labelled
  /// `label`, uninitialised) only when it holds fewer. The values are whatever the memory held: a pass writes before
  /// it reads.
  template <class... Extents>
  const V& ensure(const char* label, Extents... n) {
    const std::size_t want[] = {static_cast<std::size_t>(n)...};
    bool same = laid_out_;
    for (std::size_t d = 0; same && d < sizeof...(n); ++d) same = view_.extent(d) == want[d];
    if (same) return view_;
    std::size_t values = 1;
    for (const std::size_t e : want) values *= e;
    // At least one value: a View with no element still points somewhere, because the layer reads an empty View as
    // "not needed" (a gradient no flag asks for) and a needed one of a rank with no token as a zero-sized View.
    if (std::max<std::size_t>(values, 1) > capacity())
      storage_ = storage_type(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
                              std::max<std::size_t>(values, 1));
    view_ = V(storage_.data(), static_cast<std::size_t>(n)...);
    laid_out_ = true;
    return view_;
  }

 private:
  storage_type storage_;
  V view_;
  bool laid_out_ = false;
};

/// `buffer`'s View of extents `n...` (Buffer::ensure): the first use allocates, a larger pass grows it, every other
/// reuses it.
template <class V, class... Extents>
const V& ensure(Buffer<V>& buffer, const char* label, Extents... n) {
  return buffer.ensure(label, n...);
}

/// Bytes a View spans (0 for an empty View), or a Buffer's allocation.
template <class V>
std::size_t bytes_of_one(const V& view) {
  return view.span() * sizeof(typename V::value_type);
}
template <class V>
std::size_t bytes_of_one(const Buffer<V>& buffer) {
  return buffer.bytes();
}

/// Bytes of the allocations of Views and Buffers.
template <class... Views>
std::size_t bytes_of(const Views&... views) {
  return (std::size_t{0} + ... + bytes_of_one(views));
}

}  // namespace mlacp::detail
