// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The machinery under the collectives: the handle against the progress registry, the MPI request's wait, the event
// recorder when off, and the communication buffer pool (ordering of reuse, bounded size).
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/detail/buffer_pool.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mpi/request_transport.hpp>
#include <mlacp/watchdog.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

// A transport that records whether two of its calls ever ran at the same time (each stays inside for a while).
class OverlapProbe final : public mlacp::detail::PendingTransport {
 public:
  std::atomic<bool> overlapped{false};
  std::atomic<int> calls{0};

  bool test() override {
    enter();
    return false;
  }
  void wait() override {}
  void complete_noexcept() noexcept override {}
  void progress() noexcept override { enter(); }

 private:
  void enter() noexcept {
    if (inside_.fetch_add(1) != 0) overlapped = true;
    calls.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    inside_.fetch_sub(1);
  }
  std::atomic<int> inside_{0};
};

// A progress thread (the opt-in experiment of perf-overlap) and the owner's test() must never touch one request at
// the same time: MPI_Test on one request from two threads at once is erroneous.
TEST(HandleAndProgress, TestNeverRunsConcurrentlyWithProgress) {
  auto owned = std::make_unique<OverlapProbe>();
  OverlapProbe* probe = owned.get();
  mlacp::AsyncCollective<Kokkos::View<double***, Kokkos::LayoutRight>> handle("probe", std::move(owned), {}, {});
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    while (!stop) mlacp::progress();
  });
  for (int i = 0; i < 300; ++i) handle.test();
  stop = true;
  poller.join();
  handle.wait();
  EXPECT_GT(probe->calls.load(), 300);
  EXPECT_FALSE(probe->overlapped.load()) << "test() ran while progress() was inside the same transport";
}

// A request that completes with an error (a generalized request whose query reports MPI_ERR_OTHER, as a failed
// transfer would): wait() must raise it, with the watchdog on or off.
int failing_query(void*, MPI_Status* status) {
  MPI_Status_set_elements(status, MPI_BYTE, 0);
  MPI_Status_set_cancelled(status, 0);
  status->MPI_SOURCE = MPI_UNDEFINED;
  status->MPI_TAG = MPI_UNDEFINED;
  status->MPI_ERROR = MPI_ERR_OTHER;
  return MPI_ERR_OTHER;
}
int free_nothing(void*) { return MPI_SUCCESS; }
int cancel_nothing(void*, int) { return MPI_SUCCESS; }

void expect_wait_reports_the_error(double timeout) {
  const double before = mlacp::wait_timeout();
  mlacp::set_wait_timeout(timeout);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Grequest_start(failing_query, free_nothing, cancel_nothing, nullptr, &request);
  MPI_Grequest_complete(request);
  mlacp::CollectiveInfo info;
  info.name = "failed transfer";
  auto transport = mlacp::mpi::make_request_transport(request, MPI_COMM_SELF, info);
  try {
    transport->wait();
    ADD_FAILURE() << "wait() of a failed request returned normally (timeout " << timeout << " s)";
  } catch (const mlacp::CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("MPI_Wait of 'failed transfer' failed"), std::string::npos) << e.what();
  }
  transport.reset();
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_ARE_FATAL);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  mlacp::set_wait_timeout(before);
}

TEST(RequestTransport, WaitReportsMpisErrorWithOrWithoutTheWatchdog) {
  expect_wait_reports_the_error(0);
  expect_wait_reports_the_error(5);
}

// Off means off: with recording and the watchdog off, a launch and wait leave nothing behind (the recorder returned
// after one atomic load); with the watchdog armed, the launches and waits its report lists are kept.
TEST(EventRecorder, OffKeepsNothingAndTheWatchdogKeepsTheRecentCollectives) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const double before = mlacp::wait_timeout();
  const bool recording = mlacp::events::enabled();
  mlacp::events::enable(false);
  mlacp::set_wait_timeout(0);
  mlacp::events::clear();
  Kokkos::View<double****, Kokkos::LayoutRight, Mem> x("x", 1, 2, 2 * mesh.size(), 3);
  mlacp::launch_all_to_all(Space(), x, 1, 2, mesh, "unrecorded").wait();
  mlacp::events::record(mlacp::EventKind::launch, "unrecorded");
  EXPECT_TRUE(mlacp::events::recent().empty());
  EXPECT_TRUE(mlacp::events::snapshot().empty());
  mlacp::set_wait_timeout(30);
  mlacp::launch_all_to_all(Space(), x, 1, 2, mesh, "watched").wait();
  const auto recent = mlacp::events::recent();
  EXPECT_TRUE(std::any_of(recent.begin(), recent.end(),
                          [](const auto& e) { return e.kind == mlacp::EventKind::wait_end && e.name == "watched"; }));
  EXPECT_TRUE(mlacp::events::snapshot().empty()) << "recording is still off";
  mlacp::set_wait_timeout(before);
  mlacp::events::enable(recording);
}

// Reuse is ordered by the instance that last used the buffer: a launch on the same device stream reuses it in stream
// order; any other instance fences the last user first.
TEST(BufferPool, ReuseFencesTheLastUserUnlessItIsTheSameStream) {
  auto& pool = mlacp::detail::BufferPool<Kokkos::HostSpace>::instance();
  // The pool keeps the users after this test (it fences them when it trims): counters and streams outlive it.
  static int stream_a = 0;
  static int stream_b = 0;
  auto fences_a = std::make_shared<int>(0);
  auto fences_b = std::make_shared<int>(0);
  const mlacp::detail::BufferUser a{&stream_a, [fences_a] { ++*fences_a; }};
  const mlacp::detail::BufferUser b{&stream_b, [fences_b] { ++*fences_b; }};
  const std::size_t bytes = 12345;  // a size no collective here uses
  pool.acquire(bytes, "order", a);
  pool.acquire(bytes, "order", a);
  EXPECT_EQ(*fences_a, 0) << "the same stream reuses in stream order";
  pool.acquire(bytes, "order", b);
  EXPECT_EQ(*fences_a, 1) << "another instance fences the last user first";
  EXPECT_EQ(*fences_b, 0);
  // Held buffers are never handed out twice.
  auto held = pool.acquire(bytes, "order", b);
  auto second = pool.acquire(bytes, "order", b);
  EXPECT_NE(held.data(), second.data());
}

// A training loop whose shapes vary (S changes each step) must not grow the pool without bound: buffers idle for
// trim_after() launches go back to Kokkos.
TEST(BufferPool, VaryingShapesKeepThePoolBounded) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  if (mesh.size() == 1) GTEST_SKIP() << "P = 1 sends nothing and uses no buffer";
  auto& pool = mlacp::detail::BufferPool<Mem>::instance();
  const auto trim_after = pool.trim_after();
  pool.set_trim_after(8);
  const int P = mesh.size();
  const int steps = 120;
  std::size_t largest_step = 0;  // bytes of the buffers one step acquires, at the largest S
  std::size_t held = 0;
  for (int step = 0; step < steps; ++step) {
    const int s = 1 + step;  // every step a new sequence length, as with variable-length batches
    Kokkos::View<double****, Kokkos::LayoutRight, Mem> x("x", 2, s, 2 * P, 4);
    mlacp::launch_all_to_all(Space(), x, 1, 2, mesh, "varying").wait();  // packs and unpacks: two pooled buffers
    largest_step = std::max(largest_step, 2 * x.size() * sizeof(double));
    held = std::max(held, pool.bytes());
  }
  pool.set_trim_after(trim_after);
  // Without trimming the pool holds one send and one receive buffer of every S: about steps / 2 times largest_step.
  EXPECT_LE(held, 12 * largest_step) << "the pool grew with the number of distinct shapes";
}

}  // namespace
