// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/nccl/nccl_transport.hpp>

#include <cstdio>
#include <utility>

namespace mlacp::nccl {
namespace {

class StreamTransport final : public detail::PendingTransport {
 public:
  StreamTransport(cudaEvent_t done, cudaStream_t compute_stream, std::string name)
      : done_(done), compute_stream_(compute_stream), name_(std::move(name)) {}
  ~StreamTransport() override {
    complete_noexcept();
    if (done_) cudaEventDestroy(done_);
  }

  bool test() override {
    const cudaError_t state = cudaEventQuery(done_);
    if (state == cudaErrorNotReady) return false;
    check_cuda(state, "cudaEventQuery of '" + name_ + "'");
    return true;
  }

  void wait() override {
    check_cuda(cudaStreamWaitEvent(compute_stream_, done_, 0), "cudaStreamWaitEvent of '" + name_ + "'");
    waited_ = true;
  }

  void progress() noexcept override {}  // NCCL progresses on the GPU: no host polling

  void complete_noexcept() noexcept override {
    if (waited_ || done_ == nullptr) return;
    if (cudaEventSynchronize(done_) != cudaSuccess)
      std::fprintf(stderr, "mlacp: cudaEventSynchronize of '%s' failed\n", name_.c_str());
    waited_ = true;
  }

 private:
  cudaEvent_t done_ = nullptr;
  cudaStream_t compute_stream_;
  std::string name_;
  bool waited_ = false;
};

}  // namespace

std::vector<PeerTransfer> all_to_all_plan(int rank, int nranks, std::size_t count_per_peer) {
  if (nranks <= 0 || rank < 0 || rank >= nranks)
    throw InvalidArgument("mlacp::nccl::all_to_all_plan: rank " + std::to_string(rank) + " of " +
                          std::to_string(nranks) + " ranks; expected 0 <= rank < nranks");
  std::vector<PeerTransfer> plan;
  plan.reserve(static_cast<std::size_t>(nranks));
  for (int step = 0; step < nranks; ++step) {
    const int peer = (rank + step) % nranks;
    plan.push_back(PeerTransfer{peer, static_cast<std::size_t>(peer) * count_per_peer,
                                static_cast<std::size_t>(peer) * count_per_peer, count_per_peer});
  }
  return plan;
}

std::unique_ptr<detail::PendingTransport> launch(Operation operation, const void* send, void* recv, std::size_t count,
                                                 ncclDataType_t type, std::size_t type_size,
                                                 detail::NcclContext& context, cudaStream_t compute_stream,
                                                 const std::string& name) {
  cudaEvent_t ready = nullptr;
  cudaEvent_t done = nullptr;
  check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate for '" + name + "'");
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate for '" + name + "'");
  auto transport = std::make_unique<StreamTransport>(done, compute_stream, name);
  // The communication stream starts when the operands are ready on the compute stream.
  check_cuda(cudaEventRecord(ready, compute_stream), "cudaEventRecord for '" + name + "'");
  check_cuda(cudaStreamWaitEvent(context.stream, ready, 0), "cudaStreamWaitEvent for '" + name + "'");
  cudaEventDestroy(ready);  // released once the wait above has consumed it
  int nranks = 0;
  int rank = 0;
  check(ncclCommCount(context.comm, &nranks), "ncclCommCount");
  check(ncclCommUserRank(context.comm, &rank), "ncclCommUserRank");
  switch (operation) {
    case Operation::all_to_all:
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
      check(ncclAlltoAll(send, recv, count, type, context.comm, context.stream), "ncclAlltoAll of '" + name + "'");
#else
      check(ncclGroupStart(), "ncclGroupStart");
      for (const auto& t : all_to_all_plan(rank, nranks, count)) {
        check(ncclSend(static_cast<const char*>(send) + t.send_offset * type_size, t.count, type, t.peer, context.comm,
                       context.stream),
              "ncclSend of '" + name + "'");
        check(ncclRecv(static_cast<char*>(recv) + t.recv_offset * type_size, t.count, type, t.peer, context.comm,
                       context.stream),
              "ncclRecv of '" + name + "'");
      }
      check(ncclGroupEnd(), "ncclGroupEnd of '" + name + "'");
#endif
      break;
    case Operation::all_gather:
      check(ncclAllGather(send, recv, count, type, context.comm, context.stream), "ncclAllGather of '" + name + "'");
      break;
    case Operation::reduce_scatter_sum:
      check(ncclReduceScatter(send, recv, count, type, ncclSum, context.comm, context.stream),
            "ncclReduceScatter of '" + name + "'");
      break;
  }
  (void)type_size;
  check_cuda(cudaEventRecord(done, context.stream), "cudaEventRecord for '" + name + "'");
  return transport;
}

}  // namespace mlacp::nccl
