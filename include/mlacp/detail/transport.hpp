// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The boundary between the generic collectives and their backends (mpi/, nccl/): what a collective asks a backend to
// move, and what the backend hands back. Nothing here calls MPI or NCCL.
#pragma once

#include <mlacp/detail/pending_transport.hpp>
#include <mlacp/view_types.hpp>
#include <mlacp/watchdog.hpp>

#include <Kokkos_Core.hpp>
#include <any>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mlacp::detail {

/// What moves: one peer block per rank, `count` values each, or the request's PeerBlocks (uneven collectives).
enum class Operation {
  all_to_all,          ///< block j of send to rank j; block i of recv from rank i
  all_gather,          ///< send (one block) to every rank; block i of recv from rank i
  reduce_scatter_sum,  ///< recv (one block) = the sum over ranks of their send block j = this rank
  exchange_blocks,     ///< as all_to_all, but this rank's own block is neither sent nor copied (pairwise sum)
  send_recv,  ///< point-to-point: all of send to rank `dest`, recv (up to its size) from rank `source`, with `tag`
};

/// The per-peer blocks of a buffer of an uneven (v) collective, in values: peer j's block is
/// [offsets[j], offsets[j] + counts[j]). Empty: the collective is even, every block `count` values at j * count.
/// Offsets ascend in peer order and the blocks do not overlap (send and receive buffers of the v collectives are
/// their blocks concatenated in rank order).
struct PeerBlocks {
  std::vector<std::size_t> counts;
  std::vector<std::size_t> offsets;
  bool empty() const noexcept { return counts.empty(); }
};

/// One collective, as handed to a backend.
template <class T, class MemSpace>
struct TransportRequest {
  Operation operation;
  Vector<T, MemSpace> send;
  Vector<T, MemSpace> recv;
  std::size_t count = 0;  ///< values per peer block (even collectives)
  CollectiveInfo info;    ///< what the watchdog reports about it (its name is the collective's)
  /// Uneven collectives: the blocks of `send` (all_to_all, exchange_blocks, reduce_scatter_sum: block j for rank j)
  /// and of `recv` (all_to_all, exchange_blocks, all_gather: block i from rank i). all_gather sends its whole `send`
  /// (recv_blocks.counts[rank] values); reduce_scatter_sum receives send_blocks.counts[rank] values. Both empty for
  /// an even collective.
  PeerBlocks send_blocks;
  PeerBlocks recv_blocks;
  bool uneven() const noexcept { return !send_blocks.empty() || !recv_blocks.empty(); }
  /// exchange_blocks, optional: called with a peer's rank once that peer's block has arrived in `recv`, on the thread
  /// that launched the collective (from the handle's test() and wait(), and from mlacp::progress() on that thread), so
  /// that the collective can consume the block while the others are in flight. A backend that cannot see blocks
  /// arrive one by one (NCCL, MPI through host staging, a single MPI_Ialltoallv) never calls it: the collective's
  /// finishing step then consumes every block.
  std::function<void(int)> block_arrived;
  /// send_recv only: the peers (ranks of the mesh) and the MPI tag (NCCL matches in launch order instead).
  int dest = -1;
  int source = -1;
  int tag = 0;
};

/// What a backend hands back for one started collective.
struct StartedTransport {
  /// Runs at wait(), once the transport completed and before the collective's own finishing step, in the order of
  /// the launch's execution-space instance (e.g. the copy back from host staging); may be empty.
  std::function<void()> arrived;
  /// What the backend itself allocated or uses and the transport needs until it completes (host staging buffers, the
  /// NCCL communicator): the handle keeps each alive (extend_lifetime).
  std::vector<std::any> resources;
  /// The operation in flight (never null). Declared last: destroyed (and so completed) before what it uses.
  std::unique_ptr<PendingTransport> transport;
};

}  // namespace mlacp::detail
