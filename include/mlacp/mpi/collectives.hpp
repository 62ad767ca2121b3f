// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MPI calls that start each collective (src/mpi/collectives.cpp). Counts are values per peer block; every
// function returns MPI's error code.
#pragma once

#include <mpi.h>
#include <mlacp/detail/transport.hpp>

#include <string>
#include <vector>

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

/// The point-to-point exchange of launch_send_recv: MPI_Irecv of up to `recv_count` values from `source` into
/// requests[1], then MPI_Isend of `send_count` values to `dest` into requests[0], both with `tag` on `comm`. On an
/// error neither request is left active (a posted receive is cancelled and freed).
int start_send_recv(const void* send, int send_count, int dest, void* recv, int recv_count, int source, int tag,
                    MPI_Datatype type, MPI_Comm comm, MPI_Request requests[2]);

/// One side of an uneven (v) collective in MPI's terms. MPI counts and displacements are ints: they are expressed in
/// units of a contiguous datatype of `unit` values, the greatest common divisor of every count and offset of the
/// blocks (a collective's blocks are whole slices of its partitioned dimension, so a count or offset in units is at
/// most the partition's total, which validate_collective bounds by INT_MAX).
struct BlocksInUnits {
  int unit = 1;
  std::vector<int> counts;
  std::vector<int> displacements;
};

/// `blocks` in units; throws InvalidArgument naming `what` when a unit, count or displacement exceeds INT_MAX (which
/// validation excludes before anything is sent).
BlocksInUnits in_units(const detail::PeerBlocks& blocks, const std::string& what);

/// MPI_Ialltoallv: block j of `send` (send_blocks) to rank j, block i of `recv` (recv_blocks) from rank i. The block
/// arrays must stay alive until the request completes (MPI may read them until then).
int start_all_to_all_v(const void* send, const BlocksInUnits& send_blocks, void* recv, const BlocksInUnits& recv_blocks,
                       MPI_Datatype type, MPI_Comm comm, MPI_Request* request);

/// The tag of the block messages of start_block_messages on a mesh's communicator: the largest MPI allows
/// (tag_upper_bound()), which launch_send_recv refuses, so that a user's exchange can never match them.
int block_message_tag() noexcept;

/// The exchange of a pairwise reduce-scatter as one message per peer, so that each block's arrival is seen on its own
/// (the reduce-scatter sums a block as soon as it and the blocks of the ranks before it have arrived): MPI_Irecv of
/// block i of `recv` (recv_blocks) from every rank i other than this one into recvs[i], then MPI_Isend of block j of
/// `send` (send_blocks) to every rank j other than this one into sends[j], starting with the next rank, all with
/// block_message_tag(). This rank's own entries are MPI_REQUEST_NULL; `sends` and `recvs` hold comm-size requests.
/// Messages between two ranks match in the order the ranks post them, which is the order of their launches (the same
/// on every rank, as for any collective). On an error no receive is left active (posted ones are cancelled and freed)
/// and posted sends are freed (they complete on their own).
int start_block_messages(const void* send, const BlocksInUnits& send_blocks, void* recv,
                         const BlocksInUnits& recv_blocks, MPI_Datatype type, MPI_Comm comm, MPI_Request* sends,
                         MPI_Request* recvs);

/// MPI_Iallgatherv: this rank's block (recv_blocks.counts[rank] units at `send`) to every rank, block i of `recv` from
/// rank i. `recv_blocks` must stay alive until the request completes.
int start_all_gather_v(const void* send, void* recv, const BlocksInUnits& recv_blocks, MPI_Datatype type, MPI_Comm comm,
                       MPI_Request* request);

/// MPI_Ireduce_scatter with MPI_SUM: `recv` = the sum over ranks of their block `rank` of `send`, whose blocks are
/// concatenated in rank order, rank i's `counts[i]` values (the reduction runs on the basic type: counts are values).
/// `counts` must stay alive until the request completes.
int start_reduce_scatter_v(const void* send, void* recv, const int* counts, MPI_Datatype type, MPI_Comm comm,
                           MPI_Request* request);

}  // namespace mlacp::mpi
