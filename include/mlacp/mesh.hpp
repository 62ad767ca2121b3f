// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The Ulysses group: the ranks that exchange sequence shards for head shards.
#pragma once

#include <mpi.h>
#include <mlacp/config.hpp>

#include <memory>
#include <utility>

namespace mlacp {

namespace nccl {
class Communicator;
}

/// How launch_reduce_scatter moves data over MPI (NCCL always uses ncclReduceScatter).
enum class ReduceScatterAlgorithm {
  /// MPI_Ialltoallv of the blocks (block j to rank j; a rank's own block is not copied), then each rank sums the P
  /// blocks, in rank order, at wait(). Every rank sends and receives (P-1)/P of the buffer once, at the same time, and
  /// no reduction runs inside MPI's progress (that is, inside the overlapped compute). The default: Open MPI's
  /// nonblocking
  /// reduce-scatter (coll/libnbc) reduces the whole buffer onto rank 0 and scatters it from there.
  pairwise,
  /// MPI_Ireduce_scatter_block: the MPI library's own algorithm.
  mpi,
};

/// A Ulysses (context-parallel) group over an MPI communicator. Move-only.
///
/// By default the communicator is duplicated and the duplicate is owned (freed by the destructor), so that mlacp's
/// traffic can never match a user's messages; `Ownership::borrow` uses the caller's communicator as it is.
///
/// Checked mode (on unless the environment sets MLACP_CHECKED=0; switch with set_checked) makes every collective
/// verify, with one small MPI_Allreduce before anything is sent, that all ranks passed the same shape and operation,
/// and turns any rank's invalid argument into the same exception on every rank instead of a hang.
///
/// Construction is collective over `comm` (also when borrowing it): the settings that decide which collectives run
/// (the reduce-scatter algorithm and checked mode, from the environment) are agreed on by every rank with one small
/// allgather, and a rank whose value differs makes every rank throw InvalidArgument naming the setting and the ranks.
class Mesh {
 public:
  enum class Ownership { duplicate, borrow };

  explicit Mesh(MPI_Comm comm, Ownership ownership = Ownership::duplicate);
  ~Mesh();
  Mesh(Mesh&& other) noexcept;
  Mesh& operator=(Mesh&& other) noexcept;
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  MPI_Comm comm() const noexcept { return comm_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  bool owns_communicator() const noexcept { return owned_; }

  bool checked() const noexcept { return checked_; }
  /// Collective over the mesh: every rank must pass the same value (a rank without the agreement would run different
  /// collectives than the others); otherwise every rank throws InvalidArgument naming the ranks of each value, and
  /// nothing changes.
  void set_checked(bool checked);

  /// Finite check: when on (MLACP_CHECK_FINITE=1 in the environment, or set_check_finite), the MLA layer verifies
  /// that its inputs (x in forward, dy in backward) hold no NaN or Inf, on every rank, before any collective: one
  /// reduction over each input. Off by default.
  bool check_finite() const noexcept { return check_finite_; }
  void set_check_finite(bool on) noexcept { check_finite_ = on; }

  /// Host staging: when on, MPI collectives copy through host buffers even where MPI could read the View's memory
  /// directly (for MPI libraries whose GPU support is unreliable, and to test the staging path on any machine). Off by
  /// default; device memory without MLACP_ENABLE_GPU_AWARE_MPI is always staged.
  bool host_staging() const noexcept { return host_staging_; }
  void set_host_staging(bool on) noexcept { host_staging_ = on; }

  /// The reduce-scatter algorithm over MPI (default pairwise; MLACP_REDUCE_SCATTER=pairwise|mpi in the environment
  /// sets the default of new meshes). The setter is collective, as set_checked.
  ReduceScatterAlgorithm reduce_scatter_algorithm() const noexcept { return reduce_scatter_; }
  void set_reduce_scatter_algorithm(ReduceScatterAlgorithm algorithm);

  /// Whether an NCCL communicator is attached to this mesh (mlacp::nccl::enable(mesh), CUDA builds with NCCL).
  bool has_nccl() const noexcept { return nccl_ != nullptr; }
  /// The attached NCCL communicator (nccl/communicator.hpp); nullptr without one.
  const std::shared_ptr<nccl::Communicator>& nccl() const noexcept { return nccl_; }
  /// Attaches an NCCL communicator built from this mesh (nccl::enable does both); collectives on Kokkos::Cuda
  /// instances over this mesh then go through NCCL. The mesh shares its ownership.
  void attach_nccl(std::shared_ptr<nccl::Communicator> communicator) noexcept { nccl_ = std::move(communicator); }

 private:
  void release() noexcept;
  void agree_on_environment();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  bool owned_ = false;
  bool checked_ = true;
  bool host_staging_ = false;
  bool check_finite_ = false;
  ReduceScatterAlgorithm reduce_scatter_ = ReduceScatterAlgorithm::pairwise;
  std::shared_ptr<nccl::Communicator> nccl_;
};

}  // namespace mlacp
