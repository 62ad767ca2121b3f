// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The latent schedule's backward as named steps (mla/detail/latent_schedule.hpp): the steps called one by one in the
// schedule's order are run() (same gradients bit for bit, same recorded events), run() is what MlaAttention runs, and
// the blocking order (dQ waited right after its launch) gives the same gradients with the dQ wait before the KV step.
#include "mpi_test_harness.hpp"
#include "schedule_steps_support.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/mla/detail/latent_schedule.hpp>
#include <mlacp/mla/names.hpp>

namespace {

using LayerRun = mlacp::test::ScheduleRun<mlacp::detail::LatentSchedule>;
using Steps = LayerRun::backward_type;
using mlacp::EventKind;
using mlacp::test::event_sequence;
namespace names = mlacp::names;

TEST(LatentSchedule, StepsOneByOneAreRun) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  LayerRun run(mesh, mlacp::MlaStrategy::latent, true);
  const auto by_run = run.backward([](Steps& b) { b.run(); });
  const auto by_steps = run.backward([](Steps& b) {
    ASSERT_TRUE(b.attention());
    b.launch_dq();
    b.kv();
    b.wait_dq();
    b.q_branch();
    b.payload();
  });
  mlacp::test::expect_same_gradients(by_run.first, by_steps.first, "run() against the steps one by one");
  EXPECT_EQ(event_sequence(by_run.second), event_sequence(by_steps.second));
  // The overlap the steps are named for: dQ in flight through the KV step, the reduce-scatter through the Q branch.
  const auto at = [&by_steps](EventKind kind, const char* name) {
    return mlacp::events::find(by_steps.second, kind, name);
  };
  if (mesh.size() > 1) {
    EXPECT_LT(at(EventKind::launch, names::dq_a2a), at(EventKind::compute_begin, names::kv_backward));
    EXPECT_GT(at(EventKind::wait_begin, names::dq_a2a), at(EventKind::compute_end, names::kv_backward));
    EXPECT_GT(at(EventKind::wait_begin, names::latent_reduce_scatter), at(EventKind::compute_end, names::q_backward));
  }
}

TEST(LatentSchedule, RunIsWhatTheLayerRuns) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  for (const bool overlap : {true, false}) {
    LayerRun run(mesh, mlacp::MlaStrategy::latent, overlap);
    const auto by_run = run.backward([](Steps& b) { b.run(); });
    mlacp::test::expect_same_gradients(by_run.first, run.layer_backward(), overlap ? "overlap on" : "overlap off");
  }
}

TEST(LatentSchedule, BlockingOrderWaitsDqBeforeTheKvStepWithTheSameGradients) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  LayerRun run(mesh, mlacp::MlaStrategy::latent, true);
  const auto overlapped = run.backward([](Steps& b) { b.run(); });
  const auto blocking = run.backward([](Steps& b) {
    ASSERT_TRUE(b.attention());
    b.launch_dq();
    b.wait_dq();
    b.kv();
    b.q_branch();  // dQ already waited: not waited twice
    b.payload();
  });
  mlacp::test::expect_same_gradients(overlapped.first, blocking.first, "overlapped against blocking order");
  if (mesh.size() > 1) {
    const auto& events = blocking.second;
    EXPECT_LT(mlacp::events::find(events, EventKind::wait_end, names::dq_a2a),
              mlacp::events::find(events, EventKind::compute_begin, names::kv_backward));
  }
}

TEST(LatentSchedule, StepsHaveNothingToDoWithoutAnAttentionGradient) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  LayerRun run(mesh, mlacp::MlaStrategy::latent, true);
  run.flags = mlacp::MlaRequiresGrad::none();
  run.flags.w_o = true;  // only the output projection's weight: nothing upstream of the attention
  const auto result = run.backward([](Steps& b) {
    EXPECT_FALSE(b.attention());
    b.launch_dq();
    b.kv();
    b.wait_dq();
    b.q_branch();
    b.payload();
  });
  EXPECT_NE(result.first.w_o.data(), nullptr);
  EXPECT_EQ(result.first.w_q.data(), nullptr);
  EXPECT_LT(mlacp::events::find(result.second, EventKind::launch, names::dq_a2a), 0);
  EXPECT_LT(mlacp::events::find(result.second, EventKind::launch, names::latent_reduce_scatter), 0);
}

}  // namespace
