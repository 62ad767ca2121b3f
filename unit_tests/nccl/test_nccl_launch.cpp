// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The error paths of one NCCL launch (nccl::enqueue), with its CUDA and NCCL calls replaced by a fake that records
// them and fails at a chosen step: nothing is left open, leaked or released early, whatever fails (no GPU needed).
// And the wait of a launch (nccl::launch_calls) that never completes, ended by a failure reported on the mesh.
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mlacp/error.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/nccl/communicator.hpp>
#include <mlacp/nccl/transport.hpp>
#include <mlacp/watchdog.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace {

int dummy_stream = 0;
int dummy_comm = 0;
int dummy_events[8] = {};

// A communicator whose creation, destruction and abort call nothing of NCCL; `log` records destroy and abort.
mlacp::nccl::CreationSteps fake_creation(std::vector<std::string>& log) {
  mlacp::nccl::CreationSteps steps;
  steps.unique_id = [](ncclUniqueId&) { return std::string(); };
  steps.create_stream = [](cudaStream_t& stream) {
    stream = reinterpret_cast<cudaStream_t>(&dummy_stream);
    return std::string();
  };
  steps.init_rank = [](ncclComm_t& comm, int, const ncclUniqueId&, int) {
    comm = reinterpret_cast<ncclComm_t>(&dummy_comm);
    return std::string();
  };
  steps.destroy_communicator = [&log](ncclComm_t) { log.push_back("destroy communicator"); };
  steps.destroy_stream = [](cudaStream_t) {};
  steps.abort_communicator = [&log](ncclComm_t) { log.push_back("abort communicator"); };
  return steps;
}

// Launch steps that record every call in `log` and fail the step named `failing` (e.g. "create event 2"). The
// collective never completes: its event stays not ready, NCCL reports no error (after 5 s the event reports
// cudaErrorLaunchFailure, so that a wait that misses what the test expects fails instead of waiting for the watchdog).
mlacp::nccl::LaunchSteps fake_launch(std::vector<std::string>& log, const std::string& failing) {
  mlacp::nccl::LaunchSteps steps;
  auto created = std::make_shared<int>(0);
  auto recorded = std::make_shared<int>(0);
  steps.create_event = [&log, failing, created](cudaEvent_t& event) {
    const std::string step = "create event " + std::to_string(++*created);
    log.push_back(step);
    if (step == failing) return cudaErrorMemoryAllocation;
    event = reinterpret_cast<cudaEvent_t>(&dummy_events[*created]);
    return cudaSuccess;
  };
  steps.destroy_event = [&log](cudaEvent_t event) {
    log.push_back("destroy event " + std::to_string(reinterpret_cast<int*>(event) - dummy_events));
  };
  steps.record_event = [&log, failing, recorded](cudaEvent_t event, cudaStream_t) {
    const std::string step = "record event " + std::to_string(reinterpret_cast<int*>(event) - dummy_events);
    log.push_back(step);
    ++*recorded;
    return step == failing ? cudaErrorLaunchFailure : cudaSuccess;
  };
  steps.stream_wait_event = [&log](cudaStream_t, cudaEvent_t) {
    log.push_back("stream wait");
    return cudaSuccess;
  };
  steps.synchronize_stream = [&log](cudaStream_t) {
    log.push_back("synchronize stream");
    return cudaSuccess;
  };
  steps.group_start = [&log, failing] {
    log.push_back("group start");
    return failing == "group start" ? ncclSystemError : ncclSuccess;
  };
  steps.group_end = [&log, failing] {
    log.push_back("group end");
    return failing == "group end" ? ncclSystemError : ncclSuccess;
  };
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  steps.query_event = [give_up](cudaEvent_t) {
    return std::chrono::steady_clock::now() < give_up ? cudaErrorNotReady : cudaErrorLaunchFailure;
  };
  steps.async_error = [](ncclComm_t, ncclResult_t* async_error) {
    *async_error = ncclSuccess;
    return ncclSuccess;
  };
  steps.synchronize_event = [&log](cudaEvent_t) {
    log.push_back("synchronize event");
    return cudaSuccess;
  };
  return steps;
}

std::vector<mlacp::nccl::PostedCall> two_sends(std::vector<std::string>& log, const std::string& failing) {
  std::vector<mlacp::nccl::PostedCall> calls;
  for (const std::string which : {"send 1", "send 2"})
    calls.push_back({"ncclSend", [&log, failing, which] {
                       log.push_back(which);
                       return which == failing ? ncclInternalError : ncclSuccess;
                     }});
  return calls;
}

bool has(const std::vector<std::string>& log, const std::string& step) {
  return std::find(log.begin(), log.end(), step) != log.end();
}

std::size_t position(const std::vector<std::string>& log, const std::string& step) {
  return static_cast<std::size_t>(std::find(log.begin(), log.end(), step) - log.begin());
}

struct LaunchRun {
  std::vector<std::string> log;
  std::string error;  // the CommunicationError's message, empty if none
};

// One enqueue of two grouped sends on a fresh fake communicator, failing `failing`; the communicator is destroyed
// at the end (its destroy or abort lands in the log), and a second launch is tried after the first.
LaunchRun run(const std::string& failing, std::string* second_error = nullptr) {
  LaunchRun r;
  mlacp::Mesh mesh(MPI_COMM_SELF);
  {
    mlacp::nccl::Communicator communicator(mesh, fake_creation(r.log));
    const auto steps = fake_launch(r.log, failing);
    try {
      auto done = mlacp::nccl::enqueue(steps, communicator, nullptr, two_sends(r.log, failing), true, "dQ a2a");
      EXPECT_NE(done.get(), nullptr);
    } catch (const mlacp::CommunicationError& e) {
      r.error = e.what();
    }
    if (second_error != nullptr) {
      try {
        mlacp::nccl::enqueue(steps, communicator, nullptr, two_sends(r.log, ""), true, "next");
      } catch (const mlacp::CommunicationError& e) {
        *second_error = e.what();
      }
    }
  }
  return r;
}

TEST(NcclLaunch, SuccessPostsInsideOneGroupAfterTheEventsAndReturnsTheCompletionEvent) {
  const LaunchRun r = run("");
  EXPECT_EQ(r.error, "");
  const std::vector<std::string> expected{"create event 1",  "create event 2",  "record event 1",
                                          "stream wait",     "group start",     "send 1",
                                          "send 2",          "group end",       "record event 2",
                                          "destroy event 1", "destroy event 2", "destroy communicator"};
  EXPECT_EQ(r.log, expected);
}

// A call failing inside the group: the group is never ended (that would submit send 1 alone), the communicator is
// aborted (not destroyed again), later launches are refused, and both events are destroyed.
TEST(NcclLaunch, FailureInsideTheGroupAbortsTheCommunicatorAndNeverEndsTheGroup) {
  for (const std::string failing : {"send 2", "group end"}) {
    std::string second;
    const LaunchRun r = run(failing, &second);
    EXPECT_NE(r.error.find("failed inside its group"), std::string::npos) << failing << ": " << r.error;
    EXPECT_NE(r.error.find("the communicator was aborted (ncclCommAbort)"), std::string::npos) << r.error;
    EXPECT_TRUE(has(r.log, "abort communicator")) << failing;
    EXPECT_FALSE(has(r.log, "destroy communicator")) << failing;
    if (failing == "send 2") {
      EXPECT_FALSE(has(r.log, "group end"));
    }
    EXPECT_FALSE(has(r.log, "record event 2")) << failing;
    EXPECT_TRUE(has(r.log, "destroy event 1") && has(r.log, "destroy event 2")) << failing;
    const std::string call = failing == "send 2" ? "ncclSend" : "ncclGroupEnd";
    EXPECT_NE(second.find("launching 'next': the NCCL communicator was aborted after " + call + " of 'dQ a2a'"),
              std::string::npos)
        << second;
  }
}

// The completion event cannot be recorded: the communication stream is synchronised before the error (the caller
// then releases the buffers NCCL was using), and the event is destroyed.
TEST(NcclLaunch, CompletionEventNotRecordedSynchronisesBeforeTheBuffersAreReleased) {
  const LaunchRun r = run("record event 2");
  EXPECT_NE(r.error.find("cudaEventRecord for 'dQ a2a' failed"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("synchronised before its buffers are released"), std::string::npos) << r.error;
  ASSERT_TRUE(has(r.log, "synchronize stream"));
  EXPECT_GT(position(r.log, "synchronize stream"), position(r.log, "group end"));
  EXPECT_TRUE(has(r.log, "destroy event 2"));
  EXPECT_TRUE(has(r.log, "destroy communicator"));
  EXPECT_FALSE(has(r.log, "abort communicator"));
}

// Failures before the group: nothing is posted, the communicator stays usable, and whatever was created is destroyed
// (the second event's creation failing destroys the first).
TEST(NcclLaunch, FailuresBeforeTheGroupPostNothingAndLeakNoEvent) {
  for (const std::string failing : {"create event 1", "create event 2", "record event 1", "group start"}) {
    const LaunchRun r = run(failing);
    EXPECT_NE(r.error, "") << failing;
    EXPECT_FALSE(has(r.log, "send 1")) << failing;
    EXPECT_FALSE(has(r.log, "group end")) << failing;
    EXPECT_FALSE(has(r.log, "abort communicator")) << failing;
    if (failing != "create event 1") {
      EXPECT_TRUE(has(r.log, "destroy event 1")) << failing;
    }
    if (failing != "create event 1" && failing != "create event 2") {
      EXPECT_TRUE(has(r.log, "destroy event 2"));
    }
    EXPECT_EQ(std::count_if(r.log.begin(), r.log.end(),
                            [](const std::string& s) { return s.rfind("destroy event", 0) == 0; }),
              std::count_if(r.log.begin(), r.log.end(),
                            [&](const std::string& s) { return s.rfind("create event", 0) == 0 && s != failing; }))
        << failing << ": every created event destroyed once";
  }
}

// bf16 is never summed by NCCL in bf16: a reduce-scatter of ncclBfloat16 is refused before anything is created or
// posted (nccl::Transport::start hands NCCL float instead); bf16 moves are not refused by this check.
TEST(NcclLaunch, Bf16ReduceScatterIsRefusedBeforeAnythingIsEnqueued) {
  std::vector<std::string> log;
  mlacp::Mesh mesh(MPI_COMM_SELF);
  mlacp::nccl::Communicator communicator(mesh, fake_creation(log));
  mlacp::CollectiveInfo info;
  info.name = "bf16 rs";
  std::uint16_t send[4] = {}, recv[4] = {};
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] {
        mlacp::nccl::launch(mlacp::detail::Operation::reduce_scatter_sum, send, recv, 4, ncclBfloat16, 2, communicator,
                            nullptr, info);
      },
      "mlacp::nccl::launch 'bf16 rs': a reduce-scatter of ncclBfloat16 values; expected ncclFloat32");
  EXPECT_TRUE(log.empty()) << "nothing created, nothing aborted";
}

// The point-to-point form (launch_send_recv's NCCL backend): a peer outside the communicator is refused before
// anything is created or posted, and the collective entry point refuses a send_recv (it has its own).
TEST(NcclLaunch, SendRecvRefusesABadPeerBeforeAnythingIsEnqueued) {
  std::vector<std::string> log;
  mlacp::Mesh mesh(MPI_COMM_SELF);
  mlacp::nccl::Communicator communicator(mesh, fake_creation(log));
  mlacp::CollectiveInfo info;
  info.name = "ring kv";
  float send[4] = {}, recv[4] = {};
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { mlacp::nccl::launch_send_recv(send, 4, 1, recv, 4, 0, ncclFloat32, communicator, nullptr, info); },
      "mlacp::nccl::launch_send_recv 'ring kv': peer 1; expected a rank in [0, 1)");
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] {
        mlacp::nccl::launch(mlacp::detail::Operation::send_recv, send, recv, 4, ncclFloat32, 4, communicator, nullptr,
                            info);
      },
      "mlacp::nccl::launch 'ring kv': a send_recv; expected a collective");
  EXPECT_TRUE(log.empty()) << "nothing created, nothing aborted";
}

// A collective that never completes (a peer failed before entering it): a failure another rank reports on the mesh
// (Mesh::report_failure) ends the wait with CommunicationError naming that rank, as the MPI backend's wait does,
// instead of waiting for the watchdog; with the watchdog off the wait looks once. The handle's completion then parks
// the collective (its buffers stay alive for good) without blocking in cudaEventSynchronize.
TEST(NcclWait, AFailureReportedOnTheMeshEndsTheWait) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);  // a mesh this test breaks is the only one on its communicator
  const double timeout_before = mlacp::wait_timeout();
  {
    mlacp::Mesh mesh(comm, mlacp::Mesh::Ownership::borrow);
    std::vector<std::string> log;
    mlacp::nccl::Communicator communicator(mesh, fake_creation(log));
    const auto steps = fake_launch(log, "");
    auto launch = [&](const std::string& name) {
      mlacp::CollectiveInfo info;
      info.name = name;
      return mlacp::nccl::launch_calls(steps, communicator, nullptr, two_sends(log, ""), true, info);
    };
    auto watched = launch("orphan a2a");
    auto unwatched = launch("orphan a2a, no watchdog");
    EXPECT_FALSE(watched->test()) << "never completes";
    const int failing = mesh.size() - 1;
    MPI_Barrier(comm);  // every rank launched before the failure is reported
    if (mesh.rank() == failing) mesh.report_failure("injected failure before the NCCL collective");
    const std::string named =
        "rank " + std::to_string(failing) + " failed: injected failure before the NCCL collective";

    mlacp::set_wait_timeout(60);
    const auto start = std::chrono::steady_clock::now();
    mlacp::test::expect_error<mlacp::CommunicationError>(
        [&] { watched->wait(); }, "mlacp: wait of 'orphan a2a': " + named + "; the mesh is broken");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 4.0);

    mlacp::set_wait_timeout(0);  // off: the wait does not block, and reports the failure the mesh already knows of
    mlacp::test::expect_error<mlacp::CommunicationError>([&] { unwatched->wait(); },
                                                         "mlacp: wait of 'orphan a2a, no watchdog': " + named);
    for (auto* transport : {watched.get(), unwatched.get()}) {
      transport->complete_noexcept();  // what the abandoned handle does: parked, not waited
      EXPECT_TRUE(transport->parked());
    }
    EXPECT_FALSE(has(log, "synchronize event")) << "a parked collective is not waited";
    EXPECT_EQ(std::count(log.begin(), log.end(), "stream wait"), 2)
        << "one per launch: the compute stream is not ordered after a collective that failed";
    watched.reset();
    unwatched.reset();
    EXPECT_TRUE(has(log, "destroy event 2") && has(log, "destroy event 4")) << "the completion events are destroyed";
    mlacp::set_wait_timeout(timeout_before);
  }
  MPI_Comm_free(&comm);
}

}  // namespace
