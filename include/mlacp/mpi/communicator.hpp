// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The MPI calls behind a Mesh and the library's configuration report (src/mpi/communicator.cpp).
#pragma once

#include <mpi.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mlacp::mpi {

/// Whether MPI_Init has run, and whether MPI_Finalize has.
bool initialized() noexcept;
bool finalized() noexcept;

/// The largest tag MPI allows (MPI_TAG_UB, at least 32767).
int tag_upper_bound() noexcept;

/// Whether `comm` is an inter-communicator.
bool is_intercommunicator(MPI_Comm comm);

/// MPI_Comm_dup; throws CommunicationError on failure.
MPI_Comm duplicate(MPI_Comm comm);

/// MPI_Comm_free, unless MPI is already finalized (then there is nothing left to free); sets `comm` to
/// MPI_COMM_NULL.
void free_communicator(MPI_Comm& comm) noexcept;

int rank(MPI_Comm comm);
int size(MPI_Comm comm);

/// MPI_Comm_split (collective over `comm`): the ranks of equal `color`, ordered by `key`. Throws CommunicationError.
MPI_Comm split(MPI_Comm comm, int color, int key);

/// The rank in `comm` of the lowest rank of `comm` on this rank's node (the ranks that MPI_Comm_split_type
/// (MPI_COMM_TYPE_SHARED) puts together): an id of the node. Collective over `comm`; throws CommunicationError.
int node_leader(MPI_Comm comm);

/// Whether the MPI library moves bytes between ranks of one node through shared memory, as it does by default: false
/// only where Open MPI's BTL selection (its MPI_T control variable "btl", e.g. OMPI_MCA_btl=tcp,self) leaves out its
/// shared-memory BTL (vader; sm in 5.x) and its UCX PML, which has its own, is not selected. Read once per process.
bool shared_memory_transport_enabled();

/// Whether every rank of `comm` is on this rank's node (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) keeps them all
/// together); the same answer on every rank. Collective over `comm`; throws CommunicationError.
bool all_on_one_node(MPI_Comm comm);

/// The first line of MPI_Get_library_version.
std::string library_version();

/// A mesh's failure channel: how a rank that failed locally while collectives may be pending tells the others.
///
/// Construction is collective over `comm` (the mesh's communicator) when it has more than one rank: the channel
/// duplicates it (so that its messages never match anything else) and posts one MPI_Irecv per peer of a fixed-size
/// message (the failing rank's error text). report() marks the channel broken and sends the text to every peer, once;
/// poll() tests the posted receives and marks the channel broken when a peer's report arrived. The channel registers
/// itself under `comm` (channels_failed() and throw_if_failed() look it up there), so that every wait on `comm` sees
/// it, also of a second mesh borrowing the same communicator. The destructor cancels and completes the posted
/// receives and frees the duplicate (nothing after MPI_Finalize). Thread-safe.
class FailureChannel {
 public:
  static constexpr int message_bytes = 1024;

  explicit FailureChannel(MPI_Comm comm);
  ~FailureChannel();
  FailureChannel(const FailureChannel&) = delete;
  FailureChannel& operator=(const FailureChannel&) = delete;

  /// Marks the channel broken with `what` as this rank's failure and sends it to every peer; a no-op when it is
  /// already broken (a rank that learnt of a peer's failure does not echo it).
  void report(const std::string& what) noexcept;
  /// Tests the posted receives (without blocking); true when the channel is broken.
  bool poll() noexcept;
  bool broken() const noexcept { return broken_.load(); }
  /// "rank r failed: <what>" of the first failure seen (empty while not broken).
  std::string failure() const;
  /// How the messages name the channel's ranks: labels[i] for rank i (a sub-mesh of a two-level mesh names its
  /// members by their rank in the whole mesh); empty, as by default: their ranks in the channel's communicator.
  void set_rank_labels(std::vector<int> labels);

 private:
  void mark_broken(const std::string& text);

  MPI_Comm key_ = MPI_COMM_NULL;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<MPI_Request> receives_;  // one per peer (MPI_REQUEST_NULL at this rank's own index)
  std::vector<std::array<char, message_bytes>> inbox_;
  mutable std::mutex mutex_;
  std::atomic<bool> broken_{false};
  std::string failure_;
  std::vector<int> labels_;
  std::string label(int rank) const;
};

/// Polls every failure channel registered under `comm`; true (and the failure in `failure` when given) when one of
/// them is broken. Never throws.
bool channels_failed(MPI_Comm comm, std::string* failure = nullptr) noexcept;

/// The CommunicationError message of a broken mesh: "<where>: rank r failed: <what>; the mesh is broken ...".
std::string broken_mesh_message(const std::string& where, const std::string& failure);

/// Throws CommunicationError (broken_mesh_message) when a failure channel of `comm` is broken.
void throw_if_failed(MPI_Comm comm, const std::string& where);

/// Keeps `request` (an active request of a broken communicator: MPI forbids cancelling or freeing a nonblocking
/// collective, and it may never complete) and `keep_alive` (the memory it reads or writes) for the life of the process,
/// instead of waiting for it. A stated, small leak that happens only on a failure.
void park(MPI_Request request, std::shared_ptr<void> keep_alive) noexcept;
/// Requests parked so far (for tests and reports).
std::size_t parked_requests() noexcept;

}  // namespace mlacp::mpi
