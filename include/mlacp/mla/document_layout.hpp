// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The document layout of a packed variable-length sequence (`cu_seqlens`, the "THD" layout): cumulative document
// offsets over the global packed sequence of S tokens,
//   c[0] = 0 < c[1] < ... < c[n] = S,   document d = tokens [c[d], c[d+1]),
// shared by every rank and applied to every batch row alike (B is usually 1 for packed data; a batch of rows with
// different packings is not expressible). Attention is causal within a document and never crosses one: query t sees
// the keys k with start_of(t) <= k <= t; RoPE positions restart at each document's start (position = t - start_of(t)).
// An empty layout (default-constructed) is one document of whatever length the sequence has: plain causal attention
// and positions equal to the token index. A layout of exactly one document is treated as empty by the kernels.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mlacp {

/// The kernels' view of a DocumentLayout in memory space MemSpace: the offsets c[0..n] (empty: one document of
/// `total` tokens). Trivially copyable; start_of / end_of / doc_of are callable wherever MemSpace is reachable.
template <class MemSpace>
struct DocumentOffsets {
  Kokkos::View<const std::int64_t*, MemSpace> offsets;  // n + 1 entries, or empty: one document
  std::int64_t total = 0;                               // S

  /// True when every token is in one document (no offsets to search).
  KOKKOS_INLINE_FUNCTION bool single() const { return offsets.extent(0) == 0; }
  /// Number of documents.
  KOKKOS_INLINE_FUNCTION std::int64_t documents() const {
    return single() ? 1 : static_cast<std::int64_t>(offsets.extent(0)) - 1;
  }
  /// The document of token t (0 <= t < total): the last d with c[d] <= t (binary search, log2(n) loads).
  KOKKOS_INLINE_FUNCTION std::int64_t doc_of(std::int64_t t) const {
    if (single()) return 0;
    std::int64_t lo = 0, hi = static_cast<std::int64_t>(offsets.extent(0)) - 1;  // c[lo] <= t < c[hi]
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (offsets(mid) <= t)
        lo = mid;
      else
        hi = mid;
    }
    return lo;
  }
  /// First token of t's document (the first key query t may see).
  KOKKOS_INLINE_FUNCTION std::int64_t start_of(std::int64_t t) const { return single() ? 0 : offsets(doc_of(t)); }
  /// One past the last token of t's document (queries [t, end_of(t)) see key t).
  KOKKOS_INLINE_FUNCTION std::int64_t end_of(std::int64_t t) const { return single() ? total : offsets(doc_of(t) + 1); }
};

/// A validated `cu_seqlens` with a host copy and a copy in the default execution space's memory.
class DocumentLayout {
 public:
  using device_memory = Kokkos::DefaultExecutionSpace::memory_space;

  /// One document (plain causal attention) whatever the sequence length.
  DocumentLayout() = default;

  /// From cu_seqlens over a packed sequence of `total` tokens. Throws mlacp::InvalidArgument naming the first bad
  /// entry unless cu_seqlens has at least 2 entries, c[0] = 0, c[n] = total and c is strictly increasing.
  DocumentLayout(std::vector<std::int64_t> cu_seqlens, std::int64_t total) {
    validate(cu_seqlens, total);
    store(std::move(cu_seqlens), total, 0);
    copy_to_device();
  }

  /// Makes this layout cu_seqlens over `total` tokens (empty cu_seqlens: the empty layout), reusing its offset Views:
  /// they are (re)allocated only when more than `capacity` offsets (and more than they hold) are needed, so a layout
  /// reassigned every call with at most capacity - 1 documents allocates no View after its first use. Returns false
  /// (and does nothing) when the layout is already this one. Checks as the constructor (InvalidArgument). `space` is
  /// the execution-space instance whose kernels read the offsets: it is fenced (that instance only, not every one)
  /// before offsets it may still read are overwritten, and the new offsets are copied to the device on it. (Offsets
  /// that outgrow the Views reallocate them; freeing the old ones is a global fence of Kokkos 4's own.)
  template <class ExecSpace>
  bool assign(const ExecSpace& space, const std::vector<std::int64_t>& cu_seqlens, std::int64_t total,
              std::size_t capacity) {
    if (cu_seqlens.empty()) {
      if (empty()) return false;
      compat::fence(space, "mlacp::DocumentLayout::assign");
      host_offsets_.clear();
      total_ = 0;
      count_ = 0;
      return true;
    }
    if (cu_seqlens == host_offsets_ && total == total_) return false;
    validate(cu_seqlens, total);
    compat::fence(space, "mlacp::DocumentLayout::assign");
    store(cu_seqlens, total, capacity);
    copy_to_device(space);
    return true;
  }

  /// The checks of the constructor, alone. `who` prefixes the message.
  static void validate(const std::vector<std::int64_t>& c, std::int64_t total, const char* who = "DocumentLayout") {
    const std::string prefix = std::string("mlacp::") + who + ": cu_seqlens";
    if (total < 1)
      throw InvalidArgument(prefix + " over a sequence of " + std::to_string(total) +
                            " tokens; expected a sequence of at least 1 token");
    if (c.size() < 2)
      throw InvalidArgument(prefix + " has " + std::to_string(c.size()) +
                            " entries; expected at least 2 (0 and the sequence length " + std::to_string(total) + ")");
    if (c.front() != 0)
      throw InvalidArgument(prefix + "[0] = " + std::to_string(c.front()) + "; expected 0 (offsets start at 0)");
    for (std::size_t i = 1; i < c.size(); ++i)
      if (c[i] <= c[i - 1])
        throw InvalidArgument(prefix + "[" + std::to_string(i) + "] = " + std::to_string(c[i]) + " <= cu_seqlens[" +
                              std::to_string(i - 1) + "] = " + std::to_string(c[i - 1]) +
                              "; expected strictly increasing offsets (every document at least 1 token)");
    if (c.back() != total)
      throw InvalidArgument(prefix + "[" + std::to_string(c.size() - 1) + "] = " + std::to_string(c.back()) +
                            "; expected the sequence length " + std::to_string(total) + " (offsets end at S)");
  }

  /// True for the empty layout (one document of any length).
  bool empty() const { return host_offsets_.empty(); }
  /// True when the kernels see one document (empty, or cu_seqlens = {0, S}).
  bool single() const { return count_ == 0; }
  /// S of a non-empty layout; 0 for the empty one.
  std::int64_t total() const { return total_; }
  /// Number of documents (1 for the empty layout).
  std::int64_t documents() const { return empty() ? 1 : static_cast<std::int64_t>(host_offsets_.size()) - 1; }
  /// cu_seqlens as given (empty for the empty layout).
  const std::vector<std::int64_t>& cu_seqlens() const { return host_offsets_; }

  /// Host queries (t in [0, S)); see DocumentOffsets.
  std::int64_t doc_of(std::int64_t t) const { return host(total_).doc_of(t); }
  std::int64_t start_of(std::int64_t t) const { return host(total_).start_of(t); }
  std::int64_t end_of(std::int64_t t) const { return host(total_).end_of(t); }

  /// The offsets in host memory, for a sequence of n_s tokens (n_s is the document length of the empty layout).
  DocumentOffsets<Kokkos::HostSpace> host(std::int64_t n_s) const { return {used(host_), n_s}; }

  /// The offsets where ExecSpace can read them (the default memory space's copy if it is reachable, else the host
  /// copy), for a sequence of n_s tokens. Throws mlacp::InvalidArgument naming both lengths unless the layout is empty
  /// or covers exactly n_s tokens; `who` names the caller.
  template <class ExecSpace>
  auto offsets_for(std::int64_t n_s, const char* who) const {
    check_total(n_s, who);
    if constexpr (Kokkos::SpaceAccessibility<ExecSpace, device_memory>::accessible) {
      return DocumentOffsets<device_memory>{used(device_), n_s};
    } else {
      static_assert(Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible,
                    "mlacp::DocumentLayout: the execution space reaches neither the default memory space nor host");
      return DocumentOffsets<Kokkos::HostSpace>{used(host_), n_s};
    }
  }

  /// Throws unless the layout is empty or covers exactly n_s tokens.
  void check_total(std::int64_t n_s, const char* who) const {
    if (!empty() && total_ != n_s)
      throw InvalidArgument(
          std::string("mlacp::") + who + ": the document layout covers S = " + std::to_string(total_) +
          " tokens, the sequence has " + std::to_string(n_s) + "; expected cu_seqlens ending at the sequence length");
  }

 private:
  // Takes validated offsets over `total` tokens into the host list and, for more than one document, the host offset
  // View (the Views are reused when they hold enough, else allocated for max(offsets, capacity)).
  void store(std::vector<std::int64_t> cu_seqlens, std::int64_t total, std::size_t capacity) {
    host_offsets_ = std::move(cu_seqlens);
    total_ = total;
    count_ = 0;
    const std::size_t n = host_offsets_.size();
    if (n == 2) return;  // one document: the kernels' fast path (no offsets)
    if (host_.extent(0) < n) {
      host_ = Kokkos::View<std::int64_t*, Kokkos::HostSpace>(
          Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::cu_seqlens (host)"), n > capacity ? n : capacity);
      device_ = Kokkos::create_mirror_view(device_memory(), host_);
    }
    for (std::size_t i = 0; i < n; ++i) host_(i) = host_offsets_[i];
    count_ = n;
  }

  // Copies the offsets in use into the default memory space's View: on the instance `space...` when given (ordered
  // before its kernels), else with Kokkos' blocking deep_copy.
  template <class... ExecSpace>
  void copy_to_device(const ExecSpace&... space) {
    if (count_ == 0) return;
    const auto in_use = std::make_pair(std::size_t(0), count_);
    Kokkos::deep_copy(space..., Kokkos::subview(device_, in_use), Kokkos::subview(host_, in_use));
  }

  // The offsets in use of a View that may hold more (assign reuses larger Views); empty when single().
  template <class ViewType>
  Kokkos::View<const std::int64_t*, typename ViewType::memory_space> used(const ViewType& v) const {
    if (count_ == v.extent(0)) return v;
    return Kokkos::subview(v, std::make_pair(std::size_t(0), count_));
  }

  std::int64_t total_ = 0;
  std::vector<std::int64_t> host_offsets_;
  Kokkos::View<std::int64_t*, Kokkos::HostSpace> host_;  // the offsets in [0, count_); may hold more
  Kokkos::View<std::int64_t*, device_memory> device_;    // the same in the default memory space
  std::size_t count_ = 0;                                // offsets in use; 0 when single()
};

}  // namespace mlacp
