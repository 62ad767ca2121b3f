// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The expanded schedule's backward as named steps (mla/detail/expanded_schedule.hpp): the steps called one by one in
// the schedule's order are run() (same gradients bit for bit, same recorded events), run() is what MlaAttention runs,
// and the blocking order (each inverse waited right after its launch) gives the same gradients.
#include "mpi_test_harness.hpp"
#include "schedule_steps_support.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/mla/detail/expanded_schedule.hpp>
#include <mlacp/mla/names.hpp>

namespace {

using LayerRun = mlacp::test::ScheduleRun<mlacp::detail::ExpandedSchedule>;
using Steps = LayerRun::backward_type;
using mlacp::EventKind;
using mlacp::test::event_sequence;
namespace names = mlacp::names;

TEST(ExpandedSchedule, StepsOneByOneAreRun) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  LayerRun run(mesh, mlacp::MlaStrategy::expanded, true);
  const auto by_run = run.backward([](Steps& b) { b.run(); });
  const auto by_steps = run.backward([](Steps& b) {
    ASSERT_TRUE(b.attention());
    b.launch_dq();
    b.launch_dk();
    b.launch_dv();
    b.q_branch();
    b.k_branch();
    b.v_branch();
    b.kv_and_payload();
  });
  mlacp::test::expect_same_gradients(by_run.first, by_steps.first, "run() against the steps one by one");
  EXPECT_EQ(event_sequence(by_run.second), event_sequence(by_steps.second));
  // dK and dV in flight through the Q branch, each waited right before its own branch.
  const auto at = [&by_steps](EventKind kind, const char* name) {
    return mlacp::events::find(by_steps.second, kind, name);
  };
  if (mesh.size() > 1) {
    EXPECT_GT(at(EventKind::wait_begin, names::dk_a2a), at(EventKind::compute_end, names::q_backward));
    EXPECT_LT(at(EventKind::wait_end, names::dk_a2a), at(EventKind::compute_begin, names::k_backward));
    EXPECT_GT(at(EventKind::wait_begin, names::dv_a2a), at(EventKind::compute_end, names::k_backward));
  }
}

TEST(ExpandedSchedule, RunIsWhatTheLayerRuns) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  for (const bool overlap : {true, false}) {
    LayerRun run(mesh, mlacp::MlaStrategy::expanded, overlap);
    const auto by_run = run.backward([](Steps& b) { b.run(); });
    mlacp::test::expect_same_gradients(by_run.first, run.layer_backward(), overlap ? "overlap on" : "overlap off");
  }
}

TEST(ExpandedSchedule, BlockingOrderGivesTheSameGradients) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  LayerRun run(mesh, mlacp::MlaStrategy::expanded, true);
  const auto overlapped = run.backward([](Steps& b) { b.run(); });
  const auto blocking = run.backward([](Steps& b) {
    ASSERT_TRUE(b.attention());
    b.launch_dq();
    b.wait_dq();
    b.launch_dk();
    b.wait_dk();
    b.launch_dv();
    b.wait_dv();
    b.q_branch();  // each already waited: not waited twice
    b.k_branch();
    b.v_branch();
    b.kv_and_payload();
  });
  mlacp::test::expect_same_gradients(overlapped.first, blocking.first, "overlapped against blocking order");
  if (mesh.size() > 1) {
    const auto& events = blocking.second;
    EXPECT_LT(mlacp::events::find(events, EventKind::wait_end, names::dv_a2a),
              mlacp::events::find(events, EventKind::compute_begin, names::q_backward));
  }
}

TEST(ExpandedSchedule, StepsHaveNothingToDoWithoutAnAttentionGradient) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  LayerRun run(mesh, mlacp::MlaStrategy::expanded, true);
  run.flags = mlacp::MlaRequiresGrad::none();
  run.flags.w_o = true;  // only the output projection's weight: nothing upstream of the attention
  const auto result = run.backward([](Steps& b) {
    EXPECT_FALSE(b.attention());
    b.launch_dq();
    b.launch_dk();
    b.launch_dv();
    b.q_branch();
    b.k_branch();
    b.v_branch();
    b.kv_and_payload();
  });
  EXPECT_NE(result.first.w_o.data(), nullptr);
  EXPECT_EQ(result.first.w_kvb.data(), nullptr);
  for (const char* name : {names::dq_a2a, names::dk_a2a, names::dv_a2a})
    EXPECT_LT(mlacp::events::find(result.second, EventKind::launch, name), 0) << name;
}

}  // namespace
