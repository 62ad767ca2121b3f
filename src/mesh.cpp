// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/diagnostics.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>

#include <cstdlib>
#include <string>
#include <utility>

#if MLACP_HAVE_NCCL
#include <mlacp/nccl/nccl_context.hpp>
#endif

namespace mlacp {
namespace detail {
#if !MLACP_HAVE_NCCL
struct NcclContext {};
#endif
}  // namespace detail

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
  int initialized = 0;
  MPI_Initialized(&initialized);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    throw UsageError(std::string("mlacp::Mesh: MPI is ") + (finalized ? "already finalized" : "not initialized") +
                     "; create meshes between MPI_Init and MPI_Finalize");
  if (comm == MPI_COMM_NULL) throw InvalidArgument("mlacp::Mesh: the communicator is MPI_COMM_NULL");
  int is_inter = 0;
  MPI_Comm_test_inter(comm, &is_inter);
  if (is_inter) throw InvalidArgument("mlacp::Mesh: an inter-communicator was given; expected an intra-communicator");
  if (ownership == Ownership::duplicate) {
    if (MPI_Comm_dup(comm, &comm_) != MPI_SUCCESS) throw CommunicationError("mlacp::Mesh: MPI_Comm_dup failed");
    owned_ = true;
    diagnostics::detail::count_communicator(+1);
  } else {
    comm_ = comm;
  }
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
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
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
    diagnostics::detail::count_communicator(-1);
  }
  comm_ = MPI_COMM_NULL;
  owned_ = false;
}

}  // namespace mlacp
