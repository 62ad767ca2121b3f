// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/diagnostics.hpp>

#include <mlacp/compat.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace mlacp::diagnostics {
namespace {
std::atomic<std::uint64_t> g_unwaited{0};
std::atomic<std::uint64_t> g_parked{0};
std::atomic<std::uint64_t> g_buffers{0};
std::atomic<std::uint64_t> g_buffer_bytes{0};
std::atomic<std::int64_t> g_communicators{0};
std::atomic<std::uint64_t> g_views{0};
std::atomic<std::uint64_t> g_view_bytes{0};
// Guards the labels and the live allocations (allocations are rare next to kernels: a lock each is cheap).
std::mutex g_labels_mutex;
std::deque<std::string> g_labels;
constexpr std::size_t kept_labels = 64;
// The live counted allocations by address: a release subtracts only what was counted (an allocation made before
// counting began, released later, must not lower the live bytes).
// Never destroyed: a View released during static destruction may still call on_deallocate.
std::unordered_map<const void*, std::uint64_t>& live_allocations() {
  static auto* live = new std::unordered_map<const void*, std::uint64_t>();
  return *live;
}
std::uint64_t g_live_bytes = 0;
std::uint64_t g_peak_bytes = 0;
// The callbacks a tool had installed before ours (chained, so that counting does not hide allocations from it).
std::atomic<compat::tools::allocate_data_callback> g_previous{nullptr};
std::atomic<compat::tools::deallocate_data_callback> g_previous_deallocate{nullptr};

void on_allocate(const compat::tools::space_handle handle, const char* label, const void* pointer,
                 const std::uint64_t bytes) {
  g_views.fetch_add(1);
  g_view_bytes.fetch_add(bytes);
  {
    std::lock_guard<std::mutex> lock(g_labels_mutex);
    g_labels.emplace_back(label != nullptr ? label : "");
    if (g_labels.size() > kept_labels) g_labels.pop_front();
    auto& counted = live_allocations()[pointer];
    g_live_bytes += bytes - counted;  // an address seen again without its release: the new size replaces the old
    counted = bytes;
    g_peak_bytes = std::max(g_peak_bytes, g_live_bytes);
  }
  if (const auto previous = g_previous.load()) previous(handle, label, pointer, bytes);
}

void on_deallocate(const compat::tools::space_handle handle, const char* label, const void* pointer,
                   const std::uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(g_labels_mutex);
    auto& live = live_allocations();
    if (const auto it = live.find(pointer); it != live.end()) {
      g_live_bytes -= it->second;
      live.erase(it);
    }
  }
  if (const auto previous = g_previous_deallocate.load()) previous(handle, label, pointer, bytes);
}
}  // namespace

bool count_view_allocations() {
  // The release callback first: an allocation counted before it was installed would otherwise stay live forever.
  const auto current_deallocate = compat::tools::current_deallocate_data_callback();
  if (current_deallocate != &on_deallocate) {
    g_previous_deallocate.store(current_deallocate);
    compat::tools::set_deallocate_data_callback(&on_deallocate);
  }
  const auto current = compat::tools::current_allocate_data_callback();
  if (current != &on_allocate) {
    g_previous.store(current);
    compat::tools::set_allocate_data_callback(&on_allocate);
  }
  return compat::tools::current_allocate_data_callback() == &on_allocate &&
         compat::tools::current_deallocate_data_callback() == &on_deallocate;
}
std::uint64_t view_allocations() { return g_views.load(); }
std::uint64_t view_allocation_bytes() { return g_view_bytes.load(); }
std::uint64_t view_live_bytes() {
  std::lock_guard<std::mutex> lock(g_labels_mutex);
  return g_live_bytes;
}
std::uint64_t view_peak_bytes() {
  std::lock_guard<std::mutex> lock(g_labels_mutex);
  return g_peak_bytes;
}
void reset_view_peak_bytes() {
  std::lock_guard<std::mutex> lock(g_labels_mutex);
  g_peak_bytes = g_live_bytes;
}
std::vector<std::string> recent_view_allocations() {
  std::lock_guard<std::mutex> lock(g_labels_mutex);
  return {g_labels.begin(), g_labels.end()};
}

std::uint64_t unwaited_handles() { return g_unwaited.load(); }
std::uint64_t parked_handles() { return g_parked.load(); }
std::uint64_t communication_buffer_allocations() { return g_buffers.load(); }
std::uint64_t communication_buffer_bytes() { return g_buffer_bytes.load(); }
std::int64_t open_communicators() { return g_communicators.load(); }

namespace detail {
void count_buffer_allocation(std::size_t bytes) noexcept {
  g_buffers.fetch_add(1);
  g_buffer_bytes.fetch_add(bytes);
}
void count_communicator(int delta) noexcept { g_communicators.fetch_add(delta); }
void keep_until_exit(void* memory) noexcept {
  // A list reachable from a global for the life of the process (deliberately never destroyed): what it holds stays
  // reachable, so it is neither freed while MPI may still use it nor reported as a leak.
  static std::mutex mutex;
  static auto* kept = new std::vector<void*>();
  try {
    const std::lock_guard<std::mutex> lock(mutex);
    kept->push_back(memory);
  } catch (...) {
    // Out of memory for the list's entry: the memory is leaked unreachable instead, which is still safe.
  }
}
void park_handle(void* state) noexcept {
  keep_until_exit(state);
  g_parked.fetch_add(1);
}

void report_unwaited_handle(const std::string& name) noexcept {
  g_unwaited.fetch_add(1);
  std::fprintf(stderr,
               "mlacp: collective '%s' was launched but never waited; it was completed when its handle was "
               "destroyed (wait() every handle exactly once)\n",
               name.c_str());
}
}  // namespace detail

}  // namespace mlacp::diagnostics
