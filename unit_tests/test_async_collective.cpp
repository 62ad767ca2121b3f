// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// AsyncCollective (include/mlacp/async_collective.hpp): the handle of a launched collective: wait, test, lifetimes,
// progress, timeouts.
#include "collective_test_helpers.hpp"

namespace {

using namespace mlacp::test::collectives;

template <class T>
class Collectives : public ::testing::Test {};
TYPED_TEST_SUITE(Collectives, ValueTypes);

TYPED_TEST(Collectives, HandleKeepsAnInputItSendsWithoutPackAlive) {
  using T = TypeParam;
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const Extents e{1, 4 * p, 2 * p, 3};  // batch 1: the token blocks of the input are contiguous, sent as they are
  const auto values = local_values<T>(e, mesh.rank());
  const auto space = Kokkos::DefaultExecutionSpace();
  auto x = make_view<T, 4>(e, values);
  auto expected_a2a = to_host(mlacp::launch_all_to_all(space, make_view<T, 4>(e, values), 2, 1, mesh).wait());
  auto expected_rs = to_host(mlacp::launch_reduce_scatter(space, make_view<T, 4>(e, values), 1, mesh).wait());
  auto a2a = mlacp::launch_all_to_all(space, x, 2, 1, mesh, "a2a of a dropped input");
  auto rs = mlacp::launch_reduce_scatter(space, x, 1, mesh, "reduce-scatter of a dropped input");
  x = decltype(x)();  // the caller's reference is gone; the handles hold the allocation until wait()
  EXPECT_EQ(to_host(a2a.wait()), expected_a2a);
  EXPECT_EQ(to_host(rs.wait()), expected_rs);
}

TEST(CollectiveHandle, SecondWaitThrowsAndEmptyHandleRefuses) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  Kokkos::View<double****, Kokkos::LayoutRight> x("x", 1, 2, 2 * p, 3);
  auto handle = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh, "dO a2a");
  EXPECT_TRUE(handle.pending());
  handle.wait();
  EXPECT_TRUE(handle.waited());
  try {
    handle.wait();
    ADD_FAILURE() << "a second wait() did not throw";
  } catch (const mlacp::UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "mlacp: collective 'dO a2a' cannot be waited twice");
  }
  auto moved = std::move(handle);
  EXPECT_FALSE(handle.launched());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_THROW(handle.wait(), mlacp::UsageError);
  mlacp::AsyncCollective<Kokkos::View<double****, Kokkos::LayoutRight>> empty;
  EXPECT_THROW(empty.test(), mlacp::UsageError);
}

TEST(CollectiveHandle, UnwaitedHandleIsCompletedAndReported) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  Kokkos::View<float****, Kokkos::LayoutRight> x("x", 1, 2, 2 * p, 3);
  const auto before = mlacp::diagnostics::unwaited_handles();
  ::testing::internal::CaptureStderr();
  { auto dropped = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh, "forgotten"); }
  // Assigning over a pending handle completes and reports it too.
  auto reused = mlacp::launch_all_gather(Kokkos::DefaultExecutionSpace(), x, 1, mesh, "overwritten");
  reused = mlacp::launch_all_gather(Kokkos::DefaultExecutionSpace(), x, 1, mesh, "second");
  reused.wait();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(mlacp::diagnostics::unwaited_handles(), before + 2);
  EXPECT_NE(err.find("collective 'forgotten' was launched but never waited"), std::string::npos) << err;
  EXPECT_NE(err.find("collective 'overwritten' was launched but never waited"), std::string::npos) << err;
  // The communicator is still usable: nothing is left in flight.
  auto after = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh).wait();
  EXPECT_EQ(after.extent(1), 2u * static_cast<unsigned>(p));
}

TEST(CollectiveHandle, WaitTimeoutSetting) {
  const double before = mlacp::wait_timeout();
  mlacp::set_wait_timeout(2.5);
  EXPECT_EQ(mlacp::wait_timeout(), 2.5);
  // With the watchdog armed, a healthy wait completes as usual.
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  Kokkos::View<double****, Kokkos::LayoutRight> x("x", 1, 2, 2 * p, 3);
  EXPECT_EQ(mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh).wait().extent(1),
            2u * static_cast<unsigned>(p));
  mlacp::set_wait_timeout(-1);
  EXPECT_EQ(mlacp::wait_timeout(), 0.0);
  mlacp::set_wait_timeout(before);
}

TEST(CollectiveHandle, PendingCollectivesAreRegisteredForProgressUntilWaited) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  Kokkos::View<double****, Kokkos::LayoutRight> x("x", 2, 8, 2 * p, 4);
  ASSERT_EQ(mlacp::pending_collectives(), 0u);
  auto a = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh);
  auto b = mlacp::launch_all_gather(Kokkos::DefaultExecutionSpace(), x, 1, mesh);
  // With P == 1 nothing is sent, so nothing is pending.
  EXPECT_EQ(mlacp::pending_collectives(), p == 1 ? 0u : 2u);
  const auto calls = mlacp::progress_calls();
  mlacp::progress();
  EXPECT_EQ(mlacp::progress_calls(), calls + (p == 1 ? 0u : 1u));
  a.wait();
  EXPECT_EQ(mlacp::pending_collectives(), p == 1 ? 0u : 1u);
  b.wait();
  EXPECT_EQ(mlacp::pending_collectives(), 0u);
}

TEST(CollectiveHandle, AllToAllCompletesWhileTheCallerOnlyComputesAndPollsTest) {
  const int p = mlacp::test::world_size();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  Kokkos::View<double****, Kokkos::LayoutRight> x("x", 2, 64, 4 * p, 16);
  Kokkos::deep_copy(x, 1.0);
  auto handle = mlacp::launch_all_to_all(Kokkos::DefaultExecutionSpace(), x, 1, 2, mesh, "polled");
  const auto start = std::chrono::steady_clock::now();
  volatile double work = 0;  // the compute's result is kept (volatile), not asserted on
  int polls = 0;
  bool done = false;
  while (!done && std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
    for (int i = 0; i < 1000; ++i) work = work + std::sqrt(static_cast<double>(i + polls));  // the caller's compute
    ++polls;
    done = handle.test();
  }
  EXPECT_TRUE(done) << "the all-to-all did not complete within 30 s of polling test() (" << polls << " polls)";
  EXPECT_FALSE(handle.waited());
  auto result = handle.wait();
  const auto values = to_host(result);
  EXPECT_EQ(std::accumulate(values.begin(), values.end(), 0.0), static_cast<double>(values.size()));
}

}  // namespace
