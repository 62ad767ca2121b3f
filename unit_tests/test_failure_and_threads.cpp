// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Issue 19, defects 7 and 9 (the parts that fit a GoogleTest process; the layer-level failure scenarios are in
// fault_scenarios.cpp): the watchdog's default, a broken mesh (a rank reported a failure) raising on every rank
// without blocking, and a second host thread entering mlacp on a communicator that another thread is inside.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/collectives.hpp>
#include <mlacp/diagnostics.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/watchdog.hpp>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using Tensor3 = Kokkos::View<double***, Kokkos::LayoutRight, Mem>;
using Tensor4 = Kokkos::View<double****, Kokkos::LayoutRight, Mem>;

using mlacp::test::expect_error;

mlacp::MlaConfig config_for(int P) { return mlacp::test::make_config(1, 4 * P, 8, P, 2, 2, 2, 4); }

TEST(Watchdog, OnByDefaultWithPyTorchsThirtyMinutes) {
  EXPECT_EQ(mlacp::default_wait_timeout_s, 1800.0);
  if (std::getenv("MLACP_WAIT_TIMEOUT_S") == nullptr) {
    EXPECT_EQ(mlacp::wait_timeout(), 1800.0);
  }
  const double before = mlacp::wait_timeout();
  mlacp::set_wait_timeout(0);  // off
  EXPECT_EQ(mlacp::wait_timeout(), 0.0);
  // Off, a wait still completes (it polls without a deadline).
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  Tensor4 x("x", 1, 2, 2 * mesh.size(), 3);
  EXPECT_EQ(mlacp::launch_all_to_all(Space(), x, 1, 2, mesh).wait().extent(1), 2u * static_cast<unsigned>(mesh.size()));
  mlacp::set_wait_timeout(before);
}

// The last rank reports a failure instead of entering an all-to-all the others launched (unchecked mode: no
// agreement before the launch). The others' wait raises CommunicationError naming it instead of hanging, the handle
// they abandon does not block (parked), and every later call on the mesh raises at once, on every rank.
TEST(BrokenMesh, EveryRankRaisesAndAbandonedHandlesDoNotBlock) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  if (mesh.size() == 1) GTEST_SKIP() << "needs two ranks";
  mesh.set_checked(false);
  const int failing = mesh.size() - 1;
  const std::string named = "rank " + std::to_string(failing) + " failed: injected local failure";
  Tensor4 x("x", 1, 2, 2 * mesh.size(), 3);
  const auto parked_before = mlacp::diagnostics::parked_handles();
  EXPECT_FALSE(mesh.broken());
  // The others launch first (the barrier orders it), so that the failure reaches them inside the wait.
  mlacp::AsyncCollective<Tensor4> handle;
  if (mesh.rank() != failing) handle = mlacp::launch_all_to_all(Space(), x, 1, 2, mesh, "orphan a2a");
  MPI_Barrier(MPI_COMM_WORLD);
  if (mesh.rank() == failing) {
    mesh.report_failure("injected local failure");
    mesh.report_failure("a second report is ignored");
    EXPECT_TRUE(mesh.broken());
  } else {
    try {
      handle.wait();
      ADD_FAILURE() << "the wait of a collective the failed rank never launched returned";
    } catch (const mlacp::CommunicationError& e) {
      EXPECT_NE(std::string(e.what()).find("wait of 'orphan a2a': " + named), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("the mesh is broken"), std::string::npos) << e.what();
    }
    const auto start = std::chrono::steady_clock::now();
    handle = {};  // abandoned unwaited: parked, not waited
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
    EXPECT_EQ(mlacp::diagnostics::parked_handles(), parked_before + 1);
    EXPECT_TRUE(mesh.broken());
  }
  // Every later call raises at once, on every rank: a launch, and an agreement (set_checked is collective).
  expect_error<mlacp::CommunicationError>([&] { mlacp::launch_all_to_all(Space(), x, 1, 2, mesh, "later"); }, named);
  expect_error<mlacp::CommunicationError>([&] { mesh.set_checked(true); }, named);
  // A fresh mesh over the same group works.
  mlacp::Mesh fresh(MPI_COMM_WORLD);
  EXPECT_FALSE(fresh.broken());
  EXPECT_EQ(mlacp::launch_all_to_all(Space(), x, 1, 2, fresh).wait().extent(1),
            2u * static_cast<unsigned>(fresh.size()));
}

// The agreement of a checked mesh carries a failure reported after every rank finished its collectives.
TEST(BrokenMesh, TheNextAgreementCarriesTheFailure) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  if (mesh.size() == 1) GTEST_SKIP() << "needs two ranks";
  const auto config = config_for(mesh.size());
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 3), mesh);
  Tensor3 x("x", config.batch, config.seq / mesh.size(), config.hidden);
  {
    auto forward = layer.forward(Space(), x);
    layer.backward(Space(), forward, x);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // every rank finished its collectives
  if (mesh.rank() == 0) mesh.report_failure("out of memory writing a checkpoint");
  expect_error<mlacp::CommunicationError>([&] { layer.forward(Space(), x); },
                                          "rank 0 failed: out of memory writing a checkpoint; the mesh is broken");
}

// A core that runs a hook (once) when its forward starts: the first thread is then inside the layer.
struct HookCore : mlacp::CausalAttentionCore {
  std::shared_ptr<std::function<void()>> hook = std::make_shared<std::function<void()>>();
  template <class... Args>
  void forward(const Args&... args) const {
    if (*hook) {
      const auto run = std::move(*hook);
      *hook = nullptr;
      run();
    }
    mlacp::CausalAttentionCore::forward(args...);
  }
};
using HookLayer = mlacp::MlaAttention<double, Space, HookCore>;

// Runs `f` on a second host thread (while the caller is inside mlacp) and returns what it raised ("" if nothing).
std::string raised_on_another_thread(const std::function<void()>& f) {
  std::string message = "(no exception)";
  std::thread other([&] {
    try {
      f();
    } catch (const mlacp::UsageError& e) {
      message = e.what();
    } catch (const std::exception& e) {
      message = std::string("(another exception) ") + e.what();
    }
  });
  other.join();
  return message;
}

TEST(Threads, ASecondThreadOnTheSameLayerRaises) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto config = config_for(mesh.size());
  HookCore core;
  HookLayer layer(config, mlacp::test::make_weights<double, Mem>(config, 3), mesh, core);
  Tensor3 x("x", config.batch, config.seq / mesh.size(), config.hidden);
  std::string forward_message, backward_message;
  HookLayer::Forward spare;
  *core.hook = [&] {
    forward_message = raised_on_another_thread([&] { layer.forward(Space(), x); });
    backward_message = raised_on_another_thread([&] { layer.backward(Space(), spare, x); });
  };
  auto forward = layer.forward(Space(), x);  // the hook runs inside, on this thread's entry
  const std::string expected = "another thread is inside mlacp on this communicator (rank " +
                               std::to_string(mesh.rank()) + " of " + std::to_string(mesh.size()) + ")";
  EXPECT_NE(forward_message.find("mlacp::MlaAttention::forward: " + expected), std::string::npos) << forward_message;
  EXPECT_NE(backward_message.find("mlacp::MlaAttention::backward: " + expected), std::string::npos) << backward_message;
  // The layer is intact, and its guard was left: the backward runs.
  EXPECT_NO_THROW(layer.backward(Space(), forward, x));
  EXPECT_FALSE(mesh.broken()) << "a refused entry is not a failure of the mesh";
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(Threads, TwoMeshesBorrowingOneCommunicatorShareTheGuard) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  {
    mlacp::Mesh first(comm, mlacp::Mesh::Ownership::borrow);
    mlacp::Mesh second(comm, mlacp::Mesh::Ownership::borrow);
    const auto config = config_for(first.size());
    HookCore core;
    HookLayer one(config, mlacp::test::make_weights<double, Mem>(config, 3), first, core);
    mlacp::MlaAttention<double> two(config, mlacp::test::make_weights<double, Mem>(config, 3), second);
    Tensor3 x("x", config.batch, config.seq / first.size(), config.hidden);
    std::string message;
    *core.hook = [&] { message = raised_on_another_thread([&] { two.forward(Space(), x); }); };
    one.forward(Space(), x);
    EXPECT_NE(message.find("mlacp::MlaAttention::forward: another thread is inside mlacp on this communicator"),
              std::string::npos)
        << message;
    // The same thread may enter again (a core that calls mlacp on the same mesh), and after the first thread left,
    // another thread may use the mesh.
    *core.hook = [&] { two.forward(Space(), x); };
    EXPECT_NO_THROW(one.forward(Space(), x));
    if (mlacp::test::thread_level_provided() >= MPI_THREAD_SERIALIZED) {
      EXPECT_EQ(raised_on_another_thread([&] { two.forward(Space(), x); }), "(no exception)");
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Comm_free(&comm);
}

// The collectives and the point-to-point exchange take the same guard as the layer: a second thread launching on a
// communicator that another thread is inside (here: holds the guard, as the layer's forward does while its schedule
// launches) gets UsageError naming the rank, before anything is validated, agreed or sent; the thread inside may
// launch (and wait) itself.
TEST(Threads, ASecondThreadLaunchingOnTheSameCommunicatorRaises) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int P = mesh.size();
  Tensor4 x("x", 1, 2 * P, 2 * P, 3);
  Tensor4 received("received", 1, 2 * P, 2 * P, 3);
  const std::string inside = "another thread is inside mlacp on this communicator (rank " +
                             std::to_string(mesh.rank()) + " of " + std::to_string(P) + ")";
  {
    const mlacp::detail::EntryGuard entry(mesh, "test: the first thread");
    const std::vector<std::pair<std::string, std::function<void()>>> launches{
        {"mlacp::launch_all_to_all 'a2a'", [&] { mlacp::launch_all_to_all(Space(), x, 1, 2, mesh, "a2a").wait(); }},
        {"mlacp::launch_all_gather 'ag'", [&] { mlacp::launch_all_gather(Space(), x, 1, mesh, "ag").wait(); }},
        {"mlacp::launch_reduce_scatter 'rs'", [&] { mlacp::launch_reduce_scatter(Space(), x, 1, mesh, "rs").wait(); }},
        {"mlacp::launch_send_recv 'ring'",
         [&] { mlacp::launch_send_recv(Space(), x, mesh.rank(), received, mesh.rank(), mesh, "ring").wait(); }},
    };
    for (const auto& [where, launch] : launches) {
      const std::string message = raised_on_another_thread(launch);
      EXPECT_NE(message.find(where + ": " + inside), std::string::npos) << message;
    }
    // The thread inside enters again: its launches run (the layer's schedules launch while holding the guard).
    EXPECT_EQ(mlacp::launch_all_to_all(Space(), x, 1, 2, mesh, "same thread").wait().extent(1),
              static_cast<std::size_t>(2 * P * P));
    EXPECT_EQ(
        mlacp::launch_send_recv(Space(), x, mesh.rank(), received, mesh.rank(), mesh, "same thread").wait().size(),
        x.size());
  }
  EXPECT_FALSE(mesh.broken()) << "a refused launch is not a failure of the mesh";
  // Once the first thread left, another thread may launch (MPI permitting).
  if (mlacp::test::thread_level_provided() >= MPI_THREAD_SERIALIZED) {
    EXPECT_EQ(raised_on_another_thread([&] { mlacp::launch_all_gather(Space(), x, 1, mesh, "after").wait(); }),
              "(no exception)");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// The guard is per communicator: meshes that duplicate theirs may be used from two threads (MPI permitting).
TEST(Threads, MeshesOnDifferentCommunicatorsDoNotShareTheGuard) {
  if (mlacp::test::thread_level_provided() < MPI_THREAD_SERIALIZED)
    GTEST_SKIP() << "MPI was not initialised for calls from several threads";
  mlacp::Mesh first(MPI_COMM_WORLD);
  mlacp::Mesh second(MPI_COMM_WORLD);
  const auto config = config_for(first.size());
  HookCore core;
  HookLayer one(config, mlacp::test::make_weights<double, Mem>(config, 3), first, core);
  mlacp::MlaAttention<double> two(config, mlacp::test::make_weights<double, Mem>(config, 3), second);
  Tensor3 x("x", config.batch, config.seq / first.size(), config.hidden);
  std::string message;
  // This thread waits (joins) inside the hook, out of MPI, while the other runs a whole forward on the second mesh.
  *core.hook = [&] { message = raised_on_another_thread([&] { two.forward(Space(), x); }); };
  one.forward(Space(), x);
  EXPECT_EQ(message, "(no exception)");
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
