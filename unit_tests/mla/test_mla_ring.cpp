// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Ring attention on a two-level mesh (issue 21): Mesh(MPI_COMM_WORLD, Ring(C)) for every C dividing P (U x C = 1 x P
// ... P x 1), both strategies, double and float, with and without biases, both ring layouts, even and uneven S, fewer
// heads than the Ulysses group (H < U), packed documents whose boundaries cross the ring's chunks, and bf16. The
// distributed layer, each rank holding its TokenMap ranges of x and dy, against the same layer on one rank over the
// full sequence: y and dx by the map's ranges, every weight gradient summed over the ranks (1e-10 double, 1e-4 float,
// 2e-2 bf16 against the double layer on the same values). Also the refusals, agreed on every rank before anything is
// sent, and the recorded order of a ring step (each exchange launched before its chunk's compute, waited after it).
#include "layer_reference_checks.hpp"
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/token_map.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using mlacp::test::host_values;
using mlacp::test::LayerMem;
using mlacp::test::LayerSpace;
using mlacp::test::LayerTensor;
using mlacp::test::relative_error;
using mlacp::test::rows_of;
using mlacp::test::sum_over_ranks;

// The ring sizes C > 1 that divide P (none at P = 1).
std::vector<int> ring_sizes() { return mlacp::test::ring_sizes(mlacp::test::world_size()); }

// The ring layer on Mesh(world, ring) against the one-rank layer of `Reference` (T itself, or double for bf16 on the
// same values), two iterations (the second on the buffers of the first).
template <class T, class Reference = T>
void expect_ring_matches(mlacp::MlaConfig config, int ring, mlacp::RingLayout layout, const std::string& what,
                         double tolerance = std::is_same_v<T, double> ? 1e-10 : 1e-4) {
  config.ring_layout = layout;
  const std::string suffix = " [" + what + ", ring = " + std::to_string(ring) + ", " + mlacp::to_string(layout) + "]";
  mlacp::Mesh mesh(MPI_COMM_WORLD, ring);
  mlacp::Mesh self(MPI_COMM_SELF);
  const LayerSpace space;
  const auto weights = mlacp::test::make_weights<T, LayerMem>(config, 42);
  LayerTensor<T> x("x", config.batch, config.seq, config.hidden), dy("dy", config.batch, config.seq, config.hidden);
  mlacp::test::fill(x, 100, 1.0);
  mlacp::test::fill(dy, 200, 1.0);

  // The reference on exactly the values the ring layer holds.
  const auto ref_weights = [&] {
    if constexpr (std::is_same_v<T, Reference>)
      return weights;
    else
      return mlacp::test::to_double(config, weights);
  }();
  const auto ref_x = [&] {
    if constexpr (std::is_same_v<T, Reference>)
      return x;
    else
      return mlacp::test::to_double(x);
  }();
  const auto ref_dy = [&] {
    if constexpr (std::is_same_v<T, Reference>)
      return dy;
    else
      return mlacp::test::to_double(dy);
  }();
  mlacp::MlaAttention<Reference> reference(config, ref_weights, self);
  auto ref_forward = reference.forward(space, ref_x);
  const auto ref_grads = reference.backward(space, ref_forward, ref_dy);
  double error_floor = 0;
  for (const auto* v :
       {&ref_grads.w_q, &ref_grads.w_qa, &ref_grads.w_qb, &ref_grads.w_kva, &ref_grads.w_kvb, &ref_grads.w_o})
    if (v->data() != nullptr) error_floor = std::max(error_floor, 1e-2 * mlacp::test::frobenius_norm(host_values(*v)));

  mlacp::MlaAttention<T> layer(config, weights, mesh);
  const mlacp::TokenMap& map = layer.token_map();
  ASSERT_EQ(map.ring_size(), ring) << suffix;
  ASSERT_EQ(map.ulysses_size(), mesh.size() / ring) << suffix;
  const auto& ranges = map.ranges(mesh.ring_rank(), mesh.ulysses_rank());
  ASSERT_EQ(layer.local_seq(), map.count(mesh.ring_rank(), mesh.ulysses_rank())) << suffix;
  ASSERT_EQ(layer.local_heads(), mlacp::Partition(config.heads, mesh.ulysses_size()).count(mesh.ulysses_rank()))
      << suffix;
  for (int iteration = 0; iteration < 2; ++iteration) {
    auto forward = layer.forward(space, rows_of(x, ranges));
    const auto grads = layer.backward(space, forward, rows_of(dy, ranges));
    EXPECT_LE(relative_error(host_values(forward.output()), host_values(rows_of(ref_forward.output(), ranges))),
              tolerance)
        << "y" << suffix;
    EXPECT_LE(relative_error(host_values(grads.dx), host_values(rows_of(ref_grads.dx, ranges))), tolerance)
        << "dx" << suffix;
    // Every weight gradient of the table (q-LoRA's included), summed over the ranks.
    mlacp::for_each_parameter(
        [&](const mlacp::ParameterInfo& info, const auto& got, const auto& want) {
          if (want.data() == nullptr) return;
          ASSERT_NE(got.data(), nullptr) << "d" << info.name << suffix;
          EXPECT_LE(relative_error(sum_over_ranks(host_values(got)), host_values(want), error_floor), tolerance)
              << "d" << info.name << suffix;
        },
        grads, ref_grads);
  }
}

struct Case {
  mlacp::MlaStrategy strategy;
  bool bias;
  int q_lora = 0;  // MlaConfig::q_lora_rank (with a softmax scale of 0.3 when set)
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(mlacp::to_string(info.param.strategy)) + (info.param.bias ? "_bias" : "_nobias") +
         (info.param.q_lora > 0 ? "_qlora" : "");
}

class MlaRing : public ::testing::TestWithParam<Case> {};

mlacp::MlaConfig ring_config(const Case& c, int seq, int heads) {
  auto config = mlacp::test::make_config(2, seq, 24, heads, 4, 4, 6, 8, c.bias, c.strategy);
  config.q_lora_rank = c.q_lora;
  if (c.q_lora > 0) config.softmax_scale = 0.3;
  return config;
}

constexpr mlacp::RingLayout kLayouts[] = {mlacp::RingLayout::contiguous, mlacp::RingLayout::zigzag};

// Even and uneven S (S = 4P, 4P + 3), H = 2U and H = U + 1 heads.
template <class T>
void check_meshes(const Case& c) {
  const int P = mlacp::test::world_size();
  for (int ring : ring_sizes()) {
    const int U = P / ring;
    for (const auto layout : kLayouts)
      for (int S : {4 * P, 4 * P + 3})
        for (int H : {2 * U, U + 1})
          expect_ring_matches<T>(ring_config(c, S, H), ring, layout,
                                 "S = " + std::to_string(S) + ", H = " + std::to_string(H));
  }
}

TEST_P(MlaRing, DoubleMatchesSingleRankFullSequence) { check_meshes<double>(GetParam()); }
TEST_P(MlaRing, FloatMatchesSingleRankFullSequence) { check_meshes<float>(GetParam()); }

// Fewer heads than the Ulysses group (its last ranks, and their whole rings, hold none) and fewer tokens than 2C
// (zigzag parts, then chunks, with no token).
TEST_P(MlaRing, FewHeadsAndFewTokens) {
  const int P = mlacp::test::world_size();
  for (int ring : ring_sizes()) {
    const int U = P / ring;
    for (const auto layout : kLayouts) {
      if (U > 1) expect_ring_matches<double>(ring_config(GetParam(), 3 * P, U - 1), ring, layout, "H = U - 1");
      expect_ring_matches<double>(ring_config(GetParam(), ring + 1, 2), ring, layout, "S = C + 1");
    }
  }
}

// Packed documents whose boundaries fall inside and across the ring's chunks (a one-token document among them).
TEST_P(MlaRing, PackedDocumentsAcrossChunks) {
  const int P = mlacp::test::world_size();
  const int S = 6 * P + 1;
  for (int ring : ring_sizes()) {
    for (const auto layout : kLayouts) {
      auto config = ring_config(GetParam(), S, 2);
      config.cu_seqlens = {0, 5, 6, S / 2 + 1, S};
      expect_ring_matches<double>(config, ring, layout, "packed");
      expect_ring_matches<float>(config, ring, layout, "packed");
    }
  }
}

// bf16 on every ring mesh, against the float64 layer on the same values (docs/spec.md's 2e-2).
TEST_P(MlaRing, Bf16WithinItsTolerance) {
  const int P = mlacp::test::world_size();
  for (int ring : ring_sizes())
    for (const auto layout : kLayouts)
      expect_ring_matches<mlacp::bf16, double>(ring_config(GetParam(), 4 * P + 1, 4), ring, layout, "bf16", 2e-2);
}

// YaRN (issue 34) on every ring mesh: the ring's positions stay global and the scaled table follows them (a ramp
// inside dr = 8, a cos/sin factor g(0.707) / g(1)); double, and bf16 against the float64 layer.
TEST_P(MlaRing, YarnScaling) {
  const int P = mlacp::test::world_size();
  for (int ring : ring_sizes())
    for (const auto layout : kLayouts) {
      auto config = ring_config(GetParam(), 4 * P + 3, 3);
      config.rope = 8;
      config.rope_factor = 4;
      config.rope_original_max_position = 64;
      config.rope_mscale = 0.707;
      config.rope_mscale_all_dim = 1;
      expect_ring_matches<double>(config, ring, layout, "YaRN");
      expect_ring_matches<mlacp::bf16, double>(config, ring, layout, "YaRN bf16", 2e-2);
    }
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, MlaRing,
    ::testing::Values(Case{mlacp::MlaStrategy::latent, false}, Case{mlacp::MlaStrategy::latent, true},
                      Case{mlacp::MlaStrategy::expanded, false}, Case{mlacp::MlaStrategy::expanded, true},
                      Case{mlacp::MlaStrategy::latent, true, 10}, Case{mlacp::MlaStrategy::expanded, false, 10}),
    case_name);

// Each ring step's exchange is launched before the step's attention and waited after it, forward and backward; the
// gradient accumulators travel one step behind; the last one is waited after dQ's inverse all-to-all is launched.
TEST(MlaRingSchedule, RecordedOrderOfTheRingSteps) {
  const int P = mlacp::test::world_size();
  for (int ring : ring_sizes()) {
    for (const auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
      const auto config = mlacp::test::make_config(1, 8 * P, 16, 2 * P, 4, 4, 6, 8, false, strategy);
      mlacp::Mesh mesh(MPI_COMM_WORLD, ring);
      mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, LayerMem>(config, 3), mesh);
      LayerTensor<double> x("x", 1, layer.local_seq(), 16), dy("dy", 1, layer.local_seq(), 16);
      mlacp::test::fill(x, 1, 1.0);
      mlacp::test::fill(dy, 2, 1.0);
      mlacp::events::clear();
      mlacp::events::enable(true);
      auto f = layer.forward(LayerSpace(), x);
      layer.backward(LayerSpace(), f, dy);
      mlacp::events::enable(false);
      const auto events = mlacp::events::snapshot();
      const std::string data =
          strategy == mlacp::MlaStrategy::latent ? mlacp::names::ring_payload : mlacp::names::ring_k;
      const std::string grad =
          strategy == mlacp::MlaStrategy::latent ? mlacp::names::ring_d_payload : mlacp::names::ring_dk;
      // The sequence of (kind, name) of the ring's exchanges and the attention phases.
      std::vector<std::string> seen;
      for (const auto& e : events) {
        const bool attention = e.name == mlacp::names::attention_fprop || e.name == mlacp::names::attention_bprop;
        if (!(e.name == data || e.name == grad || attention || e.name == mlacp::names::dq_a2a)) continue;
        if (e.kind == mlacp::EventKind::launch)
          seen.push_back("launch " + e.name);
        else if (e.kind == mlacp::EventKind::wait_end)
          seen.push_back("wait " + e.name);
        else if (e.kind == mlacp::EventKind::compute_begin && attention)
          seen.push_back(e.name);
      }
      // Forward: C - 1 steps of (launch data, attention, wait data), then the last attention.
      std::vector<std::string> want;
      for (int t = 0; t < ring; ++t) {
        if (t + 1 < ring) want.push_back("launch " + data);
        want.push_back(mlacp::names::attention_fprop);
        if (t + 1 < ring) want.push_back("wait " + data);
      }
      // Backward: the data exchange before each step's attention; the gradient exchange of step t - 1 waited after
      // step t's attention, then step t's launched; the last waited after dQ's launch.
      for (int t = 0; t < ring; ++t) {
        if (t + 1 < ring) want.push_back("launch " + data);
        want.push_back(mlacp::names::attention_bprop);
        if (t > 0) want.push_back("wait " + grad);
        want.push_back("launch " + grad);
        if (t + 1 < ring) want.push_back("wait " + data);
      }
      want.push_back("launch " + std::string(mlacp::names::dq_a2a));
      want.push_back("wait " + grad);
      // Only the ring's part and dQ's launch are compared (a 1-rank group's dQ all-to-all is recorded, not sent).
      std::vector<std::string> got;
      for (const auto& s : seen)
        if (s != "wait " + std::string(mlacp::names::dq_a2a)) got.push_back(s);
      EXPECT_EQ(got, want) << "ring = " << ring << ", " << mlacp::to_string(strategy);
    }
  }
}

// A core without positioned blocks (no capabilities: the defaults, square problems only), and a bf16 layer whose core
// does not compute on bf16 (the team path), are refused on every rank at construction, before anything is sent.
struct SquareOnlyCore {
  template <class ExecSpace, class Problem>
  void forward(const ExecSpace& space, const Problem& problem) const {
    mlacp::attention_forward(space, problem);
  }
  template <class ExecSpace, class Problem>
  void backward(const ExecSpace& space, const Problem& problem) const {
    mlacp::attention_backward(space, problem);
  }
};

TEST(MlaRingErrors, CoresThatCannotRunTheRingAreRefusedOnEveryRank) {
  const int P = mlacp::test::world_size();
  if (P < 2) GTEST_SKIP() << "needs a ring of 2 or more";
  mlacp::Mesh mesh(MPI_COMM_WORLD, P);
  const auto config = mlacp::test::make_config(1, 4 * P, 8, 2, 4, 2, 3, 5);
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] {
        mlacp::MlaAttention<double, LayerSpace, SquareOnlyCore> layer(
            config, mlacp::test::make_weights<double, LayerMem>(config, 1), mesh);
      },
      "the attention core computes no positioned blocks on this execution space");
  mlacp::FlashAttentionOptions team;
  team.path = mlacp::FlashAttentionPath::team;
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] {
        mlacp::MlaAttention<mlacp::bf16> layer(config, mlacp::test::make_weights<mlacp::bf16, LayerMem>(config, 1),
                                               mesh, mlacp::FlashAttentionCore(team));
      },
      "ring = " + std::to_string(P) + " (");
  // The block cores are accepted.
  mlacp::MlaAttention<double, LayerSpace, mlacp::CausalAttentionCore> layer(
      config, mlacp::test::make_weights<double, LayerMem>(config, 1), mesh);
  EXPECT_EQ(layer.token_map().ring_size(), P);
}

}  // namespace
