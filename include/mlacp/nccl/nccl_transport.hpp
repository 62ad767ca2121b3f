// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The NCCL backend: the same collectives, enqueued on the mesh's communication stream (CUDA builds only).
//
// Ordering without host blocking: launch records an event on the compute stream and makes the communication stream
// wait on it (so NCCL reads the send buffer after the pack kernel), enqueues the collective, and records a completion
// event on the communication stream. wait() makes the compute stream wait on that event; the host never blocks, and
// test() only queries the event (no host polling is needed for progress: NCCL runs on the GPU).
#pragma once

#include <mlacp/config.hpp>

#if MLACP_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#include <mlacp/detail/pending_transport.hpp>
#include <mlacp/nccl/nccl_context.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace mlacp::nccl {

enum class Operation { all_to_all, all_gather, reduce_scatter_sum };

template <class T>
ncclDataType_t datatype() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "mlacp communicates float and double only");
  if constexpr (std::is_same_v<T, float>) {
    return ncclFloat32;
  } else {
    return ncclFloat64;
  }
}

/// True when this NCCL has ncclAlltoAll (2.28 and later); before, the all-to-all is grouped ncclSend/ncclRecv.
constexpr bool has_native_all_to_all() {
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
  return true;
#else
  return false;
#endif
}

/// One peer's part of an all-to-all as grouped point-to-point calls: `count` elements sent from
/// send + send_offset to `peer` and received from it into recv + recv_offset.
struct PeerTransfer {
  int peer;
  std::size_t send_offset;
  std::size_t recv_offset;
  std::size_t count;
};

/// The grouped send/recv plan of an all-to-all of `count_per_peer` elements per peer on rank `rank` of `nranks`:
/// block j of the send buffer goes to rank j, block i of the receive buffer comes from rank i. Starts with the
/// rank's own block and walks the ring, so that peers pair up in the same order on every rank.
std::vector<PeerTransfer> all_to_all_plan(int rank, int nranks, std::size_t count_per_peer);

/// Enqueues `operation` (count = elements per peer block) and returns its transport. `compute_stream` is the stream
/// of the execution-space instance the operands were produced on, and on which the result will be consumed.
std::unique_ptr<detail::PendingTransport> launch(Operation operation, const void* send, void* recv, std::size_t count,
                                                 ncclDataType_t type, std::size_t type_size,
                                                 detail::NcclContext& context, cudaStream_t compute_stream,
                                                 const std::string& name);

}  // namespace mlacp::nccl
#endif
