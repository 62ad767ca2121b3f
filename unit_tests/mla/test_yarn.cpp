// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// YaRN RoPE scaling (docs/spec.md step 4, issue 34): the RoPE table of kernels/rope_frequencies.hpp against the
// reference's own loop of the spec's formulas (DeepSeek-V3's scaling and a small one whose ramp is inside the rotated
// width), factor 1 as plain RoPE bit for bit, the layer with YaRN on against the plain-loop forward and finite
// differences at one rank and against the one-rank layer at P ranks (both strategies, q-LoRA, packed documents, float
// and double), the configuration's checks, and its agreement across ranks.
#include "layer_reference_checks.hpp"
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <Kokkos_Core.hpp>
#include <mlacp/mla/kernels/rope.hpp>
#include <mlacp/mla/kernels/rope_frequencies.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/testing/reference_forward.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
namespace reference = mlacp::testing::reference;

/// The reference's rows of a configuration (what layer_reference_checks.hpp passes it).
reference::ReferenceDims::Rope reference_rope(const mlacp::MlaConfig& c) {
  return {c.rope_base,      c.rope_factor, c.rope_original_max_position, c.rope_beta_fast,
          c.rope_beta_slow, c.rope_mscale, c.rope_mscale_all_dim,        c.rope_attention_factor};
}

/// A small YaRN scaling whose ramp lies inside dr = 8 (lo = 0, hi = 2: one frequency extrapolated, one halfway, two
/// interpolated) and whose factor on cos and sin is g(0.707) / g(1) != 1, with its softmax scale.
mlacp::MlaConfig with_small_yarn(mlacp::MlaConfig c) {
  c.rope_factor = 4;
  c.rope_original_max_position = 64;
  c.rope_beta_fast = 32;
  c.rope_beta_slow = 1;
  c.rope_mscale = 0.707;
  c.rope_mscale_all_dim = 1;
  c.softmax_scale = mlacp::yarn_softmax_scale(c.rope_factor, c.rope_mscale_all_dim, c.qk_dim());
  return c;
}

mlacp::MlaConfig yarn_config(mlacp::MlaStrategy strategy, int seq, int heads, int q_lora = 0) {
  auto c = mlacp::test::make_config(2, seq, 24, heads, 4, 8, 6, 8, true, strategy);
  c.q_lora_rank = q_lora;
  return with_small_yarn(c);
}

/// The table's cos and sin at `positions` tokens from 0 against the reference's angles.
void expect_table_matches_reference(const mlacp::MlaConfig& c, int positions) {
  const Space space;
  const auto table = mlacp::detail::make_rope_table(space, positions, 0, c.rope, mlacp::rope_frequencies(c));
  const auto cos = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), table.cos);
  const auto sin = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), table.sin);
  const auto angles = reference::detail::rope_angles(reference_rope(c), c.rope);
  double worst = 0;
  for (int t = 0; t < positions; ++t)
    for (int j = 0; j < c.rope / 2; ++j) {
      worst = std::max(worst, std::abs(cos(t, j) - angles.amplitude * std::cos(t * angles.inv_freq[j])));
      worst = std::max(worst, std::abs(sin(t, j) - angles.amplitude * std::sin(t * angles.inv_freq[j])));
    }
  // Angles up to 2e5 radians: 1e-10 absolute is a few ulp of the angle.
  EXPECT_LE(worst, 1e-10) << c.describe();
}

TEST(YarnTable, DeepSeekV3ScalingMatchesTheSpecFormulas) {
  auto c = mlacp::test::make_config(1, 8, 8, 1, 128, 64, 128, 512);
  c.rope_factor = 40;
  c.rope_original_max_position = 4096;
  c.rope_beta_fast = 32;
  c.rope_beta_slow = 1;
  c.rope_mscale = 1;
  c.rope_mscale_all_dim = 1;
  ASSERT_EQ(c.error(1), "");
  // V3's ramp: lo = floor(corr(32)) = 10, hi = ceil(corr(1)) = 23 for dr = 64 and base 10000.
  const auto ramp = mlacp::yarn_ramp(mlacp::rope_frequencies(c), c.rope);
  EXPECT_EQ(ramp.lo, 10);
  EXPECT_EQ(ramp.hi, 23);
  EXPECT_EQ(mlacp::rope_frequencies(c).attention_factor, 1.0);  // g(1) / g(1)
  expect_table_matches_reference(c, 5000);
  // The softmax scale: g(1)^2 / sqrt(192), g(1) = 0.1 ln 40 + 1.
  const double g = 0.1 * std::log(40.0) + 1;
  EXPECT_NEAR(mlacp::yarn_softmax_scale(40, 1, 192), g * g / std::sqrt(192.0), 1e-15);
}

TEST(YarnTable, SmallScalingAndAttentionFactorMatchTheSpecFormulas) {
  const auto c = yarn_config(mlacp::MlaStrategy::latent, 16, 2);
  ASSERT_EQ(c.error(1), "");
  const auto f = mlacp::rope_frequencies(c);
  EXPECT_EQ(mlacp::yarn_ramp(f, c.rope).lo, 0);
  EXPECT_EQ(mlacp::yarn_ramp(f, c.rope).hi, 2);
  EXPECT_NE(f.attention_factor, 1.0);
  expect_table_matches_reference(c, 300);
  // A given attention factor wins over the mscales.
  auto given = c;
  given.rope_attention_factor = 0.8;
  EXPECT_EQ(mlacp::rope_frequencies(given).attention_factor, 0.8);
  expect_table_matches_reference(given, 50);
}

// Factor 1 is plain RoPE whatever the other rows hold: the same table, bit for bit.
TEST(YarnTable, FactorOneIsPlainRopeBitForBit) {
  auto c = mlacp::test::make_config(1, 8, 8, 1, 4, 8, 4, 8);
  const Space space;
  const auto plain = mlacp::detail::make_rope_table(space, 100, 3, c.rope, mlacp::RopeFrequencies(c.rope_base));
  c.rope_original_max_position = 64;
  c.rope_mscale = 0.5;
  c.rope_mscale_all_dim = 2;
  c.rope_beta_fast = 7;
  const auto f = mlacp::rope_frequencies(c);
  EXPECT_FALSE(f.yarn());
  EXPECT_EQ(f, mlacp::RopeFrequencies(c.rope_base));
  const auto table = mlacp::detail::make_rope_table(space, 100, 3, c.rope, f);
  const auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), plain.cos);
  const auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), table.cos);
  for (int t = 0; t < 100; ++t)
    for (int j = 0; j < c.rope / 2; ++j) ASSERT_EQ(a(t, j), b(t, j));
}

TEST(YarnLayer, SingleRankForwardMatchesPlainLoopReference) {
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded})
    for (int q_lora : {0, 10}) {
      auto c = yarn_config(strategy, 13, 3, q_lora);
      mlacp::test::expect_single_rank_forward_matches_plain_loop(c, "YaRN, Rq = " + std::to_string(q_lora));
      c.cu_seqlens = {0, 5, 13};
      mlacp::test::expect_single_rank_forward_matches_plain_loop(c, "YaRN, packed, Rq = " + std::to_string(q_lora));
    }
}

// The reference sees the scaling: without it the same layer misses the reference (the test can fail).
TEST(YarnLayer, ScalingChangesTheOutput) {
  mlacp::Mesh self(MPI_COMM_SELF);
  const auto yarn = yarn_config(mlacp::MlaStrategy::latent, 13, 3);
  auto plain = yarn;
  plain.rope_factor = 1;
  const auto w = mlacp::test::make_weights<double, Mem>(yarn, 5);
  mlacp::test::LayerTensor<double> x("x", yarn.batch, yarn.seq, yarn.hidden);
  mlacp::test::fill(x, 77, 1.0);
  mlacp::MlaAttention<double> a(yarn, w, self), b(plain, w, self);
  const auto ya = mlacp::test::host_values(a.forward(Space(), x).output());
  const auto yb = mlacp::test::host_values(b.forward(Space(), x).output());
  EXPECT_GT(mlacp::test::relative_error(ya, yb), 1e-3);
}

TEST(YarnLayer, SingleRankGradientsMatchFiniteDifferences) {
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded})
    mlacp::test::expect_single_rank_gradients_match_finite_differences(yarn_config(strategy, 9, 2, 6), 400);
}

// At P ranks (1, 2, 3: even and uneven S and H) every output and gradient equals the one-rank layer's.
TEST(YarnLayer, DistributedMatchesSingleRankFullSequence) {
  const int P = mlacp::test::world_size();
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded})
    for (int q_lora : {0, 10}) {
      const std::string what = std::string(mlacp::to_string(strategy)) + ", Rq = " + std::to_string(q_lora);
      mlacp::test::expect_matches_single_rank_full_sequence<double>(yarn_config(strategy, 4 * P + 1, P + 1, q_lora), {},
                                                                    2, "YaRN double " + what);
      mlacp::test::expect_matches_single_rank_full_sequence<float>(yarn_config(strategy, 4 * P, 2 * P, q_lora), {}, 1,
                                                                   "YaRN float " + what);
      auto packed = yarn_config(strategy, 4 * P + 2, P, q_lora);
      packed.cu_seqlens = {0, 3, 4 * P + 2};
      mlacp::test::expect_matches_single_rank_full_sequence<double>(packed, {}, 1, "YaRN packed " + what);
    }
}

TEST(YarnConfig, ChecksNameTheValue) {
  const auto good = yarn_config(mlacp::MlaStrategy::latent, 8, 2);
  const std::vector<std::pair<std::function<void(mlacp::MlaConfig&)>, std::string>> cases = {
      {[](mlacp::MlaConfig& c) { c.rope_factor = 0.5; }, "rope_factor = 0.5; expected YaRN's factor >= 1"},
      {[](mlacp::MlaConfig& c) { c.rope_factor = NAN; }, "rope_factor = nan"},
      {[](mlacp::MlaConfig& c) { c.rope_original_max_position = 0; }, "rope_original_max_position = 0 with"},
      {[](mlacp::MlaConfig& c) { c.rope_beta_fast = -0.5; }, "rope_beta_fast = -0.5, rope_beta_slow = 1; expected"},
      {[](mlacp::MlaConfig& c) { c.rope_beta_slow = 0; }, "rope_beta_slow = 0"},
      {[](mlacp::MlaConfig& c) { c.rope_mscale = -1; }, "rope_mscale = -1"},
      {[](mlacp::MlaConfig& c) { c.rope_attention_factor = INFINITY; }, "rope_attention_factor = inf"}};
  EXPECT_EQ(good.error(1), "");
  for (const auto& [change, message] : cases) {
    auto c = good;
    change(c);
    EXPECT_NE(c.error(1).find(message), std::string::npos) << c.error(1);
  }
  // Plain RoPE reads none of the other rows.
  auto plain = good;
  plain.rope_factor = 1;
  plain.rope_original_max_position = 0;
  plain.rope_beta_fast = -3;
  EXPECT_EQ(plain.error(1), "");
}

// A scaling that cannot run is refused on every rank (the cross-rank disagreement on YaRN's rows is one more case of
// test_mla_layer's SettingsThatDifferAcrossRanksRaiseOnEveryRank).
TEST(YarnConfig, BadFactorRefusedOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto good = yarn_config(mlacp::MlaStrategy::latent, 8, 2);
  const auto weights = mlacp::test::make_weights<double, Mem>(good, 11);
  auto bad = good;
  bad.rope_factor = 0.25;
  mlacp::test::expect_error<mlacp::InvalidArgument>([&] { mlacp::MlaAttention<double>(bad, weights, mesh); },
                                                    "rope_factor = 0.25");
}

}  // namespace
