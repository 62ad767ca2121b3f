// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/mpi/request_transport.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>

namespace mlacp::mpi {
namespace {

class RequestTransport final : public detail::PendingTransport {
 public:
  RequestTransport(MPI_Request request, MPI_Comm comm, CollectiveInfo info)
      : request_(request), comm_(comm), info_(std::move(info)) {}
  ~RequestTransport() override { complete_noexcept(); }

  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test of '" + info_.name + "'");
    return done != 0;
  }

  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    if (wait_timeout() > 0) {
      watched_wait();
      return;
    }
    check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait of '" + info_.name + "'");
  }

  void progress() noexcept override {
    if (request_ == MPI_REQUEST_NULL) return;  // MPI_Test sets a completed request to MPI_REQUEST_NULL
    int done = 0;
    MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
  }

  void complete_noexcept() noexcept override {
    if (request_ == MPI_REQUEST_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      if (wait_timeout() > 0)
        watched_wait();
      else
        MPI_Wait(&request_, MPI_STATUS_IGNORE);
    }
    request_ = MPI_REQUEST_NULL;
  }

 private:
  void watched_wait() noexcept { wait_watched(&request_, comm_, info_); }

  MPI_Request request_;
  MPI_Comm comm_;
  CollectiveInfo info_;
};

}  // namespace

int wait_watched(MPI_Request* request, MPI_Comm comm, const CollectiveInfo& info) noexcept {
  const double timeout = wait_timeout();
  if (timeout <= 0) return MPI_Wait(request, MPI_STATUS_IGNORE);
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    int done = 0;
    const int code = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (code != MPI_SUCCESS || done) return code;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout) {
      int rank = 0, size = 0;
      MPI_Comm_rank(comm, &rank);
      MPI_Comm_size(comm, &size);
      const std::string report = detail::watchdog_report(info, rank, size, waited);
      std::fprintf(stderr, "%s", report.c_str());
      std::fflush(stderr);
      MPI_Abort(comm, 3);
      std::abort();  // MPI_Abort does not return; never continue past a failed collective
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::unique_ptr<detail::PendingTransport> make_request_transport(MPI_Request request, MPI_Comm comm,
                                                                 CollectiveInfo info) {
  return std::make_unique<RequestTransport>(request, comm, std::move(info));
}

void check_mpi(int code, const std::string& what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw CommunicationError("mlacp: " + what + " failed: " + std::string(text, static_cast<std::size_t>(length)));
}

}  // namespace mlacp::mpi
