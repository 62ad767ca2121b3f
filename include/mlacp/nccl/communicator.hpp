// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The NCCL communicator of a mesh (CUDA builds with MLACP_HAVE_NCCL only): built from a Mesh, attached to it with
// nccl::enable(mesh), used by nccl/transport.hpp for collectives on Kokkos::Cuda instances.
#pragma once

#include <mpi.h>
#include <mlacp/build_config.hpp>

#if MLACP_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>
#include <string>

namespace mlacp {
class Mesh;
}

namespace mlacp::nccl {

/// Throws CommunicationError naming `what` when `result` is not ncclSuccess.
void check(ncclResult_t result, const std::string& what);
/// Throws CommunicationError naming `what` when `result` is not cudaSuccess.
void check_cuda(cudaError_t result, const std::string& what);

/// The steps of creating a communicator, each returning an error text ("" on success). CreationSteps::cuda() are the
/// real ones (NCCL and the CUDA runtime); tests replace them to exercise the agreement without a GPU.
struct CreationSteps {
  std::function<std::string(ncclUniqueId& id)> unique_id;  ///< called on rank 0 only
  std::function<std::string(cudaStream_t& stream)> create_stream;
  std::function<std::string(ncclComm_t& comm, int nranks, const ncclUniqueId& id, int rank)> init_rank;
  std::function<void(ncclComm_t comm)> destroy_communicator;
  std::function<void(cudaStream_t stream)> destroy_stream;
  /// ncclCommAbort: after a failure inside a group (Communicator::abort). Frees the communicator (no destroy after).
  std::function<void(ncclComm_t comm)> abort_communicator;

  static CreationSteps cuda();
};

/// An NCCL communicator over the ranks of a mesh and the non-blocking CUDA stream its collectives are enqueued on.
/// Creation is collective over the mesh and agreed: rank 0's ncclGetUniqueId and every rank's stream creation are
/// agreed on (one allreduce) before anybody enters the broadcast of the id or ncclCommInitRank, and the
/// initialisation is agreed on after it, so that a failure on one rank raises CommunicationError, naming the rank, on
/// every rank instead of leaving the others in a broadcast. (A rank that fails inside ncclCommInitRank after its
/// peers entered it is NCCL's to report; the agreement after it reports it on every rank that returns.)
class Communicator {
 public:
  explicit Communicator(const Mesh& mesh, CreationSteps steps = CreationSteps::cuda());
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  ncclComm_t comm() const noexcept { return comm_; }
  cudaStream_t stream() const noexcept { return stream_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// The mesh's MPI communicator, which the watchdog aborts.
  MPI_Comm mpi_comm() const noexcept { return mpi_comm_; }

  /// Aborts the NCCL communicator (ncclCommAbort) after `why` left it in a state no peer can match (a call failed
  /// inside a group, after others were posted) and marks it unusable: later launches raise CommunicationError.
  void abort(const std::string& why) noexcept;
  /// Whether abort() was called.
  bool aborted() const noexcept { return aborted_; }
  /// Throws CommunicationError naming `where` and the reason of the abort when the communicator was aborted.
  void require_usable(const std::string& where) const;

 private:
  void release() noexcept;

  CreationSteps steps_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  MPI_Comm mpi_comm_ = MPI_COMM_NULL;
  bool aborted_ = false;
  std::string aborted_because_;
};

/// Collective over `mesh`: creates its NCCL communicator on the current CUDA device and attaches it, so that the
/// collectives on Kokkos::Cuda instances over this mesh go through NCCL. (This was Mesh::enable_nccl.)
void enable(Mesh& mesh);

}  // namespace mlacp::nccl
#endif
