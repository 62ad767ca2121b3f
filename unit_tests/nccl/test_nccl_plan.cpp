// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The host-side parts of the NCCL backend (no GPU call): datatypes (bf16 included), the grouped send/recv plan, the
// library version the compile-time choices rest on, the classification of a poll, the watched wait, and the agreed
// creation of a communicator (with its NCCL and CUDA steps replaced, over MPI at 1, 2 and 4 ranks).
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/nccl/communicator.hpp>
#include <mlacp/nccl/transport.hpp>
#include <mlacp/watchdog.hpp>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

TEST(NcclPlan, DatatypesMatchValueTypes) {
  EXPECT_EQ(mlacp::nccl::datatype<float>(), ncclFloat32);
  EXPECT_EQ(mlacp::nccl::datatype<double>(), ncclFloat64);
  EXPECT_EQ(mlacp::nccl::datatype<mlacp::bf16>(), ncclBfloat16);
}

// The transport's body, bf16 reduce-scatter (widened, summed in ncclFloat32, rounded) included, instantiated with a
// host instance: host-only builds compile-check what CUDA builds run (it is not called: no GPU here).
TEST(NcclPlan, TransportBodyCompilesForEveryValueType) {
  using Space = Kokkos::DefaultHostExecutionSpace;
  using Memory = Kokkos::HostSpace;
  [[maybe_unused]] auto* bf16_start = &mlacp::nccl::Transport::start_on_stream<Space, mlacp::bf16, Memory>;
  [[maybe_unused]] auto* float_start = &mlacp::nccl::Transport::start_on_stream<Space, float, Memory>;
  [[maybe_unused]] auto* double_start = &mlacp::nccl::Transport::start_on_stream<Space, double, Memory>;
  EXPECT_NE(bf16_start, nullptr);
}

// The transport picks ncclAlltoAll or grouped send/recv from the headers' NCCL_VERSION_CODE; the library it runs with
// must be at least that version (a binary built against 2.28 headers and run on an older libnccl would call a
// missing collective).
TEST(NcclPlan, LinkedLibraryIsAtLeastTheHeadersVersion) {
  int runtime = 0;
  ASSERT_EQ(ncclGetVersion(&runtime), ncclSuccess);
  EXPECT_GE(runtime / 100, NCCL_VERSION_CODE / 100) << "libnccl " << runtime << ", nccl.h " << NCCL_VERSION_CODE;
}

TEST(NcclPlan, EveryPeerExactlyOnceWithRankOrderedBlocks) {
  for (int nranks : {1, 2, 3, 4, 8}) {
    for (int rank = 0; rank < nranks; ++rank) {
      const auto plan = mlacp::nccl::all_to_all_plan(rank, nranks, 10);
      ASSERT_EQ(plan.size(), static_cast<std::size_t>(nranks));
      EXPECT_EQ(plan.front().peer, rank) << "the own block first";
      std::set<int> peers;
      for (const auto& t : plan) {
        peers.insert(t.peer);
        EXPECT_EQ(t.send_offset, static_cast<std::size_t>(t.peer) * 10);
        EXPECT_EQ(t.recv_offset, static_cast<std::size_t>(t.peer) * 10);
        EXPECT_EQ(t.count, 10u);
      }
      EXPECT_EQ(peers.size(), static_cast<std::size_t>(nranks));
    }
  }
}

// The uneven plan: every rank's send to a peer is that peer's receive from it (same count), in the ring order, and
// a pair with nothing to move in either direction is left out on both sides. Counts of an uneven all-to-all of
// [tokens split by seq, heads split by heads] with `inner` values per (token, head).
TEST(NcclPlan, UnevenPlanPairsEverySendWithTheMatchingReceive) {
  const std::vector<std::vector<std::size_t>> splits{{3, 0, 2, 1}, {0, 0, 5, 0}, {1, 1, 1, 2}};
  const std::size_t inner = 7;
  for (const auto& seq : splits)
    for (const auto& heads : splits) {
      const int nranks = static_cast<int>(seq.size());
      std::vector<std::vector<mlacp::nccl::PeerTransferV>> plans;
      for (int rank = 0; rank < nranks; ++rank) {
        // Send block j: this rank's tokens x heads(j); receive block i: rank i's tokens x this rank's heads.
        mlacp::detail::PeerBlocks send, recv;
        std::size_t s = 0, r = 0;
        for (int j = 0; j < nranks; ++j) {
          const auto send_count = seq[static_cast<std::size_t>(rank)] * heads[static_cast<std::size_t>(j)] * inner;
          const auto recv_count = seq[static_cast<std::size_t>(j)] * heads[static_cast<std::size_t>(rank)] * inner;
          send.counts.push_back(send_count);
          send.offsets.push_back(s);
          recv.counts.push_back(recv_count);
          recv.offsets.push_back(r);
          s += send_count;
          r += recv_count;
        }
        plans.push_back(mlacp::nccl::all_to_all_plan_v(rank, nranks, send, recv));
        for (const auto& t : plans.back()) {
          EXPECT_EQ(t.send_offset, send.offsets[static_cast<std::size_t>(t.peer)]);
          EXPECT_EQ(t.recv_offset, recv.offsets[static_cast<std::size_t>(t.peer)]);
          EXPECT_TRUE(t.send_count > 0 || t.recv_count > 0) << "a pair with nothing to move is left out";
        }
      }
      for (int a = 0; a < nranks; ++a)
        for (const auto& t : plans[static_cast<std::size_t>(a)]) {
          bool matched = false;
          for (const auto& u : plans[static_cast<std::size_t>(t.peer)])
            if (u.peer == a) {
              matched = true;
              EXPECT_EQ(u.recv_count, t.send_count) << a << " -> " << t.peer;
              EXPECT_EQ(u.send_count, t.recv_count) << t.peer << " -> " << a;
            }
          EXPECT_TRUE(matched) << "rank " << t.peer << " has no transfer with rank " << a;
        }
    }
  EXPECT_THROW(mlacp::nccl::all_to_all_plan_v(0, 2, {}, {}), mlacp::InvalidArgument);
}

TEST(NcclPlan, ExchangeWithoutTheOwnBlockSkipsOnlyIt) {
  for (int nranks : {1, 2, 4}) {
    for (int rank = 0; rank < nranks; ++rank) {
      const auto plan = mlacp::nccl::all_to_all_plan(rank, nranks, 3, /*include_self=*/false);
      ASSERT_EQ(plan.size(), static_cast<std::size_t>(nranks - 1));
      std::set<int> peers;
      for (const auto& t : plan) peers.insert(t.peer);
      EXPECT_EQ(peers.count(rank), 0u);
      EXPECT_EQ(peers.size(), static_cast<std::size_t>(nranks - 1));
    }
  }
}

TEST(NcclPlan, RejectsRankOutsideTheGroup) {
  try {
    mlacp::nccl::all_to_all_plan(4, 4, 1);
    ADD_FAILURE() << "no exception";
  } catch (const mlacp::InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "mlacp::nccl::all_to_all_plan: rank 4 of 4 ranks; expected 0 <= rank < nranks");
  }
}

// A collective whose peer is gone never completes: the communicator's asynchronous error must fail the poll even
// while the completion event is still pending.
TEST(NcclCompletion, AsynchronousErrorFailsAPendingCollective) {
  using State = mlacp::nccl::Completion::State;
  EXPECT_EQ(mlacp::nccl::classify(cudaErrorNotReady, ncclSuccess, "dO a2a").state, State::pending);
  EXPECT_EQ(mlacp::nccl::classify(cudaSuccess, ncclSuccess, "dO a2a").state, State::done);
  EXPECT_EQ(mlacp::nccl::classify(cudaErrorNotReady, ncclInProgress, "dO a2a").state, State::pending);
  const auto failed = mlacp::nccl::classify(cudaErrorNotReady, ncclRemoteError, "dO a2a");
  EXPECT_EQ(failed.state, State::failed);
  EXPECT_NE(failed.error.find("NCCL collective 'dO a2a' failed"), std::string::npos) << failed.error;
  EXPECT_NE(failed.error.find(ncclGetErrorString(ncclRemoteError)), std::string::npos) << failed.error;
  EXPECT_EQ(mlacp::nccl::classify(cudaErrorLaunchFailure, ncclSuccess, "x").state, State::failed);
}

// The loop NCCL's wait runs with the watchdog on: it returns once the poll succeeds, lets the poll's error through,
// and past the timeout hands over to the expiry (which aborts in the library).
TEST(NcclCompletion, WatchedWaitCompletesFailsOrExpires) {
  int polls = 0;
  bool expired = false;
  mlacp::detail::watch([&] { return ++polls == 3; }, 10.0, [&](double) { expired = true; });
  EXPECT_EQ(polls, 3);
  EXPECT_FALSE(expired);
  EXPECT_THROW(
      mlacp::detail::watch([]() -> bool { throw mlacp::CommunicationError("peer gone"); }, 10.0, [](double) {}),
      mlacp::CommunicationError);
  double waited = 0;
  EXPECT_THROW(mlacp::detail::watch([] { return false; }, 0.05,
                                    [&](double w) {
                                      waited = w;
                                      throw std::runtime_error("expired");
                                    }),
               std::runtime_error);
  EXPECT_GT(waited, 0.05);
}

// Fake creation steps: no NCCL or CUDA call; `failing` is the rank whose `step` fails.
mlacp::nccl::CreationSteps fake_steps(int rank, int failing, const std::string& step, int& destroyed) {
  static int dummy = 0;
  mlacp::nccl::CreationSteps steps;
  steps.unique_id = [=](ncclUniqueId& id) -> std::string {
    id.internal[0] = 42;
    return rank == failing && step == "id" ? "ncclGetUniqueId failed: injected" : "";
  };
  steps.create_stream = [=](cudaStream_t& stream) -> std::string {
    if (rank == failing && step == "stream") return "cudaStreamCreateWithFlags failed: injected";
    stream = reinterpret_cast<cudaStream_t>(&dummy);
    return "";
  };
  steps.init_rank = [=](ncclComm_t& comm, int, const ncclUniqueId& id, int) -> std::string {
    if (id.internal[0] != 42) return "the unique id did not arrive";
    if (rank == failing && step == "init") return "ncclCommInitRank failed: injected";
    comm = reinterpret_cast<ncclComm_t>(&dummy);
    return "";
  };
  steps.destroy_communicator = [&destroyed](ncclComm_t) { ++destroyed; };
  steps.destroy_stream = [&destroyed](cudaStream_t) { ++destroyed; };
  return steps;
}

TEST(NcclCommunicator, CreatedWhenEveryStepSucceedsAndReleasedOnce) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  int destroyed = 0;
  {
    mlacp::nccl::Communicator communicator(mesh, fake_steps(mesh.rank(), -1, "", destroyed));
    EXPECT_NE(communicator.comm(), nullptr);
    EXPECT_EQ(communicator.size(), mesh.size());
  }
  EXPECT_EQ(destroyed, 2) << "the communicator and the stream";
}

// A failure on one rank (rank 0's unique id, the last rank's stream, or the last rank's initialisation) raises the
// same CommunicationError, naming that rank, on every rank, and nobody is left in the broadcast of the id.
TEST(NcclCommunicator, OneRanksFailureIsRaisedOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const int last = mesh.size() - 1;
  for (const auto& [step, failing] : {std::pair<std::string, int>{"id", 0}, {"stream", last}, {"init", last}}) {
    int destroyed = 0;
    try {
      mlacp::nccl::Communicator communicator(mesh, fake_steps(mesh.rank(), failing, step, destroyed));
      ADD_FAILURE() << step << ": no exception";
    } catch (const mlacp::CommunicationError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("mlacp::nccl::Communicator: "), std::string::npos) << what;
      EXPECT_NE(what.find("injected"), std::string::npos) << what;
      if (mesh.size() > 1) {
        EXPECT_NE(what.find("[raised on rank " + std::to_string(failing) + " of " + std::to_string(mesh.size())),
                  std::string::npos)
            << what;
      }
    }
    // What a rank had created before the failure is released: its stream, and after "init" its communicator.
    const int created = step == "id"       ? (mesh.rank() == 0 ? 0 : 1)
                        : step == "stream" ? (mesh.rank() == failing ? 0 : 1)
                                           : (mesh.rank() == failing ? 1 : 2);
    EXPECT_EQ(destroyed, created) << step;
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

}  // namespace
