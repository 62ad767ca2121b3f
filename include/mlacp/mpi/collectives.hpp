// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MPI calls that start each collective (src/mpi/collectives.cpp). Counts are values per peer block; every
// function returns MPI's error code.
#pragma once

#include <mpi.h>

namespace mlacp::mpi {

/// MPI_Ialltoall: block j of `send` to rank j, block i of `recv` from rank i.
int start_all_to_all(const void* send, void* recv, int count, MPI_Datatype type, MPI_Comm comm, MPI_Request* request);

/// MPI_Iallgather: `send` to every rank, block i of `recv` from rank i.
int start_all_gather(const void* send, void* recv, int count, MPI_Datatype type, MPI_Comm comm, MPI_Request* request);

/// MPI_Ireduce_scatter_block with MPI_SUM: `recv` = the sum over ranks of their block `rank` of `send`.
int start_reduce_scatter_block(const void* send, void* recv, int count, MPI_Datatype type, MPI_Comm comm,
                               MPI_Request* request);

/// The exchange of a pairwise reduce-scatter: as start_all_to_all, but this rank's own block is neither sent nor
/// copied (MPI_Ialltoallv with a zero count to itself). Counts and displacements are in blocks (a contiguous type of
/// `count` values), so that only the per-block count has to fit an int. `counts` and `displacements` must hold
/// comm-size ints each and stay alive until the request completes (MPI may read them until then).
int start_exchange_blocks(const void* send, void* recv, int count, MPI_Datatype type, MPI_Comm comm, int* counts,
                          int* displacements, MPI_Request* request);

}  // namespace mlacp::mpi
