// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/mpi/block_exchange_transport.hpp>
#include <mlacp/mpi/communicator.hpp>
#include <mlacp/mpi/request_transport.hpp>

#include <cstdio>
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
    all = test_sends() && all;
    report_arrivals();
    return all;
  }

  void wait() override {
    rethrow_kept();
    report_arrivals();
    // The receives in rank order, each block reported as soon as it is in: the sum of a prefix of blocks proceeds
    // while the later ones still travel. A broken mesh leaves the requests active: the handle's destructor parks them.
    int first_error = MPI_SUCCESS;
    const auto wait_one = [&](MPI_Request& request) {
      if (request == MPI_REQUEST_NULL) return false;
      bool failed = false;
      const int code = wait_watched(&request, comm_, info_, &failed);
      if (failed) throw_if_failed(comm_, "mlacp: wait of '" + info_.name + "'");
      if (code != MPI_SUCCESS) {
        if (first_error == MPI_SUCCESS) first_error = code;
        request = MPI_REQUEST_NULL;  // a failed request is complete; MPI may have freed it already
        return false;
      }
      return true;
    };
    for (std::size_t i = 0; i < recvs_.size(); ++i) {
      if (wait_one(recvs_[i])) arrived_[i] = 1;
      if (first_error == MPI_SUCCESS) report_arrivals();
    }
    for (auto& request : sends_) wait_one(request);
    check_mpi(first_error, "MPI_Wait of '" + info_.name + "'");
  }

  void progress() noexcept override {
    for (std::size_t i = 0; i < recvs_.size(); ++i) {
      if (recvs_[i] == MPI_REQUEST_NULL) continue;  // MPI_Test sets a completed request to MPI_REQUEST_NULL
      int done = 0;
      if (MPI_Test(&recvs_[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done != 0) arrived_[i] = 1;
    }
    for (auto& request : sends_) {
      if (request == MPI_REQUEST_NULL) continue;
      int done = 0;
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    }
    if (std::this_thread::get_id() != owner_ || kept_) return;
    try {
      report_arrivals();
    } catch (...) {
      kept_ = std::current_exception();
    }
  }

  void complete_noexcept() noexcept override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    for (auto* requests : {&recvs_, &sends_}) {
      for (auto& request : *requests) {
        if (request == MPI_REQUEST_NULL) continue;
        if (!finalized && !parked_) {
          bool failed = false;
          const int code = wait_watched(&request, comm_, info_, &failed);
          if (failed) {
            // The mesh is broken: this exchange may never complete. Its requests are parked here; the handle keeps
            // what they use alive for good (parked()).
            parked_ = true;
          } else if (code != MPI_SUCCESS) {
            std::fprintf(stderr, "mlacp: completing the unwaited collective '%s' failed\n", info_.name.c_str());
          }
        }
        if (parked_ && request != MPI_REQUEST_NULL) park(request, nullptr);
        request = MPI_REQUEST_NULL;
      }
    }
  }

  bool parked() const noexcept override { return parked_; }

 private:
  bool test_sends() {
    bool all = true;
    for (auto& request : sends_) {
      if (request == MPI_REQUEST_NULL) continue;
      int done = 0;
      check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test of '" + info_.name + "'");
      all = all && done != 0;
    }
    return all;
  }

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
