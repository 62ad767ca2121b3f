// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What mpi_test_main.cpp offers to tests.
#pragma once

#include <vector>

namespace mlacp::test {

/// The thread level MPI_Init_thread provided (MPI_THREAD_MULTIPLE was asked for).
int thread_level_provided();
int world_rank();
int world_size();

/// Collective over MPI_COMM_WORLD: the ranks, in order, whose `this_rank_failed` was true.
std::vector<int> ranks_that_failed(bool this_rank_failed);

/// Collective over MPI_COMM_WORLD: adds a non-fatal GoogleTest failure on every rank that passed when any other rank
/// failed. The harness calls it at the end of every test with the test's own result.
void report_failures_of_other_ranks(bool this_rank_failed);

}  // namespace mlacp::test
