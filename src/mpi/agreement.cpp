// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/event_recorder.hpp>
#include <mlacp/mpi/agreement.hpp>
#include <mlacp/mpi/communicator.hpp>
#include <mlacp/mpi/request_transport.hpp>

namespace mlacp::mpi {

void allreduce_max(MPI_Comm comm, std::vector<std::int64_t>& values, const CollectiveInfo& info,
                   const std::string& what) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_INT64_T, MPI_MAX, comm,
                           &request),
            what);
  events::record(EventKind::launch, info.name);
  check_mpi(wait_watched(&request, comm, info), what);
}

void broadcast(MPI_Comm comm, void* data, int bytes, int root, const CollectiveInfo& info, const std::string& what) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibcast(data, bytes, MPI_BYTE, root, comm, &request), what);
  check_mpi(wait_watched(&request, comm, info), what);
}

std::vector<std::int64_t> allgather(MPI_Comm comm, const std::vector<std::int64_t>& mine, const CollectiveInfo& info,
                                    const std::string& what) {
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(size(comm)));
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, all.data(),
                           static_cast<int>(mine.size()), MPI_INT64_T, comm, &request),
            what);
  events::record(EventKind::launch, info.name);
  check_mpi(wait_watched(&request, comm, info), what);
  return all;
}

}  // namespace mlacp::mpi
