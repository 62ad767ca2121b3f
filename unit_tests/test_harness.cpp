// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of the MPI test harness itself.
#include "mpi_test_harness.hpp"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

namespace {

// Fails only on the last rank, as a test body would, and then runs the harness' end-of-test reduction on that
// result. (A function, because EXPECT_NONFATAL_FAILURE's statement may not use local variables.)
void fail_on_last_rank_then_reduce() {
  const bool fail_here = mlacp::test::world_rank() == mlacp::test::world_size() - 1;
  if (fail_here) ADD_FAILURE() << "deliberate failure on the last rank";
  mlacp::test::report_failures_of_other_ranks(fail_here);
}

TEST(Harness, FailureOnOneRankFailsTheTestOnEveryRank) {
  // Each rank sees exactly one failure: its own on the last rank, the reported one everywhere else.
  if (mlacp::test::world_rank() == mlacp::test::world_size() - 1) {
    EXPECT_NONFATAL_FAILURE(fail_on_last_rank_then_reduce(), "deliberate failure on the last rank");
  } else {
    EXPECT_NONFATAL_FAILURE(fail_on_last_rank_then_reduce(), "the test failed on rank(s)");
  }
}

TEST(Harness, RanksThatFailedListsExactlyTheFailingRanks) {
  const int rank = mlacp::test::world_rank();
  const int size = mlacp::test::world_size();
  const std::vector<int> odd = mlacp::test::ranks_that_failed(rank % 2 == 1);
  std::vector<int> expected;
  for (int r = 1; r < size; r += 2) expected.push_back(r);
  EXPECT_EQ(odd, expected);
  EXPECT_TRUE(mlacp::test::ranks_that_failed(false).empty());
}

TEST(Harness, EveryRankSeesTheSameCommunicatorSize) {
  const int size = mlacp::test::world_size();
  int min_size = 0;
  int max_size = 0;
  MPI_Allreduce(&size, &min_size, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&size, &max_size, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(min_size, size);
  EXPECT_EQ(max_size, size);
  int ranks_counted = 0;
  const int one = 1;
  MPI_Allreduce(&one, &ranks_counted, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(ranks_counted, size);
}

TEST(Harness, ThreadLevelIsRecorded) {
  const int provided = mlacp::test::thread_level_provided();
  int queried = MPI_THREAD_SINGLE;
  MPI_Query_thread(&queried);
  EXPECT_EQ(provided, queried);
  // One of the four levels MPI defines (the harness starts from -1, so a main that never recorded it fails here).
  EXPECT_TRUE(provided == MPI_THREAD_SINGLE || provided == MPI_THREAD_FUNNELED || provided == MPI_THREAD_SERIALIZED ||
              provided == MPI_THREAD_MULTIPLE)
      << provided;
}

}  // namespace

namespace {

// Run only by the ctest "harness_reports_remote_failure" (it is disabled otherwise): fails on the last rank alone,
// and the ctest checks that rank 0, which passed locally, prints the test as failed.
TEST(Harness, DISABLED_DeliberatelyFailsOnLastRank) {
  EXPECT_NE(mlacp::test::world_rank(), mlacp::test::world_size() - 1) << "deliberate failure on the last rank";
}

}  // namespace
