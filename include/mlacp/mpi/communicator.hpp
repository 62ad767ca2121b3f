// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MPI calls behind a Mesh and the library's configuration report (src/mpi/communicator.cpp).
#pragma once

#include <mpi.h>

#include <string>

namespace mlacp::mpi {

/// Whether MPI_Init has run, and whether MPI_Finalize has.
bool initialized() noexcept;
bool finalized() noexcept;

/// Whether `comm` is an inter-communicator.
bool is_intercommunicator(MPI_Comm comm);

/// MPI_Comm_dup; throws CommunicationError on failure.
MPI_Comm duplicate(MPI_Comm comm);

/// MPI_Comm_free, unless MPI is already finalized (then there is nothing left to free); sets `comm` to
/// MPI_COMM_NULL.
void free_communicator(MPI_Comm& comm) noexcept;

int rank(MPI_Comm comm);
int size(MPI_Comm comm);

/// The first line of MPI_Get_library_version.
std::string library_version();

}  // namespace mlacp::mpi
