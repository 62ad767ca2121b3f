// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/diagnostics.hpp>

#include <atomic>
#include <cstdio>

namespace mlacp::diagnostics {
namespace {
std::atomic<std::uint64_t> g_unwaited{0};
std::atomic<std::uint64_t> g_buffers{0};
std::atomic<std::uint64_t> g_buffer_bytes{0};
std::atomic<std::int64_t> g_communicators{0};
}  // namespace

std::uint64_t unwaited_handles() { return g_unwaited.load(); }
std::uint64_t communication_buffer_allocations() { return g_buffers.load(); }
std::uint64_t communication_buffer_bytes() { return g_buffer_bytes.load(); }
std::int64_t open_communicators() { return g_communicators.load(); }

namespace detail {
void count_buffer_allocation(std::size_t bytes) noexcept {
  g_buffers.fetch_add(1);
  g_buffer_bytes.fetch_add(bytes);
}
void count_communicator(int delta) noexcept { g_communicators.fetch_add(delta); }

void report_unwaited_handle(const std::string& name) noexcept {
  g_unwaited.fetch_add(1);
  std::fprintf(stderr,
               "mlacp: collective '%s' was launched but never waited; it was completed when its handle was "
               "destroyed (wait() every handle exactly once)\n",
               name.c_str());
}
}  // namespace detail

}  // namespace mlacp::diagnostics
