// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/mpi/communicator.hpp>

namespace mlacp::mpi {

bool initialized() noexcept {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

bool finalized() noexcept {
  int flag = 0;
  MPI_Finalized(&flag);
  return flag != 0;
}

bool is_intercommunicator(MPI_Comm comm) {
  int flag = 0;
  MPI_Comm_test_inter(comm, &flag);
  return flag != 0;
}

MPI_Comm duplicate(MPI_Comm comm) {
  MPI_Comm copy = MPI_COMM_NULL;
  if (MPI_Comm_dup(comm, &copy) != MPI_SUCCESS) throw CommunicationError("mlacp::Mesh: MPI_Comm_dup failed");
  return copy;
}

void free_communicator(MPI_Comm& comm) noexcept {
  if (comm != MPI_COMM_NULL && !finalized()) MPI_Comm_free(&comm);
  comm = MPI_COMM_NULL;
}

int rank(MPI_Comm comm) {
  int r = 0;
  MPI_Comm_rank(comm, &r);
  return r;
}

int size(MPI_Comm comm) {
  int s = 0;
  MPI_Comm_size(comm, &s);
  return s;
}

std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string version(text, static_cast<std::size_t>(length));
  if (const auto newline = version.find('\n'); newline != std::string::npos) version.resize(newline);
  return version;
}

}  // namespace mlacp::mpi
