// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/detail/pending_transport.hpp>
#include <mlacp/progress.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

namespace mlacp {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<detail::PendingTransport*> pending;
  std::atomic<std::size_t> count{0};
  std::atomic<std::size_t> polled{0};  // of `pending`, those with PendingTransport::polled()
  std::atomic<std::size_t> calls{0};
  std::atomic<std::size_t> blocks_summed{0};
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

namespace detail {

void register_pending(PendingTransport* transport) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.pending.push_back(transport);
  r.count.store(r.pending.size(), std::memory_order_relaxed);
  if (transport->polled()) r.polled.fetch_add(1, std::memory_order_relaxed);
}

void unregister_pending(PendingTransport* transport) noexcept {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto found = std::find(r.pending.begin(), r.pending.end(), transport);
  if (found == r.pending.end()) return;
  r.pending.erase(found);
  r.count.store(r.pending.size(), std::memory_order_relaxed);
  if (transport->polled()) r.polled.fetch_sub(1, std::memory_order_relaxed);
}

void count_blocks_summed_on_arrival(std::size_t blocks) noexcept {
  registry().blocks_summed.fetch_add(blocks, std::memory_order_relaxed);
}

std::size_t blocks_summed_on_arrival() noexcept { return registry().blocks_summed.load(std::memory_order_relaxed); }

bool test_pending(PendingTransport* transport) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  return transport->test();
}

}  // namespace detail

void progress() {
  auto& r = registry();
  if (r.count.load(std::memory_order_relaxed) == 0) return;
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto* transport : r.pending) transport->progress();
  r.calls.fetch_add(1, std::memory_order_relaxed);
}

std::size_t pending_collectives() noexcept { return registry().count.load(std::memory_order_relaxed); }

std::size_t polled_collectives() noexcept { return registry().polled.load(std::memory_order_relaxed); }

std::size_t progress_calls() noexcept { return registry().calls.load(std::memory_order_relaxed); }

}  // namespace mlacp
