// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MPI backend's transport: one nonblocking-collective request.
#pragma once

#include <mpi.h>
#include <mlacp/detail/pending_transport.hpp>
#include <mlacp/watchdog.hpp>

#include <memory>
#include <string>

namespace mlacp::mpi {

/// Owns an MPI request from MPI_Ialltoall / MPI_Iallgather / MPI_Ireduce_scatter_block on `comm`. test() calls
/// MPI_Test (which also progresses Open MPI's engine); wait() calls MPI_Wait and throws CommunicationError on
/// failure. With a wait timeout set (watchdog.hpp), waits poll instead, and past the timeout print the watchdog report
/// on stderr and MPI_Abort the communicator.
std::unique_ptr<detail::PendingTransport> make_request_transport(MPI_Request request, MPI_Comm comm,
                                                                 CollectiveInfo info);

/// Completes `request` on `comm`: MPI_Wait, or with a wait timeout set (watchdog.hpp) a polling wait that, past the
/// timeout, prints the watchdog report for `info` on stderr and aborts the communicator. Returns MPI's error code.
int wait_watched(MPI_Request* request, MPI_Comm comm, const CollectiveInfo& info) noexcept;

/// MPI_Abort on `comm` (the watchdog's end): never returns.
[[noreturn]] void abort_communicator(MPI_Comm comm) noexcept;

/// Throws CommunicationError naming `what` and MPI's error string when `code` is not MPI_SUCCESS.
void check_mpi(int code, const std::string& what);

}  // namespace mlacp::mpi
