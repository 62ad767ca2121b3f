// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The NCCL communicator of a mesh. Compiled only when MLACP_HAVE_NCCL.
#include <mlacp/detail/collective_validation.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mpi/agreement.hpp>
#include <mlacp/nccl/communicator.hpp>

#include <memory>
#include <utility>

namespace mlacp::nccl {

void check(ncclResult_t result, const std::string& what) {
  if (result != ncclSuccess) throw CommunicationError("mlacp: " + what + " failed: " + ncclGetErrorString(result));
}

void check_cuda(cudaError_t result, const std::string& what) {
  if (result != cudaSuccess) throw CommunicationError("mlacp: " + what + " failed: " + cudaGetErrorString(result));
}

CreationSteps CreationSteps::cuda() {
  CreationSteps steps;
  steps.unique_id = [](ncclUniqueId& id) -> std::string {
    const ncclResult_t result = ncclGetUniqueId(&id);
    return result == ncclSuccess ? "" : std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(result);
  };
  steps.create_stream = [](cudaStream_t& stream) -> std::string {
    const cudaError_t result = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (result != cudaSuccess) stream = nullptr;  // nothing to destroy
    return result == cudaSuccess ? "" : std::string("cudaStreamCreateWithFlags failed: ") + cudaGetErrorString(result);
  };
  steps.init_rank = [](ncclComm_t& comm, int nranks, const ncclUniqueId& id, int rank) -> std::string {
    const ncclResult_t result = ncclCommInitRank(&comm, nranks, id, rank);
    if (result != ncclSuccess) comm = nullptr;  // nothing to destroy
    return result == ncclSuccess ? "" : std::string("ncclCommInitRank failed: ") + ncclGetErrorString(result);
  };
  steps.destroy_communicator = [](ncclComm_t comm) { ncclCommDestroy(comm); };
  steps.destroy_stream = [](cudaStream_t stream) { cudaStreamDestroy(stream); };
  steps.abort_communicator = [](ncclComm_t comm) { ncclCommAbort(comm); };
  return steps;
}

Communicator::Communicator(const Mesh& mesh, CreationSteps steps)
    : steps_(std::move(steps)), rank_(mesh.rank()), size_(mesh.size()), mpi_comm_(mesh.comm()) {
  const std::string where = "mlacp::nccl::Communicator";
  try {
    ncclUniqueId id{};
    std::string error;
    if (rank_ == 0) error = steps_.unique_id(id);
    if (error.empty()) error = steps_.create_stream(stream_);
    // Nobody enters the broadcast or ncclCommInitRank unless every rank got this far.
    detail::agree_on_success(mesh, where, error.empty() ? "" : where + ": " + error);
    CollectiveInfo info;
    info.name = where + " (NCCL unique id)";
    info.operation = "MPI_Ibcast of the NCCL unique id from rank 0";
    info.bytes = static_cast<std::int64_t>(sizeof(id));
    if (size_ > 1) mpi::broadcast(mpi_comm_, &id, sizeof(id), 0, info, where + ": MPI_Ibcast of the NCCL unique id");
    error = steps_.init_rank(comm_, size_, id, rank_);
    detail::agree_on_success(mesh, where, error.empty() ? "" : where + ": " + error);
  } catch (...) {
    release();
    throw;
  }
}

Communicator::~Communicator() { release(); }

void Communicator::release() noexcept {
  if (comm_ && steps_.destroy_communicator) steps_.destroy_communicator(comm_);
  if (stream_ && steps_.destroy_stream) steps_.destroy_stream(stream_);
  comm_ = nullptr;
  stream_ = nullptr;
}

void Communicator::abort(const std::string& why) noexcept {
  if (aborted_) return;
  aborted_ = true;
  try {
    aborted_because_ = why.empty() ? std::string("an error") : why;
  } catch (...) {
    // keep the flag even without the text
  }
  if (comm_ && steps_.abort_communicator) steps_.abort_communicator(comm_);
  comm_ = nullptr;  // ncclCommAbort freed it: release() must not destroy it again
}

void Communicator::require_usable(const std::string& where) const {
  if (aborted())
    throw CommunicationError("mlacp: " + where + ": the NCCL communicator was aborted after " + aborted_because_ +
                             "; it cannot be used again");
}

void enable(Mesh& mesh) {
  if (mesh.has_nccl()) return;
  mesh.attach_nccl(std::make_shared<Communicator>(mesh));
}

}  // namespace mlacp::nccl
