// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// A schedule built directly (context + schedule, as MlaAttention builds them) and driven step by step: what the tests
// of the schedules' named backward steps (test_latent_schedule.cpp, test_expanded_schedule.cpp) share. A backward is
// driven by a callback that receives the schedule's Backward and calls its steps; the gradients and the recorded
// events come back for comparison with run() and with the layer.
#pragma once

#include "mla_test_data.hpp"

#include <gtest/gtest.h>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mesh.hpp>
#include <mlacp/mla/detail/input_checks.hpp>
#include <mlacp/mla/mla_attention.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mlacp::test {

using StepSpace = Kokkos::DefaultExecutionSpace;
using StepMem = StepSpace::memory_space;
using StepGrads = MlaGradients<double, StepMem>;

/// (kind, name) of each recorded event, in order.
inline std::vector<std::pair<EventKind, std::string>> event_sequence(const std::vector<Event>& events) {
  std::vector<std::pair<EventKind, std::string>> out;
  for (const auto& e : events) out.emplace_back(e.kind, e.name);
  return out;
}

/// Every gradient of `a` equals the one of `b` bit for bit (both allocated the same way).
inline void expect_same_gradients(const StepGrads& a, const StepGrads& b, const std::string& what) {
  auto same = [&](const char* name, const auto& va, const auto& vb) {
    ASSERT_EQ(va.data() == nullptr, vb.data() == nullptr) << name << " " << what;
    if (va.data() == nullptr) return;
    EXPECT_EQ(host_values(va), host_values(vb)) << name << " differs: " << what;
  };
  same("dx", a.dx, b.dx);
  same("w_q", a.w_q, b.w_q);
  same("b_q", a.b_q, b.b_q);
  same("w_kva", a.w_kva, b.w_kva);
  same("g_kv", a.g_kv, b.g_kv);
  same("w_kvb", a.w_kvb, b.w_kvb);
  same("b_kvb", a.b_kvb, b.b_kvb);
  same("w_o", a.w_o, b.w_o);
  same("b_o", a.b_o, b.b_o);
}

/// A schedule over a sample configuration (S = 8P + 1, H = 2P + 1: uneven splits when P > 1; biases on).
template <template <class, class, class> class Schedule>
struct ScheduleRun {
  using schedule_type = Schedule<double, StepSpace, FlashAttentionCore>;
  using context_type = typename schedule_type::context_type;
  using backward_type = typename schedule_type::Backward;
  using tensor3 = typename context_type::tensor3;

  ScheduleRun(const Mesh& m, MlaStrategy strategy, bool overlap)
      : mesh(m),
        config(make_config(2, 8 * m.size() + 1, 16, 2 * m.size() + 1, 4, 2, 3, 6, true, strategy)),
        weights(make_weights<double, StepMem>(config, 7)),
        ctx(config, weights, m, core, documents),
        schedule(ctx) {
    config.overlap = overlap;
    x = tensor3("x", config.batch, ctx.local_seq(), config.hidden);
    dy = tensor3("dy", config.batch, ctx.local_seq(), config.hidden);
    fill(x, 1 + m.rank(), 1.0);
    fill(dy, 11 + m.rank(), 1.0);
  }

  /// Forward into a fresh workspace, then a backward whose steps `drive` calls; the gradients and the backward's
  /// recorded events.
  std::pair<StepGrads, std::vector<Event>> backward(const std::function<void(backward_type&)>& drive) {
    auto ws = schedule.pool().acquire();
    schedule.forward(StepSpace(), {x, flags, *ws});
    StepGrads g;
    detail::allocate_missing(ctx, g, flags);
    events::clear();
    events::enable(true);
    {
      backward_type steps(schedule, StepSpace(), {x, flags, *ws}, dy, g);
      drive(steps);
    }
    events::enable(false);
    ws->release();
    return {g, events::snapshot()};
  }

  /// The same forward and backward through MlaAttention (its gradients).
  StepGrads layer_backward() const {
    MlaAttention<double> layer(config, weights, mesh);
    auto f = layer.forward(StepSpace(), x, flags);
    return layer.backward(StepSpace(), f, dy);
  }

  const Mesh& mesh;
  MlaConfig config;
  MlaWeights<double, StepMem> weights;
  FlashAttentionCore core;
  DocumentLayout documents;
  context_type ctx;
  schedule_type schedule;
  MlaRequiresGrad flags;
  tensor3 x, dy;
};

}  // namespace mlacp::test
