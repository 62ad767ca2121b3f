// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The NCCL backend: the same collectives, enqueued on the stream of the mesh's NCCL communicator (CUDA builds with
// MLACP_HAVE_NCCL only; elsewhere this header declares nothing).
//
// Ordering without host blocking: launch records an event on the compute stream and makes the communication stream
// wait on it (so NCCL reads the send buffer after the pack kernel), enqueues the collective, and records a completion
// event on the communication stream. wait() makes the compute stream wait on that event; test() queries it (NCCL
// runs on the GPU: no host polling is needed for progress). Failures: test() and wait() report the communicator's
// asynchronous error (ncclCommGetAsyncError); with the watchdog on (wait_timeout() > 0) wait() polls the event and
// that error on the host, and past the timeout reports the collective and aborts, as the MPI backend does. A failure
// another rank reported on the mesh (Mesh::report_failure) ends a wait with CommunicationError: the wait looks at the
// mesh's failure channel (on its MPI communicator) as the MPI backend's does, and a handle abandoned on the broken
// mesh is parked instead of waited.
#pragma once

#include <mlacp/build_config.hpp>

#if MLACP_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#include <mlacp/compat.hpp>
#include <mlacp/detail/block_layout.hpp>
#include <mlacp/detail/buffer_pool.hpp>
#include <mlacp/detail/pending_transport.hpp>
#include <mlacp/detail/transport.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mpi/transport.hpp>
#include <mlacp/nccl/communicator.hpp>
#include <mlacp/watchdog.hpp>

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace mlacp::nccl {

template <class T>
ncclDataType_t datatype() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16> ||
                    std::is_same_v<T, std::uint8_t>,
                "mlacp communicates float, double, bf16 and bytes only");
  if constexpr (std::is_same_v<T, float>) {
    return ncclFloat32;
  } else if constexpr (std::is_same_v<T, double>) {
    return ncclFloat64;
  } else if constexpr (std::is_same_v<T, std::uint8_t>) {
    return ncclUint8;  // a wire codec's encoded bytes: moved, never reduced
  } else {
    return ncclBfloat16;  // moved as is; its sums are taken in float (Transport::start)
  }
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
/// rank's own block and walks the ring, so that peers pair up in the same order on every rank. With
/// `include_self` false the own block is left out (the exchange of a pairwise reduce-scatter).
std::vector<PeerTransfer> all_to_all_plan(int rank, int nranks, std::size_t count_per_peer, bool include_self = true);

/// The same plan for an uneven all-to-all: block j of the send buffer (send_blocks) goes to rank j, block i of the
/// receive buffer (recv_blocks) comes from rank i; in the same ring order. Transfers whose send and receive counts
/// are both 0 are left out (the peer leaves out the matching ones: its send count is this rank's receive count).
struct PeerTransferV {
  int peer;
  std::size_t send_offset;
  std::size_t send_count;
  std::size_t recv_offset;
  std::size_t recv_count;
};
std::vector<PeerTransferV> all_to_all_plan_v(int rank, int nranks, const detail::PeerBlocks& send_blocks,
                                             const detail::PeerBlocks& recv_blocks, bool include_self = true);

/// What one poll of a collective in flight found.
struct Completion {
  enum class State { pending, done, failed };
  State state = State::pending;
  std::string error;  ///< when failed: what failed, naming the collective
};

/// Classifies one poll of the collective `name`: `event_state` is cudaEventQuery of its completion event,
/// `async_error` the communicator's ncclCommGetAsyncError. An asynchronous error fails it whatever the event says
/// (a collective whose peer is gone never completes).
Completion classify(cudaError_t event_state, ncclResult_t async_error, const std::string& name);

/// The CUDA and NCCL calls that enqueue one collective around its posted calls and then poll and wait for it, as a
/// table: LaunchSteps::cuda() are the real ones; tests replace them to walk the error paths without a GPU.
struct LaunchSteps {
  std::function<cudaError_t(cudaEvent_t& event)> create_event;
  std::function<void(cudaEvent_t event)> destroy_event;
  std::function<cudaError_t(cudaEvent_t event, cudaStream_t stream)> record_event;
  std::function<cudaError_t(cudaStream_t stream, cudaEvent_t event)> stream_wait_event;
  std::function<cudaError_t(cudaStream_t stream)> synchronize_stream;
  std::function<ncclResult_t()> group_start;
  std::function<ncclResult_t()> group_end;
  // The transport's polls and waits: cudaEventQuery, ncclCommGetAsyncError, cudaEventSynchronize.
  std::function<cudaError_t(cudaEvent_t event)> query_event;
  std::function<ncclResult_t(ncclComm_t comm, ncclResult_t* async_error)> async_error;
  std::function<cudaError_t(cudaEvent_t event)> synchronize_event;

  static LaunchSteps cuda();
};

/// One NCCL call of a launch bound to its operands (ncclSend, ncclRecv, ncclBroadcast, ...), and its name for errors.
struct PostedCall {
  std::string what;
  std::function<ncclResult_t()> post;
};

/// Owns one CUDA event from its creation on: destroyed exactly once on every path (CommunicationError when it cannot
/// be created, nothing to destroy then).
class EventOwner {
 public:
  EventOwner(const LaunchSteps& steps, const std::string& what);
  ~EventOwner();
  EventOwner(EventOwner&& other) noexcept : steps_(other.steps_), event_(other.release()) {}
  EventOwner(const EventOwner&) = delete;
  EventOwner& operator=(const EventOwner&) = delete;
  EventOwner& operator=(EventOwner&&) = delete;

  cudaEvent_t get() const noexcept { return event_; }
  /// Hands the event over (to the transport that destroys it); this owner no longer does.
  cudaEvent_t release() noexcept {
    cudaEvent_t event = event_;
    event_ = nullptr;
    return event;
  }

 private:
  const LaunchSteps* steps_;
  cudaEvent_t event_ = nullptr;
};

/// The sequence of one launch, every failure handled where it happens. Both events are created (owned) first; the
/// communicator's stream waits for `compute_stream`; then `calls` are posted, inside one ncclGroupStart/End when
/// `grouped`; then the completion event is recorded and returned. Everything checkable on the host (plans, counts,
/// pointers) is checked by the caller before this, so nothing but NCCL itself can fail inside the group; if it does
/// (a call or ncclGroupEnd), ending the group would submit half the sends, which the peers never match: the
/// communicator is aborted instead (Communicator::abort: ncclCommAbort, unusable afterwards) and CommunicationError
/// raised. A completion event that cannot be recorded: the communicator's stream is synchronised before the error, so
/// that nothing still reads or writes the buffers the caller then releases. An aborted communicator is refused first.
EventOwner enqueue(const LaunchSteps& steps, Communicator& communicator, cudaStream_t compute_stream,
                   const std::vector<PostedCall>& calls, bool grouped, const std::string& name);

/// enqueue() with the transport that owns its completion event (allocated before anything is enqueued): what launch
/// and launch_send_recv return, their calls bound. test() polls the event and the communicator's asynchronous error;
/// wait() (see the file's comment) also looks at the mesh's failure channel, after the first poll that did not
/// complete and every 16th after it. `steps` must outlive the transport (LaunchSteps::cuda(): a static of the callers).
std::unique_ptr<detail::PendingTransport> launch_calls(const LaunchSteps& steps, Communicator& communicator,
                                                       cudaStream_t compute_stream,
                                                       const std::vector<PostedCall>& calls, bool grouped,
                                                       CollectiveInfo info);

/// Enqueues `operation` (count = elements per peer block, or the uneven blocks when `send_blocks` or `recv_blocks` is
/// not empty, see TransportRequest) and returns its transport. Uneven collectives: all_to_all and exchange_blocks as
/// grouped ncclSend/ncclRecv, all_gather as one ncclBroadcast per root, reduce_scatter_sum as one ncclReduce per
/// root, each set inside one ncclGroupStart/End; nothing is padded. `compute_stream` is the stream
/// of the execution-space instance the operands were produced on, and on which the result will be consumed.
std::unique_ptr<detail::PendingTransport> launch(detail::Operation operation, const void* send, void* recv,
                                                 std::size_t count, ncclDataType_t type, std::size_t type_size,
                                                 Communicator& communicator, cudaStream_t compute_stream,
                                                 CollectiveInfo info, const detail::PeerBlocks& send_blocks = {},
                                                 const detail::PeerBlocks& recv_blocks = {});

/// Enqueues a point-to-point exchange (launch_send_recv): ncclSend of `send_count` values to `dest` and ncclRecv of
/// `recv_count` values from `source`, in one group on the communicator's stream, after `compute_stream`'s work. NCCL
/// has no tags: exchanges between two ranks match in launch order, and a receive's count must equal its message's.
std::unique_ptr<detail::PendingTransport> launch_send_recv(const void* send, std::size_t send_count, int dest,
                                                           void* recv, std::size_t recv_count, int source,
                                                           ncclDataType_t type, Communicator& communicator,
                                                           cudaStream_t compute_stream, CollectiveInfo info);

struct Transport {
  /// ncclReduceScatter always.
  static bool reduces_natively(const Mesh&) { return true; }

  /// Moves are enqueued in T's own NCCL type. A bf16 reduce-scatter is summed in float: the send buffer is widened
  /// on `space` into a pooled float buffer, reduced in ncclFloat32 into a pooled float result, and rounded once into
  /// the bf16 result at wait() (as the pairwise algorithm sums). Everything is allocated and queued before launch(),
  /// whose own checks come before ncclGroupStart.
  template <class ExecSpace, class T, class MemSpace>
  static detail::StartedTransport start(const ExecSpace& space, const std::shared_ptr<Communicator>& communicator,
                                        const detail::TransportRequest<T, MemSpace>& request) {
    return start_on_stream(space, space.cuda_stream(), communicator, request);
  }

  /// start's body, for the instance `space` whose stream is `compute_stream` (apart so that host-only builds can
  /// compile-check it with a host instance: unit_tests/nccl/test_nccl_plan.cpp).
  template <class ExecSpace, class T, class MemSpace>
  static detail::StartedTransport start_on_stream(const ExecSpace& space, cudaStream_t compute_stream,
                                                  const std::shared_ptr<Communicator>& communicator,
                                                  const detail::TransportRequest<T, MemSpace>& request) {
    detail::StartedTransport started;
    started.resources.emplace_back(communicator);  // the transport polls and may abort it until it completes
    if (request.operation == detail::Operation::send_recv) {
      started.transport = launch_send_recv(request.send.data(), request.send.size(), request.dest, request.recv.data(),
                                           request.recv.size(), request.source, datatype<T>(), *communicator,
                                           compute_stream, request.info);
      return started;
    }
    if constexpr (std::is_same_v<T, bf16>) {
      if (request.operation == detail::Operation::reduce_scatter_sum) {
        const std::string& name = request.info.name;
        const auto wide_send =
            detail::allocate_buffer<float, MemSpace>(space, name + " float send", request.send.size());
        const auto wide_recv =
            detail::allocate_buffer<float, MemSpace>(space, name + " float recv", request.recv.size());
        started.resources.emplace_back(wide_send);
        started.resources.emplace_back(wide_recv);
        detail::convert_values(space, request.send.data(), wide_send.view.data(),
                               static_cast<std::int64_t>(request.send.size()), name + " widen to float");
        started.transport = launch(request.operation, wide_send.view.data(), wide_recv.view.data(), request.count,
                                   ncclFloat32, sizeof(float), *communicator, compute_stream, request.info,
                                   request.send_blocks, request.recv_blocks);
        started.arrived = [space, recv = request.recv, wide = wide_recv.view, name]() {
          detail::convert_values(space, wide.data(), recv.data(), static_cast<std::int64_t>(recv.size()),
                                 name + " round to bf16");
        };
        return started;
      }
    }
    started.transport =
        launch(request.operation, request.send.data(), request.recv.data(), request.count, datatype<T>(), sizeof(T),
               *communicator, compute_stream, request.info, request.send_blocks, request.recv_blocks);
    return started;
  }
};

}  // namespace mlacp::nccl

#if defined(KOKKOS_ENABLE_CUDA)
namespace mlacp::nccl {
/// Backend<Kokkos::Cuda>'s transport (backend.hpp): NCCL when the mesh has an NCCL communicator (nccl::enable), else
/// MPI.
struct CudaTransport {
  static bool reduces_natively(const Mesh& mesh) { return mesh.has_nccl() || mpi::Transport::reduces_natively(mesh); }
  /// NCCL sums itself (bf16 in float); without it, MPI's transport decides.
  static bool sums_with_mpi(const Mesh& mesh) { return !mesh.has_nccl() && mpi::Transport::sums_with_mpi(mesh); }
  template <class T, class MemSpace>
  static detail::StartedTransport start(const Kokkos::Cuda& space, const Mesh& mesh,
                                        const detail::TransportRequest<T, MemSpace>& request) {
    if (mesh.has_nccl()) return nccl::Transport::start(space, mesh.nccl(), request);
    return mpi::Transport::start(space, mesh, request);
  }
};
}  // namespace mlacp::nccl
#endif
#endif
