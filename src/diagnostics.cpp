// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/diagnostics.hpp>

#include <mlacp/compat.hpp>

#include <atomic>
#include <cstdio>
#include <deque>
#include <mutex>
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
std::mutex g_labels_mutex;
std::deque<std::string> g_labels;
constexpr std::size_t kept_labels = 64;
// The callback a tool had installed before ours (chained, so that counting does not hide allocations from it).
std::atomic<compat::tools::allocate_data_callback> g_previous{nullptr};

void on_allocate(const compat::tools::space_handle handle, const char* label, const void* pointer,
                 const std::uint64_t bytes) {
  g_views.fetch_add(1);
  g_view_bytes.fetch_add(bytes);
  {
    std::lock_guard<std::mutex> lock(g_labels_mutex);
    g_labels.emplace_back(label != nullptr ? label : "");
    if (g_labels.size() > kept_labels) g_labels.pop_front();
  }
  if (const auto previous = g_previous.load()) previous(handle, label, pointer, bytes);
}
}  // namespace

bool count_view_allocations() {
  const auto current = compat::tools::current_allocate_data_callback();
  if (current == &on_allocate) return true;
  g_previous.store(current);
  compat::tools::set_allocate_data_callback(&on_allocate);
  return compat::tools::current_allocate_data_callback() == &on_allocate;
}
std::uint64_t view_allocations() { return g_views.load(); }
std::uint64_t view_allocation_bytes() { return g_view_bytes.load(); }
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
