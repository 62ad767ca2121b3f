// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/mpi/block_exchange_transport.hpp>
#include <mlacp/mpi/communicator.hpp>
#include <mlacp/mpi/request_transport.hpp>

#include <string>
#include <utility>

namespace mlacp::mpi {
namespace {

class BlockExchangeTransport final : public detail::PendingTransport {
 public:
  BlockExchangeTransport(std::vector<MPI_Request> sends, std::vector<MPI_Request> recvs, MPI_Comm comm,
                         CollectiveInfo info, std::function<void(int)> block_arrived)
      : sends_(std::move(sends)),
        recvs_(std::move(recvs)),
        arrived_(recvs_.size(), 0),
        comm_(comm),
        info_(std::move(info)),
        block_arrived_(std::move(block_arrived)) {}
  ~BlockExchangeTransport() override { complete_noexcept(); }

  bool test() override {
    const bool all = test_receives(/*raise=*/true);
    return test_requests(sends_, info_) && all;
  }

  void wait() override {
    // The receives in rank order. While some are still in flight, the blocks that are in are reported, so that their
    // sum proceeds while this rank would otherwise only wait; once every block is in, none is reported here and the
    // collective's finish sums the rest in one pass. A broken mesh leaves the requests active: the handle's destructor
    // parks them.
    int first_error = MPI_SUCCESS;
    if (!test_receives(/*raise=*/false)) report_arrivals();
    for (std::size_t i = 0; i < recvs_.size(); ++i) {
      if (wait_request(recvs_[i], comm_, info_, first_error)) arrived_[i] = 1;
      if (first_error == MPI_SUCCESS && !test_receives(/*raise=*/false)) report_arrivals();
    }
    for (auto& request : sends_) wait_request(request, comm_, info_, first_error);
    check_mpi(first_error, "MPI_Wait of '" + info_.name + "'");
  }

  // Only tests: a block summed here would take its time from the compute that hides the transfer, and a run summed
  // before the last block adds a memory pass, so that on a CPU whose one thread both computes and sums, summing during
  // compute only costs. The arrivals seen here are reported by wait().
  void progress() noexcept override {
    test_receives(/*raise=*/false);
    progress_requests(sends_);
  }

  void complete_noexcept() noexcept override {
    complete_requests_noexcept(recvs_, comm_, info_, parked_);
    complete_requests_noexcept(sends_, comm_, info_, parked_);
  }

  bool parked() const noexcept override { return parked_; }

 private:
  // Tests the receives still in flight and marks those that completed; true when all are in. An error raises
  // CommunicationError when `raise` (test()), else it ends the pass with false and is left to wait(), which waits for
  // each receive (progress() must not throw).
  bool test_receives(const bool raise) {
    bool all = true;
    for (std::size_t i = 0; i < recvs_.size(); ++i) {
      if (recvs_[i] == MPI_REQUEST_NULL) continue;  // MPI_Test sets a completed request to MPI_REQUEST_NULL
      int done = 0;
      const int code = MPI_Test(&recvs_[i], &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS) {
        if (raise) check_mpi(code, "MPI_Test of '" + info_.name + "'");
        return false;
      }
      if (done != 0) arrived_[i] = 1;
      all = all && done != 0;
    }
    return all;
  }

  // Reports every arrived block not reported yet, in rank order.
  void report_arrivals() {
    for (std::size_t i = 0; i < arrived_.size(); ++i) {
      if (arrived_[i] != 1) continue;
      arrived_[i] = 2;
      block_arrived_(static_cast<int>(i));
    }
  }

  std::vector<MPI_Request> sends_;
  std::vector<MPI_Request> recvs_;
  std::vector<char> arrived_;  // per peer: 0 in flight, 1 arrived, 2 reported
  MPI_Comm comm_;
  CollectiveInfo info_;
  std::function<void(int)> block_arrived_;
  bool parked_ = false;
};

}  // namespace

std::unique_ptr<detail::PendingTransport> make_block_exchange_transport(std::vector<MPI_Request> sends,
                                                                        std::vector<MPI_Request> recvs, MPI_Comm comm,
                                                                        CollectiveInfo info,
                                                                        std::function<void(int)> block_arrived) {
  return std::make_unique<BlockExchangeTransport>(std::move(sends), std::move(recvs), comm, std::move(info),
                                                  std::move(block_arrived));
}

}  // namespace mlacp::mpi
