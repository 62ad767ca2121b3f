// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Process-wide count of the bytes this process handed to collective transports: what a run puts on the wire, for
// tests, the tools' JSON and monitoring (e.g. that MlaConfig::wire_dtype = bf16 halves it).
#pragma once

#include <cstdint>

namespace mlacp {

/// Bytes of the send buffers handed to the transport by launch_all_to_all, launch_all_gather and
/// launch_reduce_scatter, and by launch_send_recv (this rank's own block included: the size of the buffer the transport
/// reads, in the collective's value type, so that a bf16 collective counts 2 bytes per element and a float one 4), by
/// operation. Counted when a collective is handed to its backend (MPI or NCCL); a collective with nothing to send (P ==
/// 1: the input is the result) counts nothing, and neither do the mesh's own agreements (checked mode).
struct CollectiveBytes {
  std::uint64_t all_to_all = 0;
  std::uint64_t all_gather = 0;
  std::uint64_t reduce_scatter = 0;  ///< both algorithms (pairwise exchange and MPI's own)
  std::uint64_t send_recv = 0;       ///< launch_send_recv: the bytes this rank sends (its `send` View)

  std::uint64_t total() const noexcept { return all_to_all + all_gather + reduce_scatter + send_recv; }
};

/// The bytes counted since the process started or since the last reset_collective_bytes(). Thread-safe (relaxed
/// atomic counters).
CollectiveBytes collective_bytes() noexcept;
/// Restarts the count at zero.
void reset_collective_bytes() noexcept;

namespace detail {
/// Which counter a launch adds to (launch.hpp's start()).
enum class CountedCollective { all_to_all, all_gather, reduce_scatter, send_recv };
void count_collective_bytes(CountedCollective kind, std::uint64_t bytes) noexcept;
}  // namespace detail

}  // namespace mlacp
