// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Allocation failures as mlacp errors (OutOfMemory, error.hpp): what was being allocated, the bytes asked for and the
// bytes the rank had. mlacp's own allocations of known size (the tools' inputs, the weights and their gradients, the
// collectives' receive buffers) go through allocate_view below and name the exact bytes; a failure deeper inside
// Kokkos (a workspace View of a forward) is recognised by translate_allocation_failure from the exception Kokkos
// throws (its label and its rounded size). Where the failure can leave other ranks waiting, the caller reports it on
// the mesh's failure channel (Mesh::report_failure) or agrees on it before any collective.
#pragma once

#include <mlacp/error.hpp>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>

namespace mlacp {

/// Bytes this rank can still allocate: the kernel's MemAvailable (/proc/meminfo), bounded by the address-space limit
/// (RLIMIT_AS) less the address space the process already uses; -1 when neither is known.
std::int64_t available_memory_bytes();

/// "2.00 GiB (2147483648 bytes)": a byte count for messages.
std::string bytes_string(std::int64_t bytes);

namespace detail {

/// The OutOfMemory for an allocation of `bytes` bytes (-1: unknown) for `label` that failed in `where`; `cause` (the
/// allocator's own text, first line) is appended when not empty.
OutOfMemory out_of_memory(const std::string& where, const std::string& label, std::int64_t bytes,
                          const std::string& cause = "");

/// `e` as OutOfMemory when it is an allocation failure (std::bad_alloc, Kokkos' "failed to allocate" runtime_error,
/// or already an OutOfMemory, whose message is kept), else nullopt.
std::optional<OutOfMemory> translate_allocation_failure(const std::exception& e, const std::string& where);

/// The message of the last OutOfMemory made by out_of_memory on this thread, and how many it made: a scope that
/// saw the count change can quote it (a launch's failure report).
const std::string& last_out_of_memory();
std::uint64_t out_of_memory_count();

/// `a * b`, or -1 when it does not fit in int64 (sizes for messages and checks).
inline std::int64_t checked_product(std::int64_t a, std::int64_t b) {
  if (a < 0 || b < 0) return -1;
  if (a != 0 && b > INT64_MAX / a) return -1;
  return a * b;
}

/// Host allocations of at least this many bytes are compared with what the rank has before Kokkos is asked.
inline constexpr std::int64_t precheck_bytes = std::int64_t{64} << 20;

/// Throws OutOfMemory when a host allocation of `bytes` (at least precheck_bytes) exceeds available_memory_bytes():
/// Linux grants such a request (overcommit) and then kills the process while Kokkos zero-fills it, so it is refused
/// first. Device memory spaces are not checked (their allocator fails cleanly).
template <class MemSpace>
void refuse_beyond_available(const std::string& where, const std::string& label, std::int64_t bytes) {
  if constexpr (std::is_same_v<MemSpace, Kokkos::HostSpace>) {
    if (bytes < precheck_bytes) return;
    const std::int64_t available = available_memory_bytes();
    if (available >= 0 && bytes > available)
      throw out_of_memory(where, label, bytes, "more than the rank has available: refused before asking for it");
  }
}

/// A View of ViewType with `label` and `extents` (one per dimension of ViewType), allocated as Kokkos does (zeroed).
/// An allocation that fails, or whose size does not fit in memory's address range, throws OutOfMemory naming `label`,
/// the exact bytes and what the rank had, prefixed by `where`.
template <class ViewType, class... Extents>
ViewType allocate_view_or_throw(const std::string& where, const std::string& label, Extents... extents) {
  std::int64_t bytes = static_cast<std::int64_t>(sizeof(typename ViewType::value_type));
  for (const std::int64_t n : {static_cast<std::int64_t>(extents)...}) bytes = checked_product(bytes, n);
  if (bytes < 0) throw out_of_memory(where, label, -1, "the size does not fit in 64 bits");
  refuse_beyond_available<typename ViewType::memory_space>(where, label, bytes);
  try {
    return ViewType(label, static_cast<std::size_t>(extents)...);
  } catch (const std::exception& e) {
    if (translate_allocation_failure(e, where)) throw out_of_memory(where, label, bytes, e.what());
    throw;
  }
}

}  // namespace detail
}  // namespace mlacp
