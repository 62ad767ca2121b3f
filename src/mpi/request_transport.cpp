// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/mpi/communicator.hpp>
#include <mlacp/mpi/request_transport.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

namespace mlacp::mpi {
namespace {

// One operation carried by one or more MPI requests (a collective: one; a send/receive pair: two). It completes
// when all of them did; the first MPI error among them is raised once all completed.
class RequestTransport final : public detail::PendingTransport {
 public:
  RequestTransport(std::vector<MPI_Request> requests, MPI_Comm comm, CollectiveInfo info)
      : requests_(std::move(requests)), comm_(comm), info_(std::move(info)) {}
  ~RequestTransport() override { complete_noexcept(); }

  bool test() override { return test_requests(requests_, info_); }

  void wait() override {
    // With the watchdog on or off, MPI's error code reaches the caller. A broken mesh leaves the requests active: the
    // handle's destructor parks them (complete_noexcept).
    int first_error = MPI_SUCCESS;
    for (auto& request : requests_) wait_request(request, comm_, info_, first_error);
    check_mpi(first_error, "MPI_Wait of '" + info_.name + "'");
  }

  void progress() noexcept override { progress_requests(requests_); }

  void complete_noexcept() noexcept override { complete_requests_noexcept(requests_, comm_, info_, parked_); }

  bool parked() const noexcept override { return parked_; }

 private:
  std::vector<MPI_Request> requests_;
  MPI_Comm comm_;
  CollectiveInfo info_;
  bool parked_ = false;
};

}  // namespace

bool test_requests(std::vector<MPI_Request>& requests, const CollectiveInfo& info) {
  bool all = true;
  for (auto& request : requests) {
    if (request == MPI_REQUEST_NULL) continue;
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test of '" + info.name + "'");
    all = all && done != 0;
  }
  return all;
}

void progress_requests(std::vector<MPI_Request>& requests) noexcept {
  for (auto& request : requests) {
    if (request == MPI_REQUEST_NULL) continue;  // MPI_Test sets a completed request to MPI_REQUEST_NULL
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
  }
}

bool wait_request(MPI_Request& request, MPI_Comm comm, const CollectiveInfo& info, int& first_error) {
  if (request == MPI_REQUEST_NULL) return false;
  bool failed = false;
  const int code = wait_watched(&request, comm, info, &failed);
  if (failed) throw_if_failed(comm, "mlacp: wait of '" + info.name + "'");
  if (code != MPI_SUCCESS) {
    if (first_error == MPI_SUCCESS) first_error = code;
    request = MPI_REQUEST_NULL;  // a failed request is complete; MPI may have freed it already
    return false;
  }
  return true;
}

void complete_requests_noexcept(std::vector<MPI_Request>& requests, MPI_Comm comm, const CollectiveInfo& info,
                                bool& parked) noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  for (auto& request : requests) {
    if (request == MPI_REQUEST_NULL) continue;
    if (!finalized && !parked) {
      bool failed = false;
      const int code = wait_watched(&request, comm, info, &failed);
      if (failed) {
        // The mesh is broken: this operation may never complete. The requests are parked here; the handle keeps
        // what they use alive for good (parked()).
        parked = true;
      } else if (code != MPI_SUCCESS) {
        std::fprintf(stderr, "mlacp: completing the unwaited collective '%s' failed\n", info.name.c_str());
      }
    }
    if (parked && request != MPI_REQUEST_NULL) park(request, nullptr);
    request = MPI_REQUEST_NULL;
  }
}

int wait_watched(MPI_Request* request, MPI_Comm comm, const CollectiveInfo& info, bool* mesh_failed) noexcept {
  const double timeout = wait_timeout();
  int code = MPI_SUCCESS;
  if (mesh_failed != nullptr) *mesh_failed = false;
  // The failure channel is looked at after the first test that did not complete and then every 16th poll, so that a
  // collective that completed returns its data (also on a mesh that broke meanwhile) and a short wait costs one look.
  unsigned polls = 0;
  auto poll = [&]() {
    int done = 0;
    code = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    if (code != MPI_SUCCESS || done != 0) return true;
    if (mesh_failed != nullptr && polls++ % 16 == 0 && channels_failed(comm)) {
      *mesh_failed = true;
      return true;
    }
    return false;
  };
  auto expire = [&](double waited) {
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    const std::string report = detail::watchdog_report(info, rank, size, waited);
    std::fprintf(stderr, "%s", report.c_str());
    std::fflush(stderr);
    abort_communicator(comm);
  };
  try {
    detail::watch(poll, timeout, expire);
  } catch (...) {
    std::abort();  // nothing above throws; a wait that cannot report must not continue either
  }
  return code;
}

void wait_or_throw(MPI_Request* request, MPI_Comm comm, const CollectiveInfo& info, const std::string& what,
                   std::shared_ptr<void> keep_alive) {
  bool failed = false;
  const int code = wait_watched(request, comm, info, &failed);
  if (failed) {
    park(*request, std::move(keep_alive));
    *request = MPI_REQUEST_NULL;
    throw_if_failed(comm, what);
  }
  check_mpi(code, what);
}

void abort_communicator(MPI_Comm comm) noexcept {
  MPI_Abort(comm, 3);
  std::abort();  // MPI_Abort does not return; never continue past a failed collective
}

std::unique_ptr<detail::PendingTransport> make_request_transport(MPI_Request request, MPI_Comm comm,
                                                                 CollectiveInfo info) {
  return std::make_unique<RequestTransport>(std::vector<MPI_Request>{request}, comm, std::move(info));
}

std::unique_ptr<detail::PendingTransport> make_request_pair_transport(MPI_Request send, MPI_Request recv, MPI_Comm comm,
                                                                      CollectiveInfo info) {
  return std::make_unique<RequestTransport>(std::vector<MPI_Request>{send, recv}, comm, std::move(info));
}

void check_mpi(int code, const std::string& what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw CommunicationError("mlacp: " + what + " failed: " + std::string(text, static_cast<std::size_t>(length)));
}

}  // namespace mlacp::mpi
