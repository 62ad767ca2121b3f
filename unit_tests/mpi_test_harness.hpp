// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// What mpi_test_main.cpp offers to tests.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
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

/// Runs `f`, expects an exception of type Exception whose message contains `part`, then meets the other ranks at a
/// barrier over MPI_COMM_WORLD: every rank got there, so nothing hung and nothing was left half-done.
template <class Exception, class F>
void expect_error(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one containing '" << part << "'";
  } catch (const Exception& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace mlacp::test
