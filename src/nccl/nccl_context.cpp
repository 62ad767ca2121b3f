// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Mesh::enable_nccl and the NCCL context's lifetime. Compiled only when MLACP_HAVE_NCCL.
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mpi/request_transport.hpp>
#include <mlacp/nccl/nccl_context.hpp>

namespace mlacp {
namespace nccl {

void check(ncclResult_t result, const std::string& what) {
  if (result != ncclSuccess) throw CommunicationError("mlacp: " + what + " failed: " + ncclGetErrorString(result));
}

void check_cuda(cudaError_t result, const std::string& what) {
  if (result != cudaSuccess) throw CommunicationError("mlacp: " + what + " failed: " + cudaGetErrorString(result));
}

}  // namespace nccl

namespace detail {
NcclContext::~NcclContext() {
  if (comm) ncclCommDestroy(comm);
  if (stream) cudaStreamDestroy(stream);
}
}  // namespace detail

void Mesh::enable_nccl() {
  if (nccl_) return;
  ncclUniqueId id{};
  if (rank_ == 0) nccl::check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  mpi::check_mpi(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm_), "MPI_Bcast of the NCCL unique id");
  auto context = std::make_unique<detail::NcclContext>();
  nccl::check_cuda(cudaStreamCreateWithFlags(&context->stream, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags for the NCCL stream");
  nccl::check(ncclCommInitRank(&context->comm, size_, id, rank_), "ncclCommInitRank");
  nccl_ = std::move(context);
}

}  // namespace mlacp
