// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Process-wide counters of misuse that mlacp repaired instead of failing, for tests and monitoring.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mlacp::diagnostics {

/// Collective handles that were launched but destroyed (or overwritten) without wait(): each was completed by its
/// destructor and reported on stderr.
std::uint64_t unwaited_handles();

/// Communication buffers (send, receive, host staging) allocated so far. Buffers are pooled by size, so in a
/// steady state (same shapes every iteration) this stops growing after the first iteration.
std::uint64_t communication_buffer_allocations();
/// Bytes of those allocations.
std::uint64_t communication_buffer_bytes();

/// Communicators duplicated by meshes (Mesh::Ownership::duplicate) and not yet freed.
std::int64_t open_communicators();

namespace detail {
/// Counts one unwaited handle and reports it on stderr.
void report_unwaited_handle(const std::string& name) noexcept;
void count_buffer_allocation(std::size_t bytes) noexcept;
void count_communicator(int delta) noexcept;
}  // namespace detail

}  // namespace mlacp::diagnostics
