// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The Ulysses group: the ranks that exchange sequence shards for head shards.
#pragma once

#include <mpi.h>
#include <mlacp/build_config.hpp>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mlacp {

namespace nccl {
class Communicator;
}
namespace mpi {
class FailureChannel;
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

/// The ring size of a two-level mesh (issue 21): P = U x C ranks, C Ulysses groups of U ranks each and U rings of C
/// ranks each (one rank of every Ulysses group). `Ring(C)` (implicit from an int) makes the groups of consecutive ranks
/// (group g holds ranks g*U .. g*U + U-1); `Ring::node()` makes one group per node (the ranks that share memory, by
/// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), in rank order, whatever the placement), so C = the number of nodes.
/// The default, Ring(1), is today's flat Ulysses mesh.
struct Ring {
  Ring(int ring_size = 1)
      : size(ring_size) {}  // NOLINT(google-explicit-constructor): Mesh(comm, 2) reads as the ring size
  static Ring node() {
    Ring r;
    r.per_node = true;
    return r;
  }
  int size = 1;           ///< C, when !per_node
  bool per_node = false;  ///< one Ulysses group per node
  /// "ring = 2" or "ring = node", for messages.
  std::string describe() const;
};

namespace detail {
/// Who is where in a two-level mesh of P ranks: the pure grouping logic of Mesh(comm, ring), without MPI.
struct MeshGrouping {
  int ulysses_size = 0;          ///< U: ranks per Ulysses group
  int ring_size = 0;             ///< C: Ulysses groups (ranks per ring)
  std::vector<int> group_of;     ///< per rank: its Ulysses group, which is its rank in its ring
  std::vector<int> position_of;  ///< per rank: its rank in its Ulysses group, which is the ring it belongs to
  std::string error;             ///< not empty: the input is refused (then the vectors are empty)
};
/// Groups of consecutive ranks: rank r is in group r / U at position r % U. Refuses C <= 0 and C not dividing P.
MeshGrouping group_by_ring(int ranks, int ring);
/// One group per distinct value of `node_of_rank` (any id per rank, e.g. the lowest rank of its node), ordered by
/// their first rank; positions in rank order. Refuses nodes of different sizes, naming the sizes found.
MeshGrouping group_by_node(const std::vector<int>& node_of_rank);
}  // namespace detail

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
///
/// Failures: a rank that fails locally while collectives may be pending on the others (an allocation failure, a
/// CommunicationError, an exception of the attention core, the saved-tensor check) calls report_failure (the MLA layer
/// does so itself when its forward or backward throws after the agreement). The mesh is then broken: the other ranks
/// learn it through the mesh's failure channel (a second duplicate of the communicator with one small receive posted
/// per peer) within their current wait, or at their next agreement or launch, and raise CommunicationError naming the
/// failed rank and its message, instead of waiting forever. Every later call on a broken mesh raises at once. Handles
/// of a broken mesh that are abandoned (destroyed unwaited) do not block: their requests, and the buffers those use,
/// are parked for the life of the process (MPI cannot cancel a nonblocking collective), a small leak after a failure.
///
/// Threads: one host thread at a time may be inside mlacp on a communicator (all meshes on it, also meshes borrowing
/// the same one); a second thread entering the MLA layer's forward or backward, or launching a collective or a
/// send_recv on the communicator, meanwhile gets UsageError.
class Mesh {
 public:
  enum class Ownership { duplicate, borrow };

  explicit Mesh(MPI_Comm comm, Ownership ownership = Ownership::duplicate);
  /// A two-level mesh (see Ring): collective over `comm`. Every rank must pass the same ring (agreed with the mesh's
  /// settings, in the same allgather); a ring size that is not positive or does not divide P, or nodes of different
  /// sizes for Ring::node(), is the same InvalidArgument on every rank. With C > 1 the mesh owns two more meshes
  /// (ulysses_group() and ring_group(), each over its own communicator, freed with the mesh); with C = 1 it is
  /// exactly Mesh(comm, ownership) and creates nothing more. comm(), rank() and size() stay the whole mesh's.
  Mesh(MPI_Comm comm, Ring ring, Ownership ownership = Ownership::duplicate);
  ~Mesh();
  Mesh(Mesh&& other) noexcept;
  Mesh& operator=(Mesh&& other) noexcept;
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  MPI_Comm comm() const noexcept { return comm_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  bool owns_communicator() const noexcept { return owned_; }

  /// U, C and this rank's place in the two-level mesh (U = P, C = 1, ulysses_rank = rank, ring_rank = 0 when flat).
  int ulysses_size() const noexcept { return size_ / ring_size_; }
  int ring_size() const noexcept { return ring_size_; }
  int ulysses_rank() const noexcept { return ulysses_ ? ulysses_->rank() : rank_; }
  int ring_rank() const noexcept { return ring_ ? ring_->rank() : 0; }
  /// The Ulysses group of this rank (U ranks; the mesh itself when C = 1).
  const Mesh& ulysses_group() const noexcept { return ulysses_ ? *ulysses_ : *this; }
  /// The ring of this rank (C ranks, ordered by Ulysses group). Throws UsageError when C = 1 (no ring was created).
  const Mesh& ring_group() const;

  bool checked() const noexcept { return checked_; }
  /// Collective over the mesh: every rank must pass the same value (a rank without the agreement would run different
  /// collectives than the others); otherwise every rank throws InvalidArgument naming the ranks of each value, and
  /// nothing changes.
  void set_checked(bool checked);

  /// Finite check: when on (MLACP_CHECK_FINITE=1 in the environment, or set_check_finite), the MLA layer verifies
  /// that its inputs (x in forward, dy in backward) hold no NaN or Inf, on every rank, before any collective: one
  /// reduction over each input. Off by default.
  bool check_finite() const noexcept { return check_finite_; }
  void set_check_finite(bool on) noexcept {
    check_finite_ = on;
    for (Mesh* level : {ulysses_.get(), ring_.get()})
      if (level != nullptr) level->check_finite_ = on;
  }

  /// Host staging: when on, MPI collectives copy through host buffers even where MPI could read the View's memory
  /// directly (for MPI libraries whose GPU support is unreliable, and to test the staging path on any machine). Off by
  /// default; device memory without MLACP_ENABLE_GPU_AWARE_MPI is always staged.
  bool host_staging() const noexcept { return host_staging_; }
  void set_host_staging(bool on) noexcept {
    host_staging_ = on;
    for (Mesh* level : {ulysses_.get(), ring_.get()})
      if (level != nullptr) level->host_staging_ = on;
  }

  /// The reduce-scatter algorithm over MPI (default pairwise; MLACP_REDUCE_SCATTER=pairwise|mpi in the environment
  /// sets the default of new meshes). The setter is collective, as set_checked.
  ReduceScatterAlgorithm reduce_scatter_algorithm() const noexcept { return reduce_scatter_; }
  void set_reduce_scatter_algorithm(ReduceScatterAlgorithm algorithm);

  /// Whether the mesh's collectives move through shared memory: its ranks are all on one node (MPI_COMM_TYPE_SHARED)
  /// and the MPI library's shared-memory transport is not switched off (mpi::shared_memory_transport_enabled), found
  /// at construction. The copies are then this node's own cores' work, which OverlapPolicy does not poll beside
  /// compute (panelled_gemm.hpp).
  bool shared_memory() const noexcept { return shared_memory_; }

  /// Whether an NCCL communicator is attached to this mesh (mlacp::nccl::enable(mesh), CUDA builds with NCCL).
  bool has_nccl() const noexcept { return nccl_ != nullptr; }
  /// The attached NCCL communicator (nccl/communicator.hpp); nullptr without one.
  const std::shared_ptr<nccl::Communicator>& nccl() const noexcept { return nccl_; }
  /// Attaches an NCCL communicator built from this mesh (nccl::enable does both); collectives on Kokkos::Cuda
  /// instances over this mesh then go through NCCL. The mesh shares its ownership.
  void attach_nccl(std::shared_ptr<nccl::Communicator> communicator) noexcept { nccl_ = std::move(communicator); }

  /// Marks the mesh broken because this rank failed with `what`, and tells every other rank (see the class comment).
  /// Local and non-blocking; a no-op when the mesh is already broken. Never throws.
  void report_failure(const std::string& what) const noexcept;
  /// Whether the mesh is broken: this rank reported a failure, or a report of another rank has arrived (tested now,
  /// without blocking).
  bool broken() const noexcept;
  /// Throws CommunicationError "<where>: rank r failed: <what>; the mesh is broken ..." when broken().
  void throw_if_broken(const std::string& where) const;

 private:
  void release() noexcept;
  Mesh(MPI_Comm comm, Ownership ownership, std::int64_t ring_code);
  void agree_on_environment(std::int64_t ring_code);
  void build_levels(const Ring& ring);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  bool owned_ = false;
  bool checked_ = true;
  bool host_staging_ = false;
  bool check_finite_ = false;
  bool shared_memory_ = false;
  ReduceScatterAlgorithm reduce_scatter_ = ReduceScatterAlgorithm::pairwise;
  std::shared_ptr<nccl::Communicator> nccl_;
  std::unique_ptr<mpi::FailureChannel> failure_;
  int ring_size_ = 1;
  std::unique_ptr<Mesh> ulysses_;  // C > 1 only
  std::unique_ptr<Mesh> ring_;     // C > 1 only
};

namespace detail {
/// Held by the MLA layer's forward and backward and by every launch (launch_all_to_all, launch_all_gather,
/// launch_reduce_scatter, launch_send_recv): marks this thread as inside mlacp on the mesh's communicator. A
/// second thread entering while another holds it gets UsageError naming the communicator's rank; the same thread may
/// enter again (a core that launches collectives on the same mesh). One registry for the process, keyed by the
/// communicator, so that meshes borrowing one communicator share it.
class EntryGuard {
 public:
  EntryGuard(const Mesh& mesh, const std::string& where);
  ~EntryGuard();
  EntryGuard(const EntryGuard&) = delete;
  EntryGuard& operator=(const EntryGuard&) = delete;
  /// Leaves before destruction (the Python binding's context manager); idempotent.
  void release() noexcept;

 private:
  MPI_Comm comm_;
  bool held_ = true;
};
}  // namespace detail

}  // namespace mlacp
