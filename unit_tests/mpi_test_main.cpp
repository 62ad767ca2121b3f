// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The GoogleTest main of every mlacp MPI test binary:
// - initialises MPI (asking for MPI_THREAD_MULTIPLE and recording what was provided) and Kokkos;
// - prints GoogleTest's output on rank 0 only, and failures on every rank, prefixed with the rank;
// - makes a failure on any rank fail the test on every rank (the result is reduced at the end of each test).
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <Kokkos_Core.hpp>
#include <mlacp/version.hpp>

#include <iostream>
#include <sstream>
#include <string>

namespace mlacp::test {
namespace {

// -1 until main records what MPI_Init_thread provided (no MPI thread level is negative).
int g_thread_level_provided = -1;

// Runs first at the end of each test (GoogleTest calls OnTestEnd listeners in reverse order of registration, so this
// one, appended after the default printer, runs before the printer reports the result) while the test is still
// current, so a failure added here belongs to the test.
class CrossRankResultListener : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& info) override { report_failures_of_other_ranks(info.result()->Failed()); }
};

// On ranks other than 0, which do not print GoogleTest's progress: prints each failure with the rank, so that a
// failure seen on one rank only is not lost.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // (The test's name is taken here: UnitTest::current_test_info() must not be called from OnTestPartResult, which runs
  // under the lock that it takes.)
  void OnTestStart(const ::testing::TestInfo& info) override {
    test_ = std::string(info.test_suite_name()) + '.' + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::ostringstream message;
    message << "[rank " << rank_ << "] " << test_ << ": " << (result.file_name() ? result.file_name() : "?") << ':'
            << result.line_number() << ": failure\n"
            << result.message() << '\n';
    std::cerr << message.str() << std::flush;
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

int thread_level_provided() { return g_thread_level_provided; }

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

std::vector<int> ranks_that_failed(bool this_rank_failed) {
  const int size = world_size();
  std::vector<int> local(static_cast<std::size_t>(size), 0);
  std::vector<int> global(static_cast<std::size_t>(size), 0);
  local[static_cast<std::size_t>(world_rank())] = this_rank_failed ? 1 : 0;
  MPI_Allreduce(local.data(), global.data(), size, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  std::vector<int> failed;
  for (int r = 0; r < size; ++r)
    if (global[static_cast<std::size_t>(r)] != 0) failed.push_back(r);
  return failed;
}

void report_failures_of_other_ranks(bool this_rank_failed) {
  const std::vector<int> failed = ranks_that_failed(this_rank_failed);
  if (this_rank_failed || failed.empty()) return;
  std::ostringstream ranks;
  for (std::size_t i = 0; i < failed.size(); ++i) ranks << (i ? ", " : "") << failed[i];
  ADD_FAILURE() << "the test failed on rank(s) " << ranks.str() << " of " << world_size()
                << " (this rank passed; rerun with --gtest_filter to see their output)";
}

}  // namespace mlacp::test

int main(int argc, char** argv) {
  int provided = -1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  mlacp::test::g_thread_level_provided = provided;
  int exit_code = 1;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    const int rank = mlacp::test::world_rank();
    if (rank != 0) {
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new mlacp::test::RankFailurePrinter(rank));
    }
    listeners.Append(new mlacp::test::CrossRankResultListener);
    if (rank == 0) {
      mlacp::print_configuration(std::cout);
      std::cout << "  MPI ranks: " << mlacp::test::world_size() << ", thread level provided: " << provided
                << " (asked for MPI_THREAD_MULTIPLE = " << MPI_THREAD_MULTIPLE << ")\n";
    }
    const int local_result = RUN_ALL_TESTS();
    // Every rank ends with the same exit code: non-zero if any rank failed anything.
    MPI_Allreduce(&local_result, &exit_code, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  }
  MPI_Finalize();
  return exit_code;
}
