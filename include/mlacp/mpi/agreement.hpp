// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MPI collectives behind the agreements of checked mode and of the mesh's settings (src/mpi/agreement.cpp).
// Each is nonblocking and completed under the watchdog, so that a rank that never arrives is reported instead of
// hanging the others; each throws CommunicationError naming `what` when MPI fails.
#pragma once

#include <mpi.h>
#include <mlacp/watchdog.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mlacp::mpi {

/// Element-wise maximum of `values` over the ranks of `comm`, in place.
void allreduce_max(MPI_Comm comm, std::vector<std::int64_t>& values, const CollectiveInfo& info,
                   const std::string& what);

/// Element-wise maximum of `values` over the ranks of `comm`, in place (doubles: times, byte counts).
void allreduce_max(MPI_Comm comm, std::vector<double>& values, const CollectiveInfo& info, const std::string& what);

/// `bytes` bytes at `data` from rank `root` to every rank of `comm`.
void broadcast(MPI_Comm comm, void* data, int bytes, int root, const CollectiveInfo& info, const std::string& what);

/// Every rank's `mine` (the same length on every rank), concatenated in rank order.
std::vector<std::int64_t> allgather(MPI_Comm comm, const std::vector<std::int64_t>& mine, const CollectiveInfo& info,
                                    const std::string& what);

/// allgather of a few integers per rank (settings, shapes), watched and recorded as the collective `name`, `where`
/// naming the call it serves in messages; `mine` itself on a communicator of one rank (no collective).
std::vector<std::int64_t> gather_integers(MPI_Comm comm, const std::vector<std::int64_t>& mine, const std::string& name,
                                          const std::string& where);

}  // namespace mlacp::mpi
