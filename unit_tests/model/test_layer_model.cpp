// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The performance model's formulas on tiny cases (include/mlacp/model/collective_cost.hpp, layer_model.hpp): the
// collectives' alpha-beta costs per level, where groups and rings sit, the ring steps' visible pairs against a brute
// force count, the simulated schedule's order and overlap, the bytes per level against the library's own count, and
// the memory's weights.
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/names.hpp>
#include <mlacp/model/collective_cost.hpp>
#include <mlacp/model/layer_model.hpp>
#include <mlacp/token_map.hpp>

#include "scoped_environment.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

namespace {

using mlacp::MlaConfig;
using mlacp::MlaStrategy;
using mlacp::RingLayout;
using namespace mlacp::model;

// A machine with round numbers: intra 1 us + 1 ns/B, inter 10 us + 10 ns/B, GEMMs at 1 GFLOP/s whatever the size,
// attention at 0.5 / 0.25 GFLOP/s, element-wise kernels free (no bandwidth given).
MachineParams round_machine() {
  MachineParams m;
  m.name = "round";
  m.intra = {1e-6, 1e-9};
  m.inter = {1e-5, 1e-8};
  for (const char* d : {"double", "float", "bf16"}) {
    m.gemm[d] = {{1, 1e9}, {4096, 1e9}};
    m.attention[d] = {5e8, 2.5e8};
  }
  return m;
}

MlaConfig tiny(MlaStrategy strategy = MlaStrategy::latent) {
  MlaConfig c;
  c.batch = 2;
  c.seq = 64;
  c.hidden = 32;
  c.heads = 4;
  c.nope = 8;
  c.rope = 4;
  c.vdim = 6;
  c.latent = 12;
  c.strategy = strategy;
  return c;
}

TEST(CollectiveCost, AllToAllSplitsPeersByLevelAndSharesTheNodeLink) {
  const MachineParams m = round_machine();
  // 4 ranks on one node: 3 intra peers, m/4 to each.
  Placement one{4, 4, 4, 0};
  CollectiveCost c = all_to_all(m, one, 4000);
  EXPECT_DOUBLE_EQ(c.intra_bytes, 3000);
  EXPECT_DOUBLE_EQ(c.inter_bytes, 0);
  EXPECT_DOUBLE_EQ(c.seconds, 3 * 1e-6 + 3000 * 1e-9);
  // 4 ranks on 2 nodes of 2: 1 intra peer, 2 inter peers; the node link carries both ranks' 2000 bytes.
  Placement two{4, 2, 2, 0};
  c = all_to_all(m, two, 4000);
  EXPECT_DOUBLE_EQ(c.intra_bytes, 1000);
  EXPECT_DOUBLE_EQ(c.inter_bytes, 2000);
  EXPECT_DOUBLE_EQ(c.seconds, std::max(1e-6 + 1000 * 1e-9, 2 * 1e-5 + 2 * 2000 * 1e-8));
  // One rank: nothing moves.
  EXPECT_DOUBLE_EQ(all_to_all(m, Placement{1, 1, 1, 0}, 4000).seconds, 0);
  // The pairwise reduce-scatter is the all-to-all of its input; its sum reads n blocks and writes one.
  EXPECT_DOUBLE_EQ(reduce_scatter(m, two, 4000).seconds, c.seconds);
  EXPECT_DOUBLE_EQ(reduce_scatter_sum_bytes(two, 4000), 5000);
}

TEST(CollectiveCost, PlacementOfGroupsAndRings) {
  // 2 nodes x 2 ranks, U = 2, C = 2: each group inside a node; each ring spans both nodes, 2 hops leave a node.
  Placement g = ulysses_placement(Cluster{2, 2}, 2);
  EXPECT_EQ(g.n, 2);
  EXPECT_EQ(g.per_node, 2);
  Placement r = ring_placement(Cluster{2, 2}, 2, 2);
  EXPECT_EQ(r.per_node, 1);
  EXPECT_EQ(r.leaving, 2);
  // 2 nodes x 2 ranks, U = 1, C = 4: each ring of 4 has 2 members per node, one hop leaves each node.
  r = ring_placement(Cluster{2, 2}, 1, 4);
  EXPECT_EQ(r.per_node, 2);
  EXPECT_EQ(r.leaving, 1);
  // One node: nothing leaves.
  r = ring_placement(Cluster{1, 4}, 2, 2);
  EXPECT_EQ(r.per_node, 2);
  EXPECT_EQ(r.leaving, 0);
  // 4 nodes x 1, U = 4: the group spans the nodes, one rank on each.
  g = ulysses_placement(Cluster{4, 1}, 4);
  EXPECT_EQ(g.per_node, 1);
  const MachineParams m = round_machine();
  // A hop that leaves: alpha_e + leaving * bytes * beta_e; one that stays: alpha_i + bytes * beta_i.
  CollectiveCost c = send_recv(m, ring_placement(Cluster{2, 2}, 2, 2), 1000);
  EXPECT_DOUBLE_EQ(c.seconds, 1e-5 + 2 * 1000 * 1e-8);
  EXPECT_DOUBLE_EQ(c.inter_bytes, 1000);
  c = send_recv(m, ring_placement(Cluster{1, 4}, 2, 2), 1000);
  EXPECT_DOUBLE_EQ(c.seconds, 1e-6 + 1000 * 1e-9);
  EXPECT_DOUBLE_EQ(c.intra_bytes, 1000);
}

// Brute force: visible (query, key) pairs of chunk g's queries against chunk k's keys, causal within documents.
double brute_pairs(const mlacp::TokenMap& map, int g, int k, const std::vector<std::int64_t>& cu) {
  auto doc = [&](std::int64_t t) {
    if (cu.empty()) return std::int64_t{0};
    return static_cast<std::int64_t>(std::upper_bound(cu.begin(), cu.end(), t) - cu.begin());
  };
  double n = 0;
  for (const auto& q : map.chunk(g))
    for (std::int64_t i = q.begin; i < q.end(); ++i)
      for (const auto& kr : map.chunk(k))
        for (std::int64_t j = kr.begin; j < kr.end(); ++j)
          if (j <= i && doc(i) == doc(j)) n += 1;
  return n;
}

TEST(LayerModel, RingStepPairsMatchABruteForceCount) {
  for (RingLayout layout : {RingLayout::zigzag, RingLayout::contiguous})
    for (const std::vector<std::int64_t>& cu : {std::vector<std::int64_t>{}, std::vector<std::int64_t>{0, 9, 40, 61}})
      for (int C : {1, 2, 3, 4}) {
        MlaConfig c = tiny();
        c.seq = 61;
        c.cu_seqlens = cu;
        Choice choice;
        choice.ulysses = 1;
        choice.ring = C;
        choice.layout = layout;
        const std::vector<double> got = ring_step_pairs(c, choice);
        const mlacp::TokenMap map(c.seq, 1, C, layout);
        SCOPED_TRACE(choice.describe() + " documents " + std::to_string(cu.size()));
        ASSERT_EQ(got.size(), static_cast<std::size_t>(C));
        for (int t = 0; t < C; ++t) {
          double most = 0;
          for (int g = 0; g < C; ++g) most = std::max(most, brute_pairs(map, g, (g - t + C) % C, cu));
          EXPECT_DOUBLE_EQ(got[static_cast<std::size_t>(t)], most) << "step " << t;
        }
      }
}

TEST(LayerModel, OneRankIsItsComputeAndNothingMoves) {
  const MachineParams m = round_machine();
  const MlaConfig c = tiny();
  Choice choice;
  const Prediction p = predict(c, Dtype::float64, choice, Cluster{1, 1}, m);
  EXPECT_DOUBLE_EQ(p.communication_s, 0);
  EXPECT_DOUBLE_EQ(p.bytes.total(), 0);
  EXPECT_DOUBLE_EQ(p.hidden_fraction, 1);
  // Every GEMM at 1 GFLOP/s: the projections' FLOPs (flop_count.hpp) plus the attention's at its rates.
  const double B = 2, S = 64, D = 32, H = 4, dqk = 12, dn = 8, dv = 6, R = 12, dr = 4, N = B * S;
  const double proj = 2 * N * D * H * dqk + 2 * N * D * (R + dr) + 2 * N * R * H * (dn + dv) + 2 * N * H * dv * D;
  const double E = B * H * S * (S + 1) / 2;
  EXPECT_NEAR(p.forward_s, proj / 1e9 + 2 * E * (dqk + dv) / 5e8, 1e-12);
  EXPECT_NEAR(p.backward_s, 2 * proj / 1e9 + 2 * E * (3 * dqk + 2 * dv) / 2.5e8, 1e-12);
  EXPECT_NEAR(p.compute_s, p.total_s(), 1e-12);
}

TEST(LayerModel, LatentScheduleOrderAndBytesPerLevel) {
  const MachineParams m = round_machine();
  const MlaConfig c = tiny();
  Choice choice;
  choice.ulysses = 4;
  const Prediction p = predict(c, Dtype::float64, choice, Cluster{2, 2}, m);
  std::vector<std::string> collectives;
  for (const auto& e : p.events)
    if (e.kind == ScheduleEvent::Kind::collective) collectives.push_back(e.name);
  namespace n = mlacp::names;
  // The payload all-gather leaves first (the query projection runs beside it), then Q (beside the w_kvb expansion);
  // the O exchange is one send/receive per peer (3 at U = 4), as the layer's timeline runs it.
  const std::vector<std::string> expected = {
      n::payload_all_gather, n::q_a2a, n::o_a2a, n::o_a2a, n::o_a2a, n::do_a2a, n::dq_a2a, n::latent_reduce_scatter};
  EXPECT_EQ(collectives, expected);
  // Bytes per rank (docs/spec.md's shapes): Q, O, dO, dQ all-to-alls of s tokens x all heads, the payload
  // all-gather's result and the reduce-scatter's input of S tokens x (R + dr); 1 of 4 peers on the node, 2 across.
  const double B = 2, s = 16, S = 64, H = 4, dqk = 12, dv = 6, R = 12, dr = 4;
  const double moved = 8 * (2 * B * s * H * dqk + 2 * B * s * H * dv + 2 * B * S * (R + dr));
  EXPECT_NEAR(p.bytes.intra, moved / 4, 1e-6);
  EXPECT_NEAR(p.bytes.inter, moved / 2, 1e-6);
  // Each forward collective runs beside the compute the layer puts beside it: the gather beside the query projection
  // (its launch before w_q fprop, its wait after), Q beside w_kvb fprop, O beside the attention and the own w_o.
  auto at = [&](ScheduleEvent::Kind kind, const char* name) {
    for (std::size_t i = 0; i < p.events.size(); ++i)
      if (p.events[i].kind == kind && p.events[i].name == name) return static_cast<std::ptrdiff_t>(i);
    return std::ptrdiff_t{-1};
  };
  using K = ScheduleEvent::Kind;
  EXPECT_LT(at(K::collective, n::payload_all_gather), at(K::compute, n::w_q_fprop));
  EXPECT_GT(at(K::wait, n::payload_all_gather), at(K::compute, n::w_q_fprop));
  EXPECT_LT(at(K::collective, n::q_a2a), at(K::compute, n::w_kvb_fprop));
  EXPECT_GT(at(K::wait, n::q_a2a), at(K::compute, n::w_kvb_fprop));
  EXPECT_LT(at(K::collective, n::o_a2a), at(K::compute, n::w_o_fprop));
  // The O sends run beside the attention blocks after them and the own block's w_o: a wait (recorded only where time
  // is left to wait) comes after that GEMM.
  const auto o_wait = at(K::wait, n::o_a2a);
  if (o_wait >= 0) {
    EXPECT_GT(o_wait, at(K::compute, n::w_o_fprop));
  }
  // O leaves as it is computed: the forward's attention is one block per owner (4), and the first O send leaves when
  // the first block ends, while the second is computed.
  std::vector<const ScheduleEvent*> blocks;
  const ScheduleEvent* first_send = nullptr;
  for (const auto& e : p.events) {
    if (e.backward) continue;
    if (e.kind == K::compute && e.name == std::string(n::attention_fprop)) blocks.push_back(&e);
    if (e.kind == K::collective && e.name == std::string(n::o_a2a) && first_send == nullptr) first_send = &e;
  }
  ASSERT_EQ(blocks.size(), 4u);
  ASSERT_NE(first_send, nullptr);
  EXPECT_GE(first_send->start_s, blocks[0]->end_s);
  EXPECT_LT(first_send->start_s, blocks[1]->end_s);
  EXPECT_LT(p.hidden_fraction, 1);
  EXPECT_GT(p.exposed_s, 0);
}

TEST(LayerModel, TheBf16WireMovesTwoBytesPerElementAndPaysItsConversions) {
  MachineParams m = round_machine();
  m.memory_bandwidth = 1e9;  // the conversions around the wire cost time
  MlaConfig c = tiny();
  Choice choice;
  choice.ulysses = 4;
  const Prediction same = predict(c, Dtype::float32, choice, Cluster{2, 2}, m);
  c.wire_dtype = mlacp::WireDtype::bfloat16;
  const Prediction wire = predict(c, Dtype::float32, choice, Cluster{2, 2}, m);
  c.wire_dtype = mlacp::WireDtype::bfloat16_all;
  const Prediction all = predict(c, Dtype::float32, choice, Cluster{2, 2}, m);
  // Q, O, dO, dQ and the payload all-gather move bf16 on the wire; the reduce-scatter's partial sums stay float
  // except with bf16_all. 1 of 4 peers on the node, 2 across (as in LatentScheduleOrderAndBytesPerLevel).
  const double B = 2, s = 16, S = 64, H = 4, dqk = 12, dv = 6, R = 12, dr = 4;
  const double ulysses = 2 * B * s * H * dqk + 2 * B * s * H * dv + B * S * (R + dr), reduce = B * S * (R + dr);
  EXPECT_NEAR(same.bytes.inter, 4 * (ulysses + reduce) / 2, 1e-6);
  EXPECT_NEAR(wire.bytes.inter, (2 * ulysses + 4 * reduce) / 2, 1e-6);
  EXPECT_NEAR(all.bytes.inter, 2 * (ulysses + reduce) / 2, 1e-6);
  EXPECT_NEAR(wire.bytes.intra, (2 * ulysses + 4 * reduce) / 4, 1e-6);
  EXPECT_LT(wire.communication_s, same.communication_s);
  EXPECT_LT(all.communication_s, wire.communication_s);
  // Rounding before each launch and widening after each wait: more element-wise time than the plain float layer.
  EXPECT_GT(wire.compute_s, same.compute_s);
  // A double layer has no wire (the layer refuses one): its bytes are the plain ones.
  const Prediction twice = predict(c, Dtype::float64, choice, Cluster{2, 2}, m);
  EXPECT_NEAR(twice.bytes.inter, 8 * (ulysses + reduce) / 2, 1e-6);
  // fp8 (mla/wire_policy.hpp): the forward's Q, O and payload rows as their codes and a 4-byte scale each, the
  // backward's dQ and dO in bf16, the partial sums in float; what the layer sends (test_mla_wire's MlaWireBytes).
  c.wire_dtype = mlacp::WireDtype::float8_e4m3;
  const Prediction fp8 = predict(c, Dtype::float32, choice, Cluster{2, 2}, m);
  const double forward = B * s * H * (dqk + 4) + B * s * H * (dv + 4) + B * S * (R + dr + 4);
  const double backward = 2 * (B * s * H * dqk + B * s * H * dv);
  EXPECT_NEAR(fp8.bytes.inter, (forward + backward + 4 * reduce) / 2, 1e-6);
  EXPECT_LT(fp8.bytes.inter, wire.bytes.inter);
}

TEST(LayerModel, ElementwiseKernelsRunAtTheirDtypesRate) {
  // GEMMs and attention free: the compute is the element-wise kernels alone.
  MachineParams m = round_machine();
  for (const char* d : {"double", "float", "bf16"}) {
    m.gemm[d] = {{1, 1e30}, {4096, 1e30}};
    m.attention[d] = {1e30, 1e30};
  }
  m.memory_bandwidth = 1e9;
  const MlaConfig c = tiny();
  Choice choice;
  choice.ulysses = 4;
  const Prediction at_copy = predict(c, Dtype::bfloat16, choice, Cluster{2, 2}, m);
  const Prediction float_at_copy = predict(c, Dtype::float32, choice, Cluster{2, 2}, m);
  // Data movement (assembling K and V, scattering their gradients) runs at the memory bandwidth whatever the
  // element-wise rate: with the arithmetic free, what is left is the moves.
  m.elementwise_bandwidth["bf16"] = 1e30;
  const double moves = predict(c, Dtype::bfloat16, choice, Cluster{2, 2}, m).compute_s;
  m.elementwise_bandwidth["bf16"] = 1e8;  // ten times slower than a copy, for bf16 only
  const Prediction slow = predict(c, Dtype::bfloat16, choice, Cluster{2, 2}, m);
  EXPECT_GT(moves, 0);
  EXPECT_GT(at_copy.compute_s, moves);
  EXPECT_NEAR(slow.compute_s - moves, 10 * (at_copy.compute_s - moves), 1e-6 * slow.compute_s);
  EXPECT_EQ(predict(c, Dtype::float32, choice, Cluster{2, 2}, m).compute_s, float_at_copy.compute_s);
}

TEST(LayerModel, AttentionReadsItsRateAtTheLayersHeadWidth) {
  MachineParams m = round_machine();
  const MlaConfig c = tiny();  // dqk + dv = 12 + 6 = 18
  Choice choice;
  choice.ulysses = 4;
  const Prediction flat = predict(c, Dtype::float64, choice, Cluster{2, 2}, m);
  // Points at widths 9 and 36 with the round rates halved and doubled: width 18 reads their geometric mean, the
  // round rate itself, so the prediction is unchanged; points that put the round rate at width 36 make it slower.
  m.attention_by_width["double"] = {{9, 2.5e8, 1.25e8}, {36, 1e9, 5e8}};
  EXPECT_NEAR(predict(c, Dtype::float64, choice, Cluster{2, 2}, m).total_s(), flat.total_s(), 1e-12);
  m.attention_by_width["double"] = {{18, 2.5e8, 1.25e8}, {36, 5e8, 2.5e8}};
  const Prediction slower = predict(c, Dtype::float64, choice, Cluster{2, 2}, m);
  double attention = 0;
  for (const auto& e : flat.events)
    if (e.kind == ScheduleEvent::Kind::compute &&
        (e.name == std::string(mlacp::names::attention_fprop) || e.name == std::string(mlacp::names::attention_bprop)))
      attention += e.end_s - e.start_s;
  EXPECT_GT(attention, 0);
  EXPECT_NEAR(slower.compute_s - flat.compute_s, attention, 1e-9);
}

TEST(LayerModel, OverlapHidesWhatTheComputeCovers) {
  // A slow compute and a fast network: every collective is hidden, the forward's too (each runs beside compute).
  MachineParams m = round_machine();
  m.intra = {0, 1e-15};
  MlaConfig c = tiny();
  Choice choice;
  choice.ulysses = 4;
  Prediction p = predict(c, Dtype::float64, choice, Cluster{1, 4}, m);
  EXPECT_NEAR(p.exposed_s, 0, 1e-15);
  EXPECT_NEAR(p.hidden_fraction, 1, 1e-9);
  // overlap_efficiency 0: nothing is hidden.
  m.intra = {1e-6, 1e-9};
  m.overlap_efficiency = 0;
  p = predict(c, Dtype::float64, choice, Cluster{1, 4}, m);
  EXPECT_NEAR(p.hidden_fraction, 0, 1e-12);
  EXPECT_NEAR(p.total_s(), p.compute_s + p.communication_s, 1e-12);
  // Every collective carries the synchronisation lag: with nothing hidden, each adds it at least once (one that
  // queues behind another on the link waits for that one's lag too).
  const double without_lag = p.total_s();
  int collectives = 0;
  for (const auto& e : p.events) collectives += e.kind == ScheduleEvent::Kind::collective;
  m.sync_s = 1e-3;
  p = predict(c, Dtype::float64, choice, Cluster{1, 4}, m);
  EXPECT_NEAR(p.communication_s, collectives * 1e-3 + (without_lag - p.compute_s), 1e-12);
  EXPECT_GE(p.total_s(), without_lag + collectives * 1e-3 - 1e-12);
  EXPECT_LE(p.total_s(), without_lag + 2 * collectives * 1e-3);
  // Half efficiency lies between.
  m.sync_s = 0;
  m.overlap_efficiency = 0.5;
  const double half = predict(c, Dtype::float64, choice, Cluster{1, 4}, m).total_s();
  m.overlap_efficiency = 1;
  const double full = predict(c, Dtype::float64, choice, Cluster{1, 4}, m).total_s();
  EXPECT_LT(full, half);
  EXPECT_LT(half, without_lag);
}

TEST(LayerModel, RingStepsAlternateExchangeAndCompute) {
  const MachineParams m = round_machine();
  for (MlaStrategy strategy : {MlaStrategy::latent, MlaStrategy::expanded}) {
    const MlaConfig c = tiny(strategy);
    Choice choice;
    choice.strategy = strategy;
    choice.ulysses = 2;
    choice.ring = 2;
    const Prediction p = predict(c, Dtype::float32, choice, Cluster{2, 2}, m);
    int data = 0, grads = 0;
    for (const auto& e : p.events) {
      if (e.kind != ScheduleEvent::Kind::collective) continue;
      const std::string& n = e.name;
      if (n == mlacp::names::ring_payload || n == mlacp::names::ring_k || n == mlacp::names::ring_v) ++data;
      if (n == mlacp::names::ring_d_payload || n == mlacp::names::ring_dk || n == mlacp::names::ring_dv) ++grads;
    }
    const int streams = strategy == MlaStrategy::latent ? 1 : 2;
    SCOPED_TRACE(choice.describe());
    EXPECT_EQ(data, 2 * streams);   // C - 1 exchanges per stream in the forward and again in the backward
    EXPECT_EQ(grads, 2 * streams);  // C accumulator exchanges per stream
    // The ring's hops cross the nodes (U = 2 per node); the Ulysses collectives stay inside.
    EXPECT_GT(p.bytes.inter, 0);
    EXPECT_GT(p.bytes.intra, 0);
  }
}

TEST(LayerModel, MemoryWeightsAndGradients) {
  MlaConfig c = tiny();
  Choice choice;
  choice.ulysses = 2;
  const MemoryEstimate m32 = predict_memory(c, Dtype::float32, choice, Cluster{1, 2});
  const double params = 4 * 12 * 32 + 16 * 32 + 12 + 4 * 14 * 12 + 32 * 4 * 6;
  EXPECT_DOUBLE_EQ(m32.weights, 4 * params);
  EXPECT_DOUBLE_EQ(m32.gradients, 4 * params);
  // bf16 on its bf16 path: weights in 2 bytes, gradients in float.
  c.bf16_compute = mlacp::Bf16Compute::bfloat16;
  const MemoryEstimate m16 = predict_memory(c, Dtype::bfloat16, choice, Cluster{1, 2});
  EXPECT_DOUBLE_EQ(m16.weights, 2 * params);
  EXPECT_DOUBLE_EQ(m16.gradients, 4 * params);
  // On its float path: the float copies of the weights too, and the float layer's workspaces (a float layer with a
  // bf16 wire) in place of the bf16 schedule's; auto holds both paths' workspaces (the first forward times both).
  c.bf16_compute = mlacp::Bf16Compute::float32;
  const MemoryEstimate m16f = predict_memory(c, Dtype::bfloat16, choice, Cluster{1, 2});
  EXPECT_DOUBLE_EQ(m16f.weights, 6 * params);
  EXPECT_DOUBLE_EQ(m16f.gradients, 4 * params);
  MlaConfig wired = c;
  wired.wire_dtype = mlacp::WireDtype::bfloat16;
  const MemoryEstimate inner = predict_memory(wired, Dtype::float32, choice, Cluster{1, 2});
  EXPECT_DOUBLE_EQ(m16f.activations, inner.activations);
  EXPECT_DOUBLE_EQ(m16f.scratch, inner.scratch);
  EXPECT_DOUBLE_EQ(m16f.inputs, m16.inputs + inner.inputs);
  // auto follows MLACP_BF16_COMPUTE where it is set, as the layer does (the suite pins bf16). Timed (bf16 GEMMs on
  // float BLAS), it holds both paths; on bf16 matrix hardware (AMX here) it is the bf16 path.
  c.bf16_compute = mlacp::Bf16Compute::automatic;
  const MemoryEstimate m16a = [&] {
    const mlacp::test::ScopedEnvironment env("MLACP_BF16_COMPUTE", "auto"), gemm("MLACP_BF16_GEMM", "float_blas");
    return predict_memory(c, Dtype::bfloat16, choice, Cluster{1, 2});
  }();
  {
    const mlacp::test::ScopedEnvironment env("MLACP_BF16_COMPUTE", "auto"), gemm("MLACP_BF16_GEMM", nullptr);
    const MemoryEstimate here = predict_memory(c, Dtype::bfloat16, choice, Cluster{1, 2});
    const bool hardware = mlacp::Bf16GemmPlan<Kokkos::DefaultHostExecutionSpace>().on_bf16_hardware();
    EXPECT_DOUBLE_EQ(here.total(), hardware ? m16.total() : m16a.total()) << "bf16 matrix hardware: " << hardware;
  }
  const MemoryEstimate m16b = [&] {
    const mlacp::test::ScopedEnvironment env("MLACP_BF16_COMPUTE", "bf16");
    return predict_memory(c, Dtype::bfloat16, choice, Cluster{1, 2});
  }();
  EXPECT_DOUBLE_EQ(m16a.weights, 6 * params);
  EXPECT_DOUBLE_EQ(m16a.activations, m16.activations + inner.activations);
  EXPECT_DOUBLE_EQ(m16a.scratch, m16.scratch + inner.scratch);
  EXPECT_GT(m16a.total(), m16f.total());
  EXPECT_DOUBLE_EQ(m16b.total(), m16.total());
  // A ring holds less of the sequence's keys than the flat layout at long S.
  c.seq = 4096;
  Choice flat;
  flat.ulysses = 4;
  Choice ring;
  ring.ulysses = 1;
  ring.ring = 4;
  EXPECT_LT(predict_memory(c, Dtype::float32, ring, Cluster{1, 4}).total(),
            predict_memory(c, Dtype::float32, flat, Cluster{1, 4}).total());
}

TEST(LayerModel, ErrorsNameTheValue) {
  const MachineParams m = round_machine();
  const MlaConfig c = tiny();
  Choice choice;
  choice.ulysses = 3;
  try {
    predict(c, Dtype::float32, choice, Cluster{1, 4}, m);
    FAIL() << "expected InvalidArgument";
  } catch (const mlacp::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("U=3 x C=1: expected U x C = 4 ranks"), std::string::npos) << e.what();
  }
  choice.ulysses = 3;
  choice.ring = 2;
  EXPECT_NE(choice_error(c, choice, Cluster{3, 2}).find("U=3 on 2 ranks per node"), std::string::npos)
      << choice_error(c, choice, Cluster{3, 2});
  choice.ring = 1;
  // Two nodes on a machine calibrated on one: the inter level is missing.
  MachineParams one = m;
  one.inter = {};
  one.source = "inter-node level not measured (one node)";
  choice.ulysses = 4;
  try {
    predict(c, Dtype::float32, choice, Cluster{2, 2}, one);
    FAIL() << "expected InvalidArgument";
  } catch (const mlacp::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no inter-node level"), std::string::npos) << e.what();
  }
}

}  // namespace
