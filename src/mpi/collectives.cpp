// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/error.hpp>
#include <mlacp/mpi/collectives.hpp>
#include <mlacp/mpi/communicator.hpp>

#include <climits>
#include <cstddef>
#include <numeric>

namespace mlacp::mpi {

int start_all_to_all(const void* send, void* recv, int count, MPI_Datatype type, MPI_Comm comm, MPI_Request* request) {
  return MPI_Ialltoall(send, count, type, recv, count, type, comm, request);
}

int start_all_gather(const void* send, void* recv, int count, MPI_Datatype type, MPI_Comm comm, MPI_Request* request) {
  return MPI_Iallgather(send, count, type, recv, count, type, comm, request);
}

int start_reduce_scatter_block(const void* send, void* recv, int count, MPI_Datatype type, MPI_Comm comm,
                               MPI_Request* request) {
  return MPI_Ireduce_scatter_block(send, recv, count, type, MPI_SUM, comm, request);
}

int start_exchange_blocks(const void* send, void* recv, int count, MPI_Datatype type, MPI_Comm comm, int* counts,
                          int* displacements, MPI_Request* request) {
  int rank = 0;
  int size = 0;
  int rc = MPI_Comm_rank(comm, &rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm, &size);
  if (rc != MPI_SUCCESS) return rc;
  for (int r = 0; r < size; ++r) {
    counts[r] = r == rank ? 0 : 1;
    displacements[r] = r;
  }
  MPI_Datatype block = MPI_DATATYPE_NULL;
  rc = MPI_Type_contiguous(count, type, &block);
  if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&block);
  if (rc == MPI_SUCCESS)
    rc = MPI_Ialltoallv(send, counts, displacements, block, recv, counts, displacements, block, comm, request);
  if (block != MPI_DATATYPE_NULL) MPI_Type_free(&block);  // freed once the pending exchange no longer needs it
  return rc;
}

int start_send_recv(const void* send, int send_count, int dest, void* recv, int recv_count, int source, int tag,
                    MPI_Datatype type, MPI_Comm comm, MPI_Request requests[2]) {
  requests[0] = MPI_REQUEST_NULL;
  requests[1] = MPI_REQUEST_NULL;
  // The receive first, so that a message to this rank itself (dest == source == rank) finds it posted.
  int rc = MPI_Irecv(recv, recv_count, type, source, tag, comm, &requests[1]);
  if (rc != MPI_SUCCESS) return rc;
  rc = MPI_Isend(send, send_count, type, dest, tag, comm, &requests[0]);
  if (rc != MPI_SUCCESS && requests[1] != MPI_REQUEST_NULL) {
    MPI_Cancel(&requests[1]);
    MPI_Request_free(&requests[1]);
    requests[1] = MPI_REQUEST_NULL;
  }
  return rc;
}

namespace {

// A contiguous datatype of `unit` values of `type`, committed (MPI_DATATYPE_NULL on failure, with `rc` set).
MPI_Datatype contiguous(int unit, MPI_Datatype type, int& rc) {
  MPI_Datatype block = MPI_DATATYPE_NULL;
  rc = MPI_Type_contiguous(unit, type, &block);
  if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&block);
  return block;
}

}  // namespace

BlocksInUnits in_units(const detail::PeerBlocks& blocks, const std::string& what) {
  std::size_t unit = 0;
  for (std::size_t j = 0; j < blocks.counts.size(); ++j)
    unit = std::gcd(std::gcd(unit, blocks.counts[j]), blocks.offsets[j]);
  if (unit == 0) unit = 1;  // every block empty
  BlocksInUnits out;
  auto checked = [&](std::size_t value, const char* name, std::size_t j) {
    if (value <= static_cast<std::size_t>(INT_MAX)) return static_cast<int>(value);
    throw InvalidArgument("mlacp: " + what + ": the " + name + " of block " + std::to_string(j) + " is " +
                          std::to_string(value) + " units of " + std::to_string(unit) +
                          " values; expected at most INT_MAX (" + std::to_string(INT_MAX) + ") for MPI's int counts");
  };
  out.unit = checked(unit, "unit", 0);
  for (std::size_t j = 0; j < blocks.counts.size(); ++j) {
    out.counts.push_back(checked(blocks.counts[j] / unit, "count", j));
    out.displacements.push_back(checked(blocks.offsets[j] / unit, "displacement", j));
  }
  return out;
}

int start_all_to_all_v(const void* send, const BlocksInUnits& send_blocks, void* recv, const BlocksInUnits& recv_blocks,
                       MPI_Datatype type, MPI_Comm comm, MPI_Request* request) {
  int rc = MPI_SUCCESS;
  MPI_Datatype send_type = contiguous(send_blocks.unit, type, rc);
  MPI_Datatype recv_type = MPI_DATATYPE_NULL;
  if (rc == MPI_SUCCESS) recv_type = contiguous(recv_blocks.unit, type, rc);
  if (rc == MPI_SUCCESS)
    rc = MPI_Ialltoallv(send, send_blocks.counts.data(), send_blocks.displacements.data(), send_type, recv,
                        recv_blocks.counts.data(), recv_blocks.displacements.data(), recv_type, comm, request);
  // Freed once the pending exchange no longer needs them.
  if (send_type != MPI_DATATYPE_NULL) MPI_Type_free(&send_type);
  if (recv_type != MPI_DATATYPE_NULL) MPI_Type_free(&recv_type);
  return rc;
}

int block_message_tag() noexcept { return tag_upper_bound(); }

int start_block_messages(const void* send, const BlocksInUnits& send_blocks, void* recv,
                         const BlocksInUnits& recv_blocks, MPI_Datatype type, MPI_Comm comm, MPI_Request* sends,
                         MPI_Request* recvs) {
  int rank = 0;
  int size = 0;
  int rc = MPI_Comm_rank(comm, &rank);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm, &size);
  if (rc != MPI_SUCCESS) return rc;
  for (int r = 0; r < size; ++r) sends[r] = recvs[r] = MPI_REQUEST_NULL;
  MPI_Datatype send_type = contiguous(send_blocks.unit, type, rc);
  MPI_Datatype recv_type = MPI_DATATYPE_NULL;
  if (rc == MPI_SUCCESS) recv_type = contiguous(recv_blocks.unit, type, rc);
  const int tag = block_message_tag();
  const auto extent_of = [](MPI_Datatype t) {
    MPI_Aint lower = 0, extent = 0;
    MPI_Type_get_extent(t, &lower, &extent);
    return extent;
  };
  // The receives first, so that every message finds its receive posted; then the sends, the next rank first, so that
  // the ranks do not all send to rank 0 at once.
  for (int k = 1; rc == MPI_SUCCESS && k < size; ++k) {
    const int i = (rank + size - k) % size;
    const auto at =
        static_cast<char*>(recv) + recv_blocks.displacements[static_cast<std::size_t>(i)] * extent_of(recv_type);
    rc = MPI_Irecv(at, recv_blocks.counts[static_cast<std::size_t>(i)], recv_type, i, tag, comm, &recvs[i]);
  }
  for (int k = 1; rc == MPI_SUCCESS && k < size; ++k) {
    const int j = (rank + k) % size;
    const auto at =
        static_cast<const char*>(send) + send_blocks.displacements[static_cast<std::size_t>(j)] * extent_of(send_type);
    rc = MPI_Isend(at, send_blocks.counts[static_cast<std::size_t>(j)], send_type, j, tag, comm, &sends[j]);
  }
  if (rc != MPI_SUCCESS) {
    for (int r = 0; r < size; ++r) {
      if (recvs[r] != MPI_REQUEST_NULL) {
        MPI_Cancel(&recvs[r]);
        MPI_Request_free(&recvs[r]);
      }
      if (sends[r] != MPI_REQUEST_NULL) MPI_Request_free(&sends[r]);
    }
  }
  // Freed once the pending messages no longer need them.
  if (send_type != MPI_DATATYPE_NULL) MPI_Type_free(&send_type);
  if (recv_type != MPI_DATATYPE_NULL) MPI_Type_free(&recv_type);
  return rc;
}

int start_all_gather_v(const void* send, void* recv, const BlocksInUnits& recv_blocks, MPI_Datatype type, MPI_Comm comm,
                       MPI_Request* request) {
  int rank = 0;
  int rc = MPI_Comm_rank(comm, &rank);
  if (rc != MPI_SUCCESS) return rc;
  MPI_Datatype block = contiguous(recv_blocks.unit, type, rc);
  if (rc == MPI_SUCCESS)
    rc = MPI_Iallgatherv(send, recv_blocks.counts[static_cast<std::size_t>(rank)], block, recv,
                         recv_blocks.counts.data(), recv_blocks.displacements.data(), block, comm, request);
  if (block != MPI_DATATYPE_NULL) MPI_Type_free(&block);
  return rc;
}

int start_reduce_scatter_v(const void* send, void* recv, const int* counts, MPI_Datatype type, MPI_Comm comm,
                           MPI_Request* request) {
  return MPI_Ireduce_scatter(send, recv, counts, type, MPI_SUM, comm, request);
}

}  // namespace mlacp::mpi
