// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/collective_bytes.hpp>

#include <atomic>

namespace mlacp {
namespace {
std::atomic<std::uint64_t> all_to_all_bytes{0};
std::atomic<std::uint64_t> all_gather_bytes{0};
std::atomic<std::uint64_t> reduce_scatter_bytes{0};
std::atomic<std::uint64_t> send_recv_bytes{0};
}  // namespace

CollectiveBytes collective_bytes() noexcept {
  CollectiveBytes out;
  out.all_to_all = all_to_all_bytes.load(std::memory_order_relaxed);
  out.all_gather = all_gather_bytes.load(std::memory_order_relaxed);
  out.reduce_scatter = reduce_scatter_bytes.load(std::memory_order_relaxed);
  out.send_recv = send_recv_bytes.load(std::memory_order_relaxed);
  return out;
}

void reset_collective_bytes() noexcept {
  all_to_all_bytes.store(0, std::memory_order_relaxed);
  all_gather_bytes.store(0, std::memory_order_relaxed);
  reduce_scatter_bytes.store(0, std::memory_order_relaxed);
  send_recv_bytes.store(0, std::memory_order_relaxed);
}

namespace detail {
void count_collective_bytes(CountedCollective kind, std::uint64_t bytes) noexcept {
  switch (kind) {
    case CountedCollective::all_to_all:
      all_to_all_bytes.fetch_add(bytes, std::memory_order_relaxed);
      return;
    case CountedCollective::all_gather:
      all_gather_bytes.fetch_add(bytes, std::memory_order_relaxed);
      return;
    case CountedCollective::reduce_scatter:
      reduce_scatter_bytes.fetch_add(bytes, std::memory_order_relaxed);
      return;
    case CountedCollective::send_recv:
      send_recv_bytes.fetch_add(bytes, std::memory_order_relaxed);
      return;
  }
}
}  // namespace detail

}  // namespace mlacp
