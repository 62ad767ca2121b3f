// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The sum of a pairwise reduce-scatter's P blocks, taken as they arrive: block r is added as soon as it and every block
// before it are in, so that the blocks that came first are summed while the later ones still travel, and the sum is
// still taken in rank order, bit for bit the one-pass sum_blocks (block_layout.hpp) whatever the order of arrival.
#pragma once

#include <mlacp/compat.hpp>
#include <mlacp/detail/block_layout.hpp>
#include <mlacp/detail/buffer_pool.hpp>
#include <mlacp/progress.hpp>

#include <Kokkos_Core.hpp>
#include <any>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mlacp::detail {

/// The run of blocks [first, end) (first < end, not the whole sum) added on `space`: block r is `own` for r == self,
/// else received + r * n. The partial sum is `partial` (read unless first == 0); the run's end is written to `partial`
/// (accumulation type), or, for the last run (`last`), rounded to `out`. Written as sum_blocks is (no nested lambda, no
/// per-value branch on the run's end), so that it runs as fast; a free function, since CUDA's extended lambdas may not
/// be defined in a private member.
template <class ExecSpace, class T, class Acc>
void add_block_run(const ExecSpace& space, const T* received, const T* own, const int self, Acc* partial, T* out,
                   const std::int64_t n, const int first, const int end, const bool last, const std::string& label) {
  const int from = first == 0 ? 1 : first;
  using policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  if (last) {
    Kokkos::parallel_for(
        label, policy(space, 0, n), KOKKOS_LAMBDA(const std::int64_t i) {
          Acc sum = partial[i];
          for (int r = from; r < end; ++r) sum += static_cast<Acc>(r == self ? own[i] : received[r * n + i]);
          out[i] = static_cast<T>(sum);
        });
  } else {
    Kokkos::parallel_for(
        label, policy(space, 0, n), KOKKOS_LAMBDA(const std::int64_t i) {
          Acc sum = first == 0 ? static_cast<Acc>(self == 0 ? own[i] : received[i]) : partial[i];
          for (int r = from; r < end; ++r) sum += static_cast<Acc>(r == self ? own[i] : received[r * n + i]);
          partial[i] = sum;
        });
  }
}

/// out = the sum in rank order of P blocks of n values: block r is `own` for r == self, else received + r * n. The
/// blocks are added in runs: a run starts at the first block not yet added and takes every block after it that has
/// arrived (this rank's own always has), one kernel on `space` per run, so that the blocks that arrive in rank order
/// are summed as they arrive and all of them at once (at wait) is the one pass of sum_blocks. The running sum is in
/// the accumulation type: `out` itself for float and double; for bf16 a pooled float buffer, taken only when a run
/// ends before the last block, and `out` is written once, rounded, by the last run. Every value is
/// sum = x_0; sum += x_1; ...; sum += x_{P-1}, as in sum_blocks, whichever runs compute it.
template <class ExecSpace, class T>
class RunningBlockSum {
 public:
  using Acc = compat::accumulation_t<T>;
  using memory_space = typename ExecSpace::memory_space;

  RunningBlockSum(const ExecSpace& space, const T* received, const T* own, int self, T* out, std::int64_t n, int parts,
                  std::string label)
      : space_(space),
        received_(received),
        own_(own),
        self_(self),
        out_(out),
        n_(n),
        parts_(parts),
        label_(std::move(label)),
        arrived_(static_cast<std::size_t>(parts), 0) {}

  /// Peer `peer`'s block has arrived while others are still in flight: adds the run it completes, if that run adds at
  /// least one block to another (block 0 alone would only be copied: it waits for block 1).
  void arrived(int peer) {
    arrived_[static_cast<std::size_t>(peer)] = 1;
    const int added = advance(/*at_least=*/next_ == 0 ? 2 : 1);
    if (added > 0) count_blocks_summed_on_arrival(static_cast<std::size_t>(added));
  }

  /// Every block has arrived (the collective's wait): adds the blocks not added yet, in one run.
  void complete() {
    for (auto& a : arrived_) a = 1;
    advance(1);
  }

 private:
  // Adds the run that starts at next_ if it has at least `at_least` blocks in; returns its length.
  int advance(const int at_least) {
    int end = next_;
    while (end < parts_ && (end == self_ || arrived_[static_cast<std::size_t>(end)] != 0)) ++end;
    if (end - next_ < at_least) return 0;
    add(next_, end);
    const int added = end - next_;
    next_ = end;
    return added;
  }

  void add(const int first, const int end) {
    const bool last = end == parts_;
    if (first == 0 && last) {  // every block at once: the one-pass sum
      sum_blocks(space_, received_, own_, self_, out_, n_, parts_, label_);
      return;
    }
    Acc* partial = partial_;
    if constexpr (std::is_same_v<Acc, T>) {
      partial = out_;
    } else if (partial == nullptr) {
      auto pooled = allocate_buffer<Acc, memory_space>(space_, label_ + " (float)", static_cast<std::size_t>(n_));
      partial_ = partial = pooled.view.data();
      partial_owner_ = pooled;
    }
    add_block_run(space_, received_, own_, self_, partial, out_, n_, first, end, last, label_);
  }

  ExecSpace space_;
  const T* received_;
  const T* own_;
  int self_;
  T* out_;
  std::int64_t n_;
  int parts_;
  std::string label_;
  std::vector<char> arrived_;
  int next_ = 0;
  Acc* partial_ = nullptr;
  std::any partial_owner_;  // the pooled float buffer of a bf16 sum, once a run ended before the last block
};

}  // namespace mlacp::detail
