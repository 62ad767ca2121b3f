// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Process-wide counters of misuse that mlacp repaired instead of failing, for tests and monitoring.
#pragma once

#include <cstdint>
#include <string>

namespace mlacp::diagnostics {

/// Collective handles that were launched but destroyed (or overwritten) without wait(): each was completed by its
/// destructor and reported on stderr.
std::uint64_t unwaited_handles();

namespace detail {
/// Counts one unwaited handle and reports it on stderr.
void report_unwaited_handle(const std::string& name) noexcept;
}  // namespace detail

}  // namespace mlacp::diagnostics
