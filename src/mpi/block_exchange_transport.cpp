// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/mpi/block_exchange_transport.hpp>
#include <mlacp/mpi/communicator.hpp>
#include <mlacp/mpi/request_transport.hpp>

#include <exception>
#include <string>
#include <thread>
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
        block_arrived_(std::move(block_arrived)),
        owner_(std::this_thread::get_id()) {}
  ~BlockExchangeTransport() override { complete_noexcept(); }

  bool test() override {
    rethrow_kept();
    bool all = true;
    for (std::size_t i = 0; i < recvs_.size(); ++i) {
      if (recvs_[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      check_mpi(MPI_Test(&recvs_[i], &done, MPI_STATUS_IGNORE), "MPI_Test of '" + info_.name + "'");
      if (done != 0) arrived_[i] = 1;
      all = all && done != 0;
    }
    all = test_requests(sends_, info_) && all;
    report_arrivals();
    return all;
  }

  void wait() override {
    rethrow_kept();
    report_arrivals();
    // The receives in rank order, each block reported as soon as it is in: the sum of a prefix of blocks proceeds
    // while the later ones still travel. A broken mesh leaves the requests active: the handle's destructor parks them.
    int first_error = MPI_SUCCESS;
    for (std::size_t i = 0; i < recvs_.size(); ++i) {
      if (wait_request(recvs_[i], comm_, info_, first_error)) arrived_[i] = 1;
      if (first_error == MPI_SUCCESS) report_arrivals();
    }
    for (auto& request : sends_) wait_request(request, comm_, info_, first_error);
    check_mpi(first_error, "MPI_Wait of '" + info_.name + "'");
  }

  void progress() noexcept override {
    for (std::size_t i = 0; i < recvs_.size(); ++i) {
      if (recvs_[i] == MPI_REQUEST_NULL) continue;  // MPI_Test sets a completed request to MPI_REQUEST_NULL
      int done = 0;
      if (MPI_Test(&recvs_[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done != 0) arrived_[i] = 1;
    }
    progress_requests(sends_);
    if (std::this_thread::get_id() != owner_ || kept_) return;
    try {
      report_arrivals();
    } catch (...) {
      kept_ = std::current_exception();
    }
  }

  void complete_noexcept() noexcept override {
    complete_requests_noexcept(recvs_, comm_, info_, parked_);
    complete_requests_noexcept(sends_, comm_, info_, parked_);
  }

  bool parked() const noexcept override { return parked_; }

 private:
  // Reports every arrived block not reported yet, in rank order (on the owner's thread only: test() and wait() run
  // there, progress() checks).
  void report_arrivals() {
    for (std::size_t i = 0; i < arrived_.size(); ++i) {
      if (arrived_[i] != 1) continue;
      arrived_[i] = 2;
      block_arrived_(static_cast<int>(i));
    }
  }

  void rethrow_kept() {
    if (kept_) std::rethrow_exception(std::exchange(kept_, nullptr));
  }

  std::vector<MPI_Request> sends_;
  std::vector<MPI_Request> recvs_;
  std::vector<char> arrived_;  // per peer: 0 in flight, 1 arrived, 2 reported
  MPI_Comm comm_;
  CollectiveInfo info_;
  std::function<void(int)> block_arrived_;
  std::thread::id owner_;
  std::exception_ptr kept_;
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
