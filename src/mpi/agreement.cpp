// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/event_recorder.hpp>
#include <mlacp/mpi/agreement.hpp>
#include <mlacp/mpi/communicator.hpp>
#include <mlacp/mpi/request_transport.hpp>

#include <cstring>
#include <memory>

namespace mlacp::mpi {

// Each agreement raises at once on a broken mesh (a rank reported a failure), and its wait looks at the failure
// channel: "the next agreement carries the failure". The buffers live on the heap, so that a wait abandoned on a
// broken mesh can park them with the request (wait_or_throw).

namespace {

// The watched MPI_Iallreduce(MAX) of both element types.
template <class T>
void watched_allreduce_max(MPI_Comm comm, std::vector<T>& values, MPI_Datatype type, const CollectiveInfo& info,
                           const std::string& what) {
  throw_if_failed(comm, what);
  auto buffer = std::make_shared<std::vector<T>>(values);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(
      MPI_Iallreduce(MPI_IN_PLACE, buffer->data(), static_cast<int>(buffer->size()), type, MPI_MAX, comm, &request),
      what);
  events::record(EventKind::launch, info.name);
  wait_or_throw(&request, comm, info, what, buffer);
  values = *buffer;
}

}  // namespace

void allreduce_max(MPI_Comm comm, std::vector<std::int64_t>& values, const CollectiveInfo& info,
                   const std::string& what) {
  watched_allreduce_max(comm, values, MPI_INT64_T, info, what);
}

void allreduce_max(MPI_Comm comm, std::vector<double>& values, const CollectiveInfo& info, const std::string& what) {
  watched_allreduce_max(comm, values, MPI_DOUBLE, info, what);
}

void broadcast(MPI_Comm comm, void* data, int bytes, int root, const CollectiveInfo& info, const std::string& what) {
  throw_if_failed(comm, what);
  auto buffer =
      std::make_shared<std::vector<char>>(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibcast(buffer->data(), bytes, MPI_BYTE, root, comm, &request), what);
  wait_or_throw(&request, comm, info, what, buffer);
  std::memcpy(data, buffer->data(), static_cast<std::size_t>(bytes));
}

std::vector<std::int64_t> allgather(MPI_Comm comm, const std::vector<std::int64_t>& mine, const CollectiveInfo& info,
                                    const std::string& what) {
  throw_if_failed(comm, what);
  auto send = std::make_shared<std::vector<std::int64_t>>(mine);
  auto all = std::make_shared<std::vector<std::int64_t>>(mine.size() * static_cast<std::size_t>(size(comm)));
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(send->data(), static_cast<int>(send->size()), MPI_INT64_T, all->data(),
                           static_cast<int>(send->size()), MPI_INT64_T, comm, &request),
            what);
  events::record(EventKind::launch, info.name);
  wait_or_throw(&request, comm, info, what, std::make_shared<std::pair<decltype(send), decltype(all)>>(send, all));
  return *all;
}

std::vector<std::int64_t> gather_integers(MPI_Comm comm, const std::vector<std::int64_t>& mine, const std::string& name,
                                          const std::string& where) {
  if (size(comm) == 1) return mine;
  CollectiveInfo info;
  info.name = name;
  info.operation = "MPI_Iallgather of " + std::to_string(mine.size()) + " integers per rank for " + where;
  info.bytes = static_cast<std::int64_t>(mine.size() * sizeof(std::int64_t));
  return allgather(comm, mine, info, where + ": MPI_Iallgather of '" + name + "'");
}

}  // namespace mlacp::mpi
