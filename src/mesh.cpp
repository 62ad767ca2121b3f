// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/diagnostics.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mpi/communicator.hpp>

#include <cstdlib>
#include <string>
#include <utility>

namespace mlacp {

namespace {
bool checked_by_default() {
  const char* value = std::getenv("MLACP_CHECKED");
  return value == nullptr || std::string(value) != "0";
}
bool check_finite_by_default() {
  const char* value = std::getenv("MLACP_CHECK_FINITE");
  return value != nullptr && std::string(value) != "0";
}
ReduceScatterAlgorithm reduce_scatter_by_default() {
  const char* value = std::getenv("MLACP_REDUCE_SCATTER");
  if (value == nullptr || std::string(value) == "pairwise") return ReduceScatterAlgorithm::pairwise;
  if (std::string(value) == "mpi") return ReduceScatterAlgorithm::mpi;
  throw InvalidArgument(std::string("mlacp::Mesh: MLACP_REDUCE_SCATTER='") + value + "'; expected 'pairwise' or 'mpi'");
}
}  // namespace

Mesh::Mesh(MPI_Comm comm, Ownership ownership)
    : checked_(checked_by_default()),
      check_finite_(check_finite_by_default()),
      reduce_scatter_(reduce_scatter_by_default()) {
  const bool finalized = mpi::finalized();
  if (!mpi::initialized() || finalized)
    throw UsageError(std::string("mlacp::Mesh: MPI is ") + (finalized ? "already finalized" : "not initialized") +
                     "; create meshes between MPI_Init and MPI_Finalize");
  if (comm == MPI_COMM_NULL) throw InvalidArgument("mlacp::Mesh: the communicator is MPI_COMM_NULL");
  if (mpi::is_intercommunicator(comm))
    throw InvalidArgument("mlacp::Mesh: an inter-communicator was given; expected an intra-communicator");
  if (ownership == Ownership::duplicate) {
    comm_ = mpi::duplicate(comm);
    owned_ = true;
    diagnostics::detail::count_communicator(+1);
  } else {
    comm_ = comm;
  }
  rank_ = mpi::rank(comm_);
  size_ = mpi::size(comm_);
}

Mesh::~Mesh() { release(); }

Mesh::Mesh(Mesh&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      rank_(other.rank_),
      size_(other.size_),
      owned_(std::exchange(other.owned_, false)),
      checked_(other.checked_),
      host_staging_(other.host_staging_),
      check_finite_(other.check_finite_),
      reduce_scatter_(other.reduce_scatter_),
      nccl_(std::move(other.nccl_)) {}

Mesh& Mesh::operator=(Mesh&& other) noexcept {
  if (this != &other) {
    release();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    rank_ = other.rank_;
    size_ = other.size_;
    owned_ = std::exchange(other.owned_, false);
    checked_ = other.checked_;
    host_staging_ = other.host_staging_;
    check_finite_ = other.check_finite_;
    reduce_scatter_ = other.reduce_scatter_;
    nccl_ = std::move(other.nccl_);
  }
  return *this;
}

void Mesh::release() noexcept {
  nccl_.reset();
  if (owned_ && comm_ != MPI_COMM_NULL) {
    mpi::free_communicator(comm_);
    diagnostics::detail::count_communicator(-1);
  }
  comm_ = MPI_COMM_NULL;
  owned_ = false;
}

}  // namespace mlacp
