// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The NCCL backend's per-mesh state (CUDA builds with MLACP_HAVE_NCCL only).
#pragma once

#include <mlacp/config.hpp>

#if MLACP_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

namespace mlacp::detail {

/// The NCCL communicator of a mesh and the CUDA stream its collectives are enqueued on.
struct NcclContext {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  NcclContext() = default;
  NcclContext(const NcclContext&) = delete;
  NcclContext& operator=(const NcclContext&) = delete;
  ~NcclContext();
};

}  // namespace mlacp::detail

namespace mlacp::nccl {

/// Throws CommunicationError naming `what` when `result` is not ncclSuccess.
void check(ncclResult_t result, const std::string& what);
/// Throws CommunicationError naming `what` when `result` is not cudaSuccess.
void check_cuda(cudaError_t result, const std::string& what);

}  // namespace mlacp::nccl
#endif
