// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/mpi/request_transport.hpp>

#include <utility>

namespace mlacp::mpi {
namespace {

class RequestTransport final : public detail::PendingTransport {
 public:
  RequestTransport(MPI_Request request, std::string name) : request_(request), name_(std::move(name)) {}
  ~RequestTransport() override { complete_noexcept(); }

  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test of '" + name_ + "'");
    return done != 0;
  }

  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait of '" + name_ + "'");
  }

  void progress() noexcept override {
    if (request_ == MPI_REQUEST_NULL || done_) return;
    int done = 0;
    if (MPI_Test(&request_, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) done_ = true;
  }

  void complete_noexcept() noexcept override {
    if (request_ == MPI_REQUEST_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Wait(&request_, MPI_STATUS_IGNORE);
    request_ = MPI_REQUEST_NULL;
  }

 private:
  MPI_Request request_;
  std::string name_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<detail::PendingTransport> make_request_transport(MPI_Request request, std::string name) {
  return std::make_unique<RequestTransport>(request, std::move(name));
}

void check_mpi(int code, const std::string& what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw CommunicationError("mlacp: " + what + " failed: " + std::string(text, static_cast<std::size_t>(length)));
}

}  // namespace mlacp::mpi
