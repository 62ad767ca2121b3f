// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
#include <mlacp/mpi/collectives.hpp>

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

}  // namespace mlacp::mpi
