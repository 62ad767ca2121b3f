// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/mpi/communicator.hpp>
#include <mlacp/mpi/request_transport.hpp>
#include <mlacp/nccl/transport.hpp>

#include <cstdio>
#include <utility>

namespace mlacp::nccl {
namespace {

bool is_failure(ncclResult_t result) {
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  return result != ncclSuccess && result != ncclInProgress;
#else
  return result != ncclSuccess;
#endif
}

class StreamTransport final : public detail::PendingTransport {
 public:
  StreamTransport(const LaunchSteps& steps, cudaStream_t compute_stream, const Communicator& communicator,
                  CollectiveInfo info)
      : steps_(steps), compute_stream_(compute_stream), communicator_(communicator), info_(std::move(info)) {}
  ~StreamTransport() override {
    complete_noexcept();
    if (done_) steps_.destroy_event(done_);
  }

  /// Takes the completion event, once recorded (the transport exists before anything is enqueued).
  void adopt(cudaEvent_t done) noexcept { done_ = done; }

  bool test() override { return poll(); }

  void wait() override {
    const double timeout = wait_timeout();
    if (timeout > 0) {
      detail::watch([this] { return poll_watched(); }, timeout, [this](double waited) { expire(waited); });
    } else if (!poll()) {
      // The host does not block: report a failure NCCL (poll) or the mesh already knows of, then order the compute
      // stream after the collective.
      throw_if_mesh_failed();
    }
    check_cuda(steps_.stream_wait_event(compute_stream_, done_), "cudaStreamWaitEvent of '" + info_.name + "'");
    waited_ = true;
  }

  void progress() noexcept override {}  // NCCL progresses on the GPU: no host polling

  void complete_noexcept() noexcept override {
    if (waited_ || done_ == nullptr) return;
    waited_ = true;
    const double timeout = wait_timeout();
    try {
      if (timeout > 0) {
        detail::watch([this] { return poll_watched(); }, timeout, [this](double waited) { expire(waited); });
        return;
      }
      if (!poll()) throw_if_mesh_failed();
    } catch (const std::exception& e) {
      // A broken mesh: the collective may never complete. Parked: the handle keeps its buffers for good.
      if (mesh_failed_) {
        parked_ = true;
        return;
      }
      std::fprintf(stderr, "mlacp: completing the unwaited collective '%s' failed: %s\n", info_.name.c_str(), e.what());
      return;
    }
    if (steps_.synchronize_event(done_) != cudaSuccess)
      std::fprintf(stderr, "mlacp: cudaEventSynchronize of '%s' failed\n", info_.name.c_str());
  }

  bool parked() const noexcept override { return parked_; }

 private:
  // One host-side poll: true once complete; throws CommunicationError on an asynchronous NCCL error.
  bool poll() {
    ncclResult_t async = ncclSuccess;
    check(steps_.async_error(communicator_.comm(), &async), "ncclCommGetAsyncError for '" + info_.name + "'");
    const Completion c = classify(steps_.query_event(done_), async, info_.name);
    if (c.state == Completion::State::failed) throw CommunicationError(c.error);
    return c.state == Completion::State::done;
  }

  // A poll of a blocking wait: also the mesh's failure channel, after the first poll that did not complete and then
  // every 16th (as the MPI backend's wait), so that a completed collective returns and a short wait costs one look.
  bool poll_watched() {
    if (poll()) return true;
    if (polls_++ % 16 == 0 || mesh_failed_) throw_if_mesh_failed();
    return false;
  }

  // Throws CommunicationError, as the MPI backend's wait does, when a rank reported a failure on the mesh.
  void throw_if_mesh_failed() {
    std::string failure;
    if (!mpi::channels_failed(communicator_.mpi_comm(), &failure)) return;
    mesh_failed_ = true;
    throw CommunicationError(mpi::broken_mesh_message("mlacp: wait of '" + info_.name + "'", failure));
  }

  [[noreturn]] void expire(double waited) {
    const std::string report = detail::watchdog_report(info_, communicator_.rank(), communicator_.size(), waited);
    std::fprintf(stderr, "%s", report.c_str());
    std::fflush(stderr);
    ncclCommAbort(communicator_.comm());  // frees the GPU from the collective that will never complete
    mpi::abort_communicator(communicator_.mpi_comm());
  }

  const LaunchSteps& steps_;
  cudaEvent_t done_ = nullptr;
  cudaStream_t compute_stream_;
  const Communicator& communicator_;
  CollectiveInfo info_;
  unsigned polls_ = 0;
  bool waited_ = false;
  bool mesh_failed_ = false;
  bool parked_ = false;
};

// The real steps, never destroyed: a transport completed during static destruction still calls them.
const LaunchSteps& cuda_steps() {
  static const auto* steps = new LaunchSteps(LaunchSteps::cuda());
  return *steps;
}

}  // namespace

Completion classify(cudaError_t event_state, ncclResult_t async_error, const std::string& name) {
  Completion c;
  if (is_failure(async_error)) {
    c.state = Completion::State::failed;
    c.error = "mlacp: NCCL collective '" + name + "' failed: the communicator reports " +
              ncclGetErrorString(async_error) + " (a peer failed or left; the communicator must be aborted)";
  } else if (event_state == cudaSuccess) {
    c.state = Completion::State::done;
  } else if (event_state != cudaErrorNotReady) {
    c.state = Completion::State::failed;
    c.error = "mlacp: cudaEventQuery of '" + name + "' failed: " + cudaGetErrorName(event_state);
  }
  return c;
}

std::vector<PeerTransfer> all_to_all_plan(int rank, int nranks, std::size_t count_per_peer, bool include_self) {
  if (nranks <= 0 || rank < 0 || rank >= nranks)
    throw InvalidArgument("mlacp::nccl::all_to_all_plan: rank " + std::to_string(rank) + " of " +
                          std::to_string(nranks) + " ranks; expected 0 <= rank < nranks");
  std::vector<PeerTransfer> plan;
  plan.reserve(static_cast<std::size_t>(nranks));
  for (int step = include_self ? 0 : 1; step < nranks; ++step) {
    const int peer = (rank + step) % nranks;
    plan.push_back(PeerTransfer{peer, static_cast<std::size_t>(peer) * count_per_peer,
                                static_cast<std::size_t>(peer) * count_per_peer, count_per_peer});
  }
  return plan;
}

std::vector<PeerTransferV> all_to_all_plan_v(int rank, int nranks, const detail::PeerBlocks& send_blocks,
                                             const detail::PeerBlocks& recv_blocks, bool include_self) {
  const auto n = static_cast<std::size_t>(nranks);
  if (nranks <= 0 || rank < 0 || rank >= nranks || send_blocks.counts.size() != n || send_blocks.offsets.size() != n ||
      recv_blocks.counts.size() != n || recv_blocks.offsets.size() != n)
    throw InvalidArgument("mlacp::nccl::all_to_all_plan_v: rank " + std::to_string(rank) + " of " +
                          std::to_string(nranks) + " ranks with " + std::to_string(send_blocks.counts.size()) +
                          " send and " + std::to_string(recv_blocks.counts.size()) +
                          " receive blocks; expected 0 <= rank < nranks and one block per rank on each side");
  std::vector<PeerTransferV> plan;
  plan.reserve(n);
  for (int step = include_self ? 0 : 1; step < nranks; ++step) {
    const auto peer = static_cast<std::size_t>((rank + step) % nranks);
    if (send_blocks.counts[peer] == 0 && recv_blocks.counts[peer] == 0) continue;
    plan.push_back(PeerTransferV{static_cast<int>(peer), send_blocks.offsets[peer], send_blocks.counts[peer],
                                 recv_blocks.offsets[peer], recv_blocks.counts[peer]});
  }
  return plan;
}

LaunchSteps LaunchSteps::cuda() {
  LaunchSteps steps;
  steps.create_event = [](cudaEvent_t& event) { return cudaEventCreateWithFlags(&event, cudaEventDisableTiming); };
  steps.destroy_event = [](cudaEvent_t event) { cudaEventDestroy(event); };
  steps.record_event = [](cudaEvent_t event, cudaStream_t stream) { return cudaEventRecord(event, stream); };
  steps.stream_wait_event = [](cudaStream_t stream, cudaEvent_t event) {
    return cudaStreamWaitEvent(stream, event, 0);
  };
  steps.synchronize_stream = [](cudaStream_t stream) { return cudaStreamSynchronize(stream); };
  steps.group_start = [] { return ncclGroupStart(); };
  steps.group_end = [] { return ncclGroupEnd(); };
  steps.query_event = [](cudaEvent_t event) { return cudaEventQuery(event); };
  steps.async_error = [](ncclComm_t comm, ncclResult_t* async_error) {
    return ncclCommGetAsyncError(comm, async_error);
  };
  steps.synchronize_event = [](cudaEvent_t event) { return cudaEventSynchronize(event); };
  return steps;
}

EventOwner::EventOwner(const LaunchSteps& steps, const std::string& what) : steps_(&steps) {
  cudaEvent_t event = nullptr;
  const cudaError_t result = steps.create_event(event);
  check_cuda(result, what);  // nothing created, nothing to destroy
  event_ = event;
}

EventOwner::~EventOwner() {
  if (event_ != nullptr && steps_->destroy_event) steps_->destroy_event(event_);
}

EventOwner enqueue(const LaunchSteps& steps, Communicator& communicator, cudaStream_t compute_stream,
                   const std::vector<PostedCall>& calls, bool grouped, const std::string& name) {
  communicator.require_usable("launching '" + name + "'");
  EventOwner ready(steps, "cudaEventCreate for '" + name + "'");
  EventOwner done(steps, "cudaEventCreate for '" + name + "'");
  const cudaStream_t stream = communicator.stream();
  // The communication stream starts when the operands are ready on the compute stream. (`ready` is destroyed at
  // return: CUDA releases it once the wait has consumed it.)
  check_cuda(steps.record_event(ready.get(), compute_stream), "cudaEventRecord for '" + name + "'");
  check_cuda(steps.stream_wait_event(stream, ready.get()), "cudaStreamWaitEvent for '" + name + "'");
  if (grouped) {
    check(steps.group_start(), "ncclGroupStart of '" + name + "'");
    auto abort_on = [&](ncclResult_t result, const std::string& what) {
      if (result == ncclSuccess) return;
      const std::string why = what + " of '" + name + "' failed inside its group: " + ncclGetErrorString(result);
      communicator.abort(why);
      throw CommunicationError("mlacp: " + why +
                               "; the communicator was aborted (ncclCommAbort), as ending the group "
                               "would submit calls the peers never match");
    };
    for (const auto& call : calls) abort_on(call.post(), call.what);
    abort_on(steps.group_end(), "ncclGroupEnd");
  } else {
    for (const auto& call : calls) check(call.post(), call.what + " of '" + name + "'");
  }
  const cudaError_t recorded = steps.record_event(done.get(), stream);
  if (recorded != cudaSuccess) {
    // Without the event nobody can tell when NCCL is done with the buffers the caller releases on this error: wait.
    const cudaError_t synchronized = steps.synchronize_stream(stream);
    throw CommunicationError("mlacp: cudaEventRecord for '" + name + "' failed: " + cudaGetErrorString(recorded) +
                             (synchronized == cudaSuccess
                                  ? std::string("; the communication stream was synchronised before its buffers are "
                                                "released")
                                  : std::string("; synchronising the communication stream failed too: ") +
                                        cudaGetErrorString(synchronized)));
  }
  return done;
}

std::unique_ptr<detail::PendingTransport> launch_calls(const LaunchSteps& steps, Communicator& communicator,
                                                       cudaStream_t compute_stream,
                                                       const std::vector<PostedCall>& calls, bool grouped,
                                                       CollectiveInfo info) {
  const std::string name = info.name;
  // Allocated before anything is enqueued; it takes the completion event once recorded.
  auto transport = std::make_unique<StreamTransport>(steps, compute_stream, communicator, std::move(info));
  EventOwner done = enqueue(steps, communicator, compute_stream, calls, grouped, name);
  transport->adopt(done.release());
  return transport;
}

std::unique_ptr<detail::PendingTransport> launch(detail::Operation operation, const void* send, void* recv,
                                                 std::size_t count, ncclDataType_t type, std::size_t type_size,
                                                 Communicator& communicator, cudaStream_t compute_stream,
                                                 CollectiveInfo info, const detail::PeerBlocks& send_blocks,
                                                 const detail::PeerBlocks& recv_blocks) {
  const std::string name = info.name;
  // NCCL would add bf16 in bf16, rounding at every step: Transport::start sums bf16 in float (ncclFloat32) instead.
  if (type == ncclBfloat16 && operation == detail::Operation::reduce_scatter_sum)
    throw InvalidArgument("mlacp::nccl::launch '" + name +
                          "': a reduce-scatter of ncclBfloat16 values; expected ncclFloat32 (bf16 is summed in float, "
                          "widened by nccl::Transport::start)");
  const cudaStream_t stream = communicator.stream();
  const ncclComm_t comm = communicator.comm();
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  // Every call, bound to its operands, before anything is enqueued: the plans and the checks below throw here, never
  // inside a group.
  std::vector<PostedCall> calls;
  bool grouped = true;
  auto exchange = [&](bool include_self) {
    for (const auto& t : all_to_all_plan(communicator.rank(), communicator.size(), count, include_self)) {
      calls.push_back(
          {"ncclSend", [=] { return ncclSend(in + t.send_offset * type_size, t.count, type, t.peer, comm, stream); }});
      calls.push_back(
          {"ncclRecv", [=] { return ncclRecv(out + t.recv_offset * type_size, t.count, type, t.peer, comm, stream); }});
    }
  };
  auto exchange_v = [&](bool include_self) {
    for (const auto& t :
         all_to_all_plan_v(communicator.rank(), communicator.size(), send_blocks, recv_blocks, include_self)) {
      // A zero count on one side is skipped: the peer skips the matching call (its counts mirror these).
      if (t.send_count > 0)
        calls.push_back({"ncclSend", [=] {
                           return ncclSend(in + t.send_offset * type_size, t.send_count, type, t.peer, comm, stream);
                         }});
      if (t.recv_count > 0)
        calls.push_back({"ncclRecv", [=] {
                           return ncclRecv(out + t.recv_offset * type_size, t.recv_count, type, t.peer, comm, stream);
                         }});
    }
  };
  const auto parts = static_cast<std::size_t>(communicator.size());
  const bool uneven = !send_blocks.empty() || !recv_blocks.empty();
  if (operation == detail::Operation::send_recv)
    throw InvalidArgument("mlacp::nccl::launch '" + name +
                          "': a send_recv; expected a collective (point-to-point exchanges start with "
                          "nccl::launch_send_recv)");
  if (uneven) {
    switch (operation) {
      case detail::Operation::send_recv:
        break;  // refused above
      case detail::Operation::all_to_all:
        exchange_v(true);
        break;
      case detail::Operation::exchange_blocks:
        exchange_v(false);
        break;
      case detail::Operation::all_gather:
        if (recv_blocks.counts.size() != parts || recv_blocks.offsets.size() != parts)
          throw InvalidArgument("mlacp::nccl::launch '" + name + "': " + std::to_string(recv_blocks.counts.size()) +
                                " receive blocks; expected one per rank, " + std::to_string(parts));
        // One broadcast per root (every rank knows every count; an empty block is skipped by all).
        for (int root = 0; root < communicator.size(); ++root) {
          const auto r = static_cast<std::size_t>(root);
          if (recv_blocks.counts[r] == 0) continue;
          const std::size_t n = recv_blocks.counts[r], offset = recv_blocks.offsets[r];
          calls.push_back({"ncclBroadcast",
                           [=] { return ncclBroadcast(send, out + offset * type_size, n, type, root, comm, stream); }});
        }
        break;
      case detail::Operation::reduce_scatter_sum:
        if (send_blocks.counts.size() != parts || send_blocks.offsets.size() != parts)
          throw InvalidArgument("mlacp::nccl::launch '" + name + "': " + std::to_string(send_blocks.counts.size()) +
                                " send blocks; expected one per rank, " + std::to_string(parts));
        // One reduction per root onto its block (the receive buffer is written on the root only).
        for (int root = 0; root < communicator.size(); ++root) {
          const auto r = static_cast<std::size_t>(root);
          if (send_blocks.counts[r] == 0) continue;
          const std::size_t n = send_blocks.counts[r], offset = send_blocks.offsets[r];
          calls.push_back({"ncclReduce", [=] {
                             return ncclReduce(in + offset * type_size, recv, n, type, ncclSum, root, comm, stream);
                           }});
        }
        break;
    }
  } else {
    switch (operation) {
      case detail::Operation::send_recv:
        break;  // refused above
      case detail::Operation::all_to_all:
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
        grouped = false;
        calls.push_back({"ncclAlltoAll", [=] { return ncclAlltoAll(send, recv, count, type, comm, stream); }});
#else
        exchange(true);
#endif
        break;
      case detail::Operation::exchange_blocks:
        exchange(false);
        break;
      case detail::Operation::all_gather:
        grouped = false;
        calls.push_back({"ncclAllGather", [=] { return ncclAllGather(send, recv, count, type, comm, stream); }});
        break;
      case detail::Operation::reduce_scatter_sum:
        grouped = false;
        calls.push_back(
            {"ncclReduceScatter", [=] { return ncclReduceScatter(send, recv, count, type, ncclSum, comm, stream); }});
        break;
    }
  }
  std::size_t moved = count;
  for (const auto c : send_blocks.counts) moved += c;
  for (const auto c : recv_blocks.counts) moved += c;
  if (moved > 0 && (send == nullptr || recv == nullptr))
    throw InvalidArgument("mlacp::nccl::launch '" + name + "': a null " + (send == nullptr ? "send" : "receive") +
                          " buffer for " + std::to_string(moved) + " values; expected allocated buffers");
  return launch_calls(cuda_steps(), communicator, compute_stream, calls, grouped, std::move(info));
}

std::unique_ptr<detail::PendingTransport> launch_send_recv(const void* send, std::size_t send_count, int dest,
                                                           void* recv, std::size_t recv_count, int source,
                                                           ncclDataType_t type, Communicator& communicator,
                                                           cudaStream_t compute_stream, CollectiveInfo info) {
  const std::string name = info.name;
  for (const int peer : {dest, source})
    if (peer < 0 || peer >= communicator.size())
      throw InvalidArgument("mlacp::nccl::launch_send_recv '" + name + "': peer " + std::to_string(peer) +
                            "; expected a rank in [0, " + std::to_string(communicator.size()) + ")");
  if ((send_count > 0 && send == nullptr) || (recv_count > 0 && recv == nullptr))
    throw InvalidArgument("mlacp::nccl::launch_send_recv '" + name + "': a null " +
                          (send_count > 0 && send == nullptr ? "send" : "receive") +
                          " buffer; expected allocated buffers");
  const cudaStream_t stream = communicator.stream();
  const ncclComm_t comm = communicator.comm();
  // Both in one group, so that a ring of exchanges (every rank sending to the next, receiving from the previous)
  // cannot deadlock; NCCL matches them with the peers' calls in launch order.
  const std::vector<PostedCall> calls{
      {"ncclSend", [=] { return ncclSend(send, send_count, type, dest, comm, stream); }},
      {"ncclRecv", [=] { return ncclRecv(recv, recv_count, type, source, comm, stream); }}};
  return launch_calls(cuda_steps(), communicator, compute_stream, calls, true, std::move(info));
}

}  // namespace mlacp::nccl
