// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
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
  StreamTransport(cudaEvent_t done, cudaStream_t compute_stream, const Communicator& communicator, CollectiveInfo info)
      : done_(done), compute_stream_(compute_stream), communicator_(communicator), info_(std::move(info)) {}
  ~StreamTransport() override {
    complete_noexcept();
    if (done_) cudaEventDestroy(done_);
  }

  bool test() override { return poll(); }

  void wait() override {
    const double timeout = wait_timeout();
    if (timeout > 0) {
      detail::watch([this] { return poll(); }, timeout, [this](double waited) { expire(waited); });
    } else {
      // The host does not block: report a failure NCCL already knows of, then order the compute stream after it.
      ncclResult_t async = ncclSuccess;
      check(ncclCommGetAsyncError(communicator_.comm(), &async), "ncclCommGetAsyncError for '" + info_.name + "'");
      if (is_failure(async)) throw CommunicationError(classify(cudaErrorNotReady, async, info_.name).error);
    }
    check_cuda(cudaStreamWaitEvent(compute_stream_, done_, 0), "cudaStreamWaitEvent of '" + info_.name + "'");
    waited_ = true;
  }

  void progress() noexcept override {}  // NCCL progresses on the GPU: no host polling

  void complete_noexcept() noexcept override {
    if (waited_ || done_ == nullptr) return;
    waited_ = true;
    const double timeout = wait_timeout();
    try {
      if (timeout > 0) {
        detail::watch([this] { return poll(); }, timeout, [this](double waited) { expire(waited); });
        return;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mlacp: completing the unwaited collective '%s' failed: %s\n", info_.name.c_str(), e.what());
      return;
    }
    if (cudaEventSynchronize(done_) != cudaSuccess)
      std::fprintf(stderr, "mlacp: cudaEventSynchronize of '%s' failed\n", info_.name.c_str());
  }

 private:
  // One host-side poll: true once complete; throws CommunicationError on an asynchronous NCCL error.
  bool poll() {
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(communicator_.comm(), &async), "ncclCommGetAsyncError for '" + info_.name + "'");
    const Completion c = classify(cudaEventQuery(done_), async, info_.name);
    if (c.state == Completion::State::failed) throw CommunicationError(c.error);
    return c.state == Completion::State::done;
  }

  [[noreturn]] void expire(double waited) {
    const std::string report = detail::watchdog_report(info_, communicator_.rank(), communicator_.size(), waited);
    std::fprintf(stderr, "%s", report.c_str());
    std::fflush(stderr);
    ncclCommAbort(communicator_.comm());  // frees the GPU from the collective that will never complete
    mpi::abort_communicator(communicator_.mpi_comm());
  }

  cudaEvent_t done_ = nullptr;
  cudaStream_t compute_stream_;
  const Communicator& communicator_;
  CollectiveInfo info_;
  bool waited_ = false;
};

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

std::unique_ptr<detail::PendingTransport> launch(detail::Operation operation, const void* send, void* recv,
                                                 std::size_t count, ncclDataType_t type, std::size_t type_size,
                                                 Communicator& communicator, cudaStream_t compute_stream,
                                                 CollectiveInfo info, const detail::PeerBlocks& send_blocks,
                                                 const detail::PeerBlocks& recv_blocks) {
  const std::string name = info.name;
  cudaEvent_t ready = nullptr;
  cudaEvent_t done = nullptr;
  check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate for '" + name + "'");
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate for '" + name + "'");
  auto transport = std::make_unique<StreamTransport>(done, compute_stream, communicator, std::move(info));
  const cudaStream_t stream = communicator.stream();
  const ncclComm_t comm = communicator.comm();
  // The communication stream starts when the operands are ready on the compute stream.
  check_cuda(cudaEventRecord(ready, compute_stream), "cudaEventRecord for '" + name + "'");
  check_cuda(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent for '" + name + "'");
  cudaEventDestroy(ready);  // released once the wait above has consumed it
  auto grouped_exchange = [&](bool include_self) {
    check(ncclGroupStart(), "ncclGroupStart");
    for (const auto& t : all_to_all_plan(communicator.rank(), communicator.size(), count, include_self)) {
      check(ncclSend(static_cast<const char*>(send) + t.send_offset * type_size, t.count, type, t.peer, comm, stream),
            "ncclSend of '" + name + "'");
      check(ncclRecv(static_cast<char*>(recv) + t.recv_offset * type_size, t.count, type, t.peer, comm, stream),
            "ncclRecv of '" + name + "'");
    }
    check(ncclGroupEnd(), "ncclGroupEnd of '" + name + "'");
  };
  auto grouped_exchange_v = [&](bool include_self) {
    check(ncclGroupStart(), "ncclGroupStart");
    for (const auto& t :
         all_to_all_plan_v(communicator.rank(), communicator.size(), send_blocks, recv_blocks, include_self)) {
      // A zero count on one side is skipped: the peer skips the matching call (its counts mirror these).
      if (t.send_count > 0)
        check(ncclSend(static_cast<const char*>(send) + t.send_offset * type_size, t.send_count, type, t.peer, comm,
                       stream),
              "ncclSend of '" + name + "'");
      if (t.recv_count > 0)
        check(ncclRecv(static_cast<char*>(recv) + t.recv_offset * type_size, t.recv_count, type, t.peer, comm, stream),
              "ncclRecv of '" + name + "'");
    }
    check(ncclGroupEnd(), "ncclGroupEnd of '" + name + "'");
  };
  const bool uneven = !send_blocks.empty() || !recv_blocks.empty();
  if (uneven) {
    switch (operation) {
      case detail::Operation::all_to_all:
        grouped_exchange_v(true);
        break;
      case detail::Operation::exchange_blocks:
        grouped_exchange_v(false);
        break;
      case detail::Operation::all_gather:
        // One broadcast per root (every rank knows every count; an empty block is skipped by all).
        check(ncclGroupStart(), "ncclGroupStart");
        for (int root = 0; root < communicator.size(); ++root) {
          const auto r = static_cast<std::size_t>(root);
          if (recv_blocks.counts[r] == 0) continue;
          check(ncclBroadcast(send, static_cast<char*>(recv) + recv_blocks.offsets[r] * type_size,
                              recv_blocks.counts[r], type, root, comm, stream),
                "ncclBroadcast of '" + name + "'");
        }
        check(ncclGroupEnd(), "ncclGroupEnd of '" + name + "'");
        break;
      case detail::Operation::reduce_scatter_sum:
        // One reduction per root onto its block (the receive buffer is written on the root only).
        check(ncclGroupStart(), "ncclGroupStart");
        for (int root = 0; root < communicator.size(); ++root) {
          const auto r = static_cast<std::size_t>(root);
          if (send_blocks.counts[r] == 0) continue;
          check(ncclReduce(static_cast<const char*>(send) + send_blocks.offsets[r] * type_size, recv,
                           send_blocks.counts[r], type, ncclSum, root, comm, stream),
                "ncclReduce of '" + name + "'");
        }
        check(ncclGroupEnd(), "ncclGroupEnd of '" + name + "'");
        break;
    }
    check_cuda(cudaEventRecord(done, stream), "cudaEventRecord for '" + name + "'");
    return transport;
  }
  switch (operation) {
    case detail::Operation::all_to_all:
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
      check(ncclAlltoAll(send, recv, count, type, comm, stream), "ncclAlltoAll of '" + name + "'");
#else
      grouped_exchange(true);
#endif
      break;
    case detail::Operation::exchange_blocks:
      grouped_exchange(false);
      break;
    case detail::Operation::all_gather:
      check(ncclAllGather(send, recv, count, type, comm, stream), "ncclAllGather of '" + name + "'");
      break;
    case detail::Operation::reduce_scatter_sum:
      check(ncclReduceScatter(send, recv, count, type, ncclSum, comm, stream), "ncclReduceScatter of '" + name + "'");
      break;
  }
  check_cuda(cudaEventRecord(done, stream), "cudaEventRecord for '" + name + "'");
  return transport;
}

}  // namespace mlacp::nccl
