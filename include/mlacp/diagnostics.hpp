// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Process-wide counters of misuse that mlacp repaired instead of failing, for tests and monitoring.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mlacp::diagnostics {

/// Collective handles that were launched but destroyed (or overwritten) without wait(): each was completed by its
/// destructor and reported on stderr.
std::uint64_t unwaited_handles();

/// Handles abandoned (destroyed unwaited) on a broken mesh (Mesh::report_failure): their requests could not be
/// completed, so each was parked with the buffers it uses, which stay allocated for the life of the process.
std::uint64_t parked_handles();

/// Communication buffers (send, receive, host staging) allocated so far. Buffers are pooled by size, so in a
/// steady state (same shapes every iteration) this stops growing after the first iteration.
std::uint64_t communication_buffer_allocations();
/// Bytes of those allocations.
std::uint64_t communication_buffer_bytes();

/// Every Kokkos allocation (each View, in any memory space; also Kokkos' own internal buffers) counted since
/// count_view_allocations() was first called, through the Kokkos Tools allocate-data callback (a callback a loaded
/// tool had installed is still called). Counting is opt-in because an installed callback makes Kokkos treat a tool as
/// loaded, which costs every kernel launch a little (its name is built for the tools interface). Call it after
/// Kokkos::initialize; it is idempotent, and re-installs the callback if something replaced it. Returns whether the
/// counter is installed.
bool count_view_allocations();
/// Allocations counted (0 until count_view_allocations()).
std::uint64_t view_allocations();
/// Bytes of those allocations.
std::uint64_t view_allocation_bytes();
/// The labels of the most recent counted allocations (at most 64), oldest first: which Views were allocated.
std::vector<std::string> recent_view_allocations();
/// Bytes of the counted allocations not yet freed (count_view_allocations() also installs a deallocate-data
/// callback, chained likewise): what Kokkos holds now of what it allocated since counting began. An allocation made
/// before counting began is not in it, and its release does not lower it.
std::uint64_t view_live_bytes();
/// The high-water mark of view_live_bytes() since counting began or since the last reset_view_peak_bytes().
std::uint64_t view_peak_bytes();
/// Starts a new high-water mark: view_peak_bytes() := view_live_bytes().
void reset_view_peak_bytes();

/// Communicators duplicated by meshes (Mesh::Ownership::duplicate) and not yet freed.
std::int64_t open_communicators();

namespace detail {
/// Counts one unwaited handle and reports it on stderr.
void report_unwaited_handle(const std::string& name) noexcept;
/// Keeps `memory` (never freed) reachable from a process-wide list for the life of the process: for memory MPI may
/// still read or write after its owner is gone (a freed send request's buffer, a parked handle's state), which leak
/// checkers then do not report.
void keep_until_exit(void* memory) noexcept;
/// Counts one parked handle and keeps `state` (the handle's state, with the request and the buffers it keeps alive)
/// reachable from a process-wide list for the life of the process: never freed, since MPI may still write its buffers,
/// and never reported as a leak by leak checkers (the memory stays reachable).
void park_handle(void* state) noexcept;
void count_buffer_allocation(std::size_t bytes) noexcept;
void count_communicator(int delta) noexcept;
}  // namespace detail

}  // namespace mlacp::diagnostics
