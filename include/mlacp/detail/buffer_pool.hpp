// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Communication buffers reused across iterations: a training loop launches the same collectives with the same shapes
// every step, so after the first step no send, receive or staging buffer is allocated again.
#pragma once

#include <mlacp/diagnostics.hpp>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace mlacp::detail {

/// A process-wide pool of byte buffers in MemSpace, keyed by size. A buffer is free when the pool holds the only
/// reference to it (its handle was destroyed). Buffers are returned to Kokkos at Kokkos::finalize (or by
/// release_unused). Reuse is ordered on device spaces when the buffer's previous handle was waited on the same
/// execution-space instance as the next launch (the usual case); otherwise fence between them.
template <class MemSpace>
class BufferPool {
 public:
  using bytes_view = Kokkos::View<char*, MemSpace>;

  static BufferPool& instance() {
    static BufferPool* pool = [] {
      auto* p = new BufferPool();  // never destroyed: it is emptied at Kokkos::finalize, before its memory space goes
      Kokkos::push_finalize_hook([p] { p->clear(); });
      return p;
    }();
    return *pool;
  }

  /// A buffer of exactly `bytes` bytes that no handle is using, allocating one only if none is free.
  bytes_view acquire(std::size_t bytes, const std::string& label) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& view : views_)
      if (view.extent(0) == bytes && view.use_count() == 1) return view;
    views_.emplace_back(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp pool: " + label), bytes);
    diagnostics::detail::count_buffer_allocation(bytes);
    return views_.back();
  }

  /// Frees the buffers no handle is using; returns how many.
  std::size_t release_unused() {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto before = views_.size();
    std::vector<bytes_view> kept;
    for (auto& view : views_)
      if (view.use_count() > 1) kept.push_back(view);
    views_.swap(kept);
    return before - views_.size();
  }

  std::size_t buffers() {
    std::lock_guard<std::mutex> lock(mutex_);
    return views_.size();
  }

 private:
  BufferPool() = default;
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    views_.clear();
  }

  std::mutex mutex_;
  std::vector<bytes_view> views_;
};

}  // namespace mlacp::detail
