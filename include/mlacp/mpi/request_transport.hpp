// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MPI backend's transport: one nonblocking-collective request.
#pragma once

#include <mpi.h>
#include <mlacp/detail/pending_transport.hpp>

#include <memory>
#include <string>

namespace mlacp::mpi {

/// Owns an MPI request from MPI_Ialltoall / MPI_Iallgather / MPI_Ireduce_scatter_block. test() calls MPI_Test
/// (which also progresses Open MPI's engine); wait() calls MPI_Wait and throws CommunicationError on failure.
std::unique_ptr<detail::PendingTransport> make_request_transport(MPI_Request request, std::string name);

/// Throws CommunicationError naming `what` and MPI's error string when `code` is not MPI_SUCCESS.
void check_mpi(int code, const std::string& what);

}  // namespace mlacp::mpi
