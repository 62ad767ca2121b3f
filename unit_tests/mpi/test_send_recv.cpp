// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// launch_send_recv (include/mlacp/send_recv.hpp): the ring steps of ring attention as move-only handles. Ring shifts
// in both directions with uneven counts, every value type, rank-1 and rank-3 Views, host staging, two exchanges in
// flight between the same peers (tags), what the handle shares with the collectives (events, bytes, progress, wait
// once, completion at destruction) and the errors.
#include "../collective_test_helpers.hpp"

#include <mlacp/collective_bytes.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/send_recv.hpp>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace mlacp::test::collectives;
using Space = Kokkos::DefaultExecutionSpace;

template <class T>
Kokkos::View<T*> vector_of(const std::vector<T>& values, const std::string& label = "v") {
  Kokkos::View<T*> v(label, values.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i) h(i) = values[i];
  Kokkos::deep_copy(v, h);
  return v;
}

int next(int me, int step, int p) { return ((me + step) % p + p) % p; }

// What rank r sends in the ring tests: r + 1 rows of [2, 3] values.
Extents rows_of(int r) { return {r + 1, 2, 3}; }

template <class T>
class SendRecv : public ::testing::Test {};
using SendRecvTypes = ::testing::Types<float, double, mlacp::bf16>;
TYPED_TEST_SUITE(SendRecv, SendRecvTypes);

TYPED_TEST(SendRecv, RingShiftsBothWaysWithUnevenCountsRank3) {
  using T = TypeParam;
  const int p = mlacp::test::world_size();
  const int me = mlacp::test::world_rank();
  mlacp::Mesh direct(MPI_COMM_WORLD);
  mlacp::Mesh staged(MPI_COMM_WORLD);
  staged.set_host_staging(true);
  for (const mlacp::Mesh* mesh : {&direct, &staged}) {
    for (int step : {1, -1}) {
      const int dest = next(me, step, p);
      const int source = next(me, -step, p);
      auto send = make_view<T, 3>(rows_of(me), local_values<T>(rows_of(me), me));
      auto recv = make_view<T, 3>(rows_of(source), std::vector<T>(static_cast<std::size_t>(product(rows_of(source)))));
      auto handle = mlacp::launch_send_recv(Space(), send, dest, recv, source, *mesh, "ring", 7);
      auto got = handle.wait();
      EXPECT_EQ(got.data(), recv.data()) << "wait() returns the receive View";
      EXPECT_EQ(exact(to_host(got)), exact(local_values<T>(rows_of(source), source)))
          << "step " << step << (mesh->host_staging() ? " staged" : " direct");
    }
  }
}

TYPED_TEST(SendRecv, Rank1ReceiveLongerThanItsMessageKeepsItsTail) {
  using T = TypeParam;
  const int p = mlacp::test::world_size();
  const int me = mlacp::test::world_rank();
  mlacp::Mesh direct(MPI_COMM_WORLD);
  mlacp::Mesh staged(MPI_COMM_WORLD);
  staged.set_host_staging(true);
  for (const mlacp::Mesh* mesh : {&direct, &staged}) {
    const int dest = next(me, 1, p);
    const int source = next(me, -1, p);
    const auto message = [](int r) { return local_values<T>({5 * (r + 1)}, r); };
    auto send = vector_of(message(me), "send");
    std::vector<T> initial(40, T(-1));
    auto recv = vector_of(initial, "recv");
    auto got = mlacp::launch_send_recv(Space(), send, dest, recv, source, *mesh).wait();
    std::vector<T> expected = message(source);
    expected.resize(initial.size(), T(-1));
    EXPECT_EQ(exact(to_host(got)), exact(expected)) << (mesh->host_staging() ? "staged" : "direct");
  }
}

// The ring's forward chunk and its gradient accumulator: two exchanges between the same peers in flight at once,
// told apart by their tags whatever order each rank launches them in (and waits them in).
TYPED_TEST(SendRecv, TwoConcurrentExchangesMatchByTagInEitherLaunchOrder) {
  using T = TypeParam;
  const int p = mlacp::test::world_size();
  const int me = mlacp::test::world_rank();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int dest = next(me, 1, p);
  const int source = next(me, -1, p);
  // Different sizes too, so that a mismatch would also truncate.
  const auto chunk = [](int r) { return local_values<T>({4 + r}, r); };
  const auto grad = [](int r) { return local_values<T>({9 + 2 * r}, r + 17); };
  for (int round = 0; round < 2; ++round) {
    auto chunk_send = vector_of(chunk(me));
    auto grad_send = vector_of(grad(me));
    auto chunk_recv = vector_of(std::vector<T>(chunk(source).size()));
    auto grad_recv = vector_of(std::vector<T>(grad(source).size()));
    const bool chunk_first = (me + round) % 2 == 0;  // neighbours launch in opposite orders
    mlacp::AsyncCollective<Kokkos::View<T*>> a, b;
    if (chunk_first) {
      a = mlacp::launch_send_recv(Space(), chunk_send, dest, chunk_recv, source, mesh, "kv chunk", 1);
      b = mlacp::launch_send_recv(Space(), grad_send, dest, grad_recv, source, mesh, "dkv", 2);
    } else {
      b = mlacp::launch_send_recv(Space(), grad_send, dest, grad_recv, source, mesh, "dkv", 2);
      a = mlacp::launch_send_recv(Space(), chunk_send, dest, chunk_recv, source, mesh, "kv chunk", 1);
    }
    // Waited in the other order than launched.
    auto first = chunk_first ? b.wait() : a.wait();
    auto second = chunk_first ? a.wait() : b.wait();
    (void)first;
    (void)second;
    EXPECT_EQ(exact(to_host(chunk_recv)), exact(chunk(source))) << "round " << round;
    EXPECT_EQ(exact(to_host(grad_recv)), exact(grad(source))) << "round " << round;
  }
}

TEST(SendRecv, RecordsItsEventsCountsItsBytesAndIsProgressed) {
  const int p = mlacp::test::world_size();
  const int me = mlacp::test::world_rank();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  auto send = vector_of(local_values<float>({3 * (me + 1)}, me));
  auto recv = vector_of(std::vector<float>(static_cast<std::size_t>(3 * (next(me, -1, p) + 1))));
  const bool was_recording = mlacp::events::enabled();
  mlacp::events::enable(true);
  mlacp::events::clear();
  mlacp::reset_collective_bytes();
  const std::size_t pending_before = mlacp::pending_collectives();
  auto handle = mlacp::launch_send_recv(Space(), send, next(me, 1, p), recv, next(me, -1, p), mesh, "ring kv");
  // With P == 1 the exchange is a local copy: nothing pending, nothing on the wire.
  EXPECT_EQ(mlacp::pending_collectives(), pending_before + (p > 1 ? 1 : 0));
  for (int i = 0; i < 100 && !handle.test(); ++i) mlacp::progress();
  EXPECT_EQ(mlacp::collective_bytes().send_recv, p > 1 ? static_cast<std::uint64_t>(3 * (me + 1) * sizeof(float)) : 0u);
  EXPECT_EQ(mlacp::collective_bytes().total(), mlacp::collective_bytes().send_recv);
  handle.wait();
  EXPECT_EQ(mlacp::pending_collectives(), pending_before);
  const auto events = mlacp::events::snapshot();
  mlacp::events::enable(was_recording);
  std::vector<std::pair<mlacp::EventKind, std::string>> seen;
  for (const auto& e : events) seen.emplace_back(e.kind, e.name);
  const std::vector<std::pair<mlacp::EventKind, std::string>> expected{{mlacp::EventKind::launch, "ring kv"},
                                                                       {mlacp::EventKind::wait_begin, "ring kv"},
                                                                       {mlacp::EventKind::wait_end, "ring kv"}};
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(to_host(recv), local_values<float>({3 * (next(me, -1, p) + 1)}, next(me, -1, p)));
}

TEST(SendRecv, WaitTwiceIsAUsageErrorAndAnUnwaitedHandleCompletes) {
  const int p = mlacp::test::world_size();
  const int me = mlacp::test::world_rank();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  auto send = vector_of(local_values<double>({6}, me));
  auto recv = vector_of(std::vector<double>(6));
  auto handle = mlacp::launch_send_recv(Space(), send, next(me, 1, p), recv, next(me, -1, p), mesh, "twice");
  handle.wait();
  try {
    handle.wait();
    ADD_FAILURE() << "a second wait() returned";
  } catch (const mlacp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'twice' cannot be waited twice"), std::string::npos) << e.what();
  }

  auto recv2 = vector_of(std::vector<double>(6));
  const auto unwaited = mlacp::diagnostics::unwaited_handles();
  { auto dropped = mlacp::launch_send_recv(Space(), send, next(me, 1, p), recv2, next(me, -1, p), mesh, "dropped"); }
  EXPECT_EQ(mlacp::diagnostics::unwaited_handles(), unwaited + 1);
  EXPECT_EQ(to_host(recv2), local_values<double>({6}, next(me, -1, p))) << "completed at destruction";
}

template <class F>
std::string invalid_argument_of(F&& launch) {
  try {
    launch();
  } catch (const mlacp::InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

TEST(SendRecv, RefusesBadPeersTagsAndNonContiguousViewsBeforePostingAnything) {
  const int p = mlacp::test::world_size();
  const int me = mlacp::test::world_rank();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  auto send = vector_of(std::vector<float>(4, 1.0f));
  auto recv = vector_of(std::vector<float>(4));
  const std::string range = "; expected a rank in [0, " + std::to_string(p) + ")";
  const auto contains = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  std::string what = invalid_argument_of([&] { mlacp::launch_send_recv(Space(), send, p, recv, me, mesh, "bad"); });
  EXPECT_TRUE(contains(what, "launch_send_recv 'bad': dest is " + std::to_string(p) + range)) << what;
  what = invalid_argument_of([&] { mlacp::launch_send_recv(Space(), send, me, recv, -1, mesh, "bad"); });
  EXPECT_TRUE(contains(what, "launch_send_recv 'bad': source is -1" + range)) << what;
  what = invalid_argument_of([&] { mlacp::launch_send_recv(Space(), send, me, recv, me, mesh, "bad", -3); });
  EXPECT_TRUE(contains(what, "launch_send_recv 'bad': tag is -3; expected a tag in [0, ")) << what;
  // MPI_TAG_UB tags the pairwise reduce-scatter's block messages on the mesh's communicator: a user's is refused.
  const int reserved = mlacp::mpi::block_message_tag();
  what = invalid_argument_of([&] { mlacp::launch_send_recv(Space(), send, me, recv, me, mesh, "bad", reserved); });
  EXPECT_TRUE(contains(what, "tag is " + std::to_string(reserved) + "; expected a tag in [0, " +
                                 std::to_string(reserved - 1) + "] (MPI_TAG_UB - 1"))
      << what;
  Kokkos::View<float***> cube("cube", 2, 3, 4);
  auto strided = Kokkos::subview(cube, Kokkos::ALL, 1, Kokkos::ALL);
  Kokkos::View<float**> plane("plane", 2, 4);
  what = invalid_argument_of([&] { mlacp::launch_send_recv(Space(), strided, me, plane, me, mesh, "bad"); });
  EXPECT_TRUE(contains(what, "the send View 'cube' is not contiguous; expected a contiguous View")) << what;
  what = invalid_argument_of([&] { mlacp::launch_send_recv(Space(), plane, me, strided, me, mesh, "bad"); });
  EXPECT_TRUE(contains(what, "the recv View 'cube' is not contiguous")) << what;
  what = invalid_argument_of([&] {
    mlacp::launch_send_recv(Space(), send, me, Kokkos::subview(send, std::make_pair(2, 4)), me, mesh, "bad");
  });
  EXPECT_TRUE(contains(what, "overlap; expected separate Views")) << what;
  EXPECT_EQ(mlacp::pending_collectives(), 0u) << "nothing was posted";
  // Nothing was posted: a matched exchange with the same tag still pairs with the right message.
  auto ok = mlacp::launch_send_recv(Space(), send, next(me, 1, p), recv, next(me, -1, p), mesh, "after errors");
  EXPECT_EQ(to_host(ok.wait()), std::vector<float>(4, 1.0f));
}

// A receive shorter than its message: MPI_ERR_TRUNCATE, raised at wait as CommunicationError naming the exchange (on
// a communicator whose errors return; MPI's default handler would abort).
TEST(SendRecv, AShortReceiveRaisesTruncationAtWait) {
  const int p = mlacp::test::world_size();
  const int me = mlacp::test::world_rank();
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  MPI_Comm_set_errhandler(mesh.comm(), MPI_ERRORS_RETURN);
  auto send = vector_of(std::vector<float>(8, 2.0f));
  auto recv = vector_of(std::vector<float>(3));
  auto handle = mlacp::launch_send_recv(Space(), send, next(me, 1, p), recv, next(me, -1, p), mesh, "short");
  try {
    handle.wait();
    ADD_FAILURE() << "a truncated receive was waited without an error";
  } catch (const mlacp::CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("MPI_Wait of 'short' failed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("TRUNCATE"), std::string::npos) << e.what();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm_set_errhandler(mesh.comm(), MPI_ERRORS_ARE_FATAL);
}

// The peer fails instead of sending: the wait raises CommunicationError naming it instead of hanging, the abandoned
// handle is parked (it does not block), and a later launch on the broken mesh raises at once.
TEST(SendRecv, ABrokenMeshRaisesAtWaitInsteadOfHanging) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  if (mesh.size() == 1) GTEST_SKIP() << "needs two ranks";
  const int me = mesh.rank();
  const int failing = mesh.size() - 1;
  const std::string named = "rank " + std::to_string(failing) + " failed: injected peer failure";
  auto send = vector_of(std::vector<float>(4, 1.0f));
  auto recv = vector_of(std::vector<float>(4));
  const auto parked_before = mlacp::diagnostics::parked_handles();
  mlacp::AsyncCollective<Kokkos::View<float*>> handle;
  // Rank 0 sends to itself and waits for a message from the failing rank that never comes (a tag nobody else uses).
  if (me == 0) handle = mlacp::launch_send_recv(Space(), send, 0, recv, failing, mesh, "orphan", 99);
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == failing) {
    mesh.report_failure("injected peer failure");
  } else if (me == 0) {
    try {
      handle.wait();
      ADD_FAILURE() << "the wait of a receive the failed rank never sent returned";
    } catch (const mlacp::CommunicationError& e) {
      EXPECT_NE(std::string(e.what()).find("wait of 'orphan': " + named), std::string::npos) << e.what();
    }
    const auto start = std::chrono::steady_clock::now();
    handle = {};  // abandoned unwaited: parked, not waited
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
    EXPECT_EQ(mlacp::diagnostics::parked_handles(), parked_before + 1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  while (!mesh.broken()) mlacp::progress();  // the report reaches every rank
  try {
    mlacp::launch_send_recv(Space(), send, me, recv, me, mesh, "later");
    ADD_FAILURE() << "a launch on a broken mesh returned";
  } catch (const mlacp::CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
  }
}

}  // namespace
