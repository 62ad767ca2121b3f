// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/diagnostics.hpp>

#include <atomic>
#include <cstdio>

namespace mlacp::diagnostics {
namespace {
std::atomic<std::uint64_t> g_unwaited{0};
}

std::uint64_t unwaited_handles() { return g_unwaited.load(); }

namespace detail {
void report_unwaited_handle(const std::string& name) noexcept {
  g_unwaited.fetch_add(1);
  std::fprintf(stderr,
               "mlacp: collective '%s' was launched but never waited; it was completed when its handle was "
               "destroyed (wait() every handle exactly once)\n",
               name.c_str());
}
}  // namespace detail

}  // namespace mlacp::diagnostics
