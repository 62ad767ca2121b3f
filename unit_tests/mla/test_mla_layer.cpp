// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The distributed MLA layer against the same layer run on one rank over the full sequence (P = 1), for both
// strategies, float and double, with and without biases, and with frozen weights / no input gradient.
#include "layer_reference_checks.hpp"
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/mla/mla_attention.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

// Heads, sequence and head dimensions all different, dn != dv (docs/spec.md's test dimensions).
mlacp::MlaConfig small_config(mlacp::MlaStrategy strategy, bool bias, int batch = 2) {
  return mlacp::test::make_config(batch, 32, 48, 4, 8, 4, 6, 12, bias, strategy);
}

struct Case {
  mlacp::MlaStrategy strategy;
  bool bias;
  std::string flags_name;
  mlacp::MlaRequiresGrad flags;
  bool overlap = true;
  // Batch 1 takes the collectives' copy-free paths (token blocks sent as they are, received blocks in place); batch 2
  // packs and unpacks.
  int batch = 2;
  // q-LoRA (MlaConfig::q_lora_rank) and a configured softmax scale (0: 1/sqrt(dqk)).
  int q_lora = 0;
  double softmax_scale = 0;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(mlacp::to_string(info.param.strategy)) + (info.param.bias ? "_bias_" : "_nobias_") +
         info.param.flags_name + (info.param.overlap ? "" : "_blocking") + (info.param.batch == 1 ? "_batch1" : "") +
         (info.param.q_lora > 0 ? "_qlora" : "") + (info.param.softmax_scale > 0 ? "_scaled" : "");
}

template <class T>
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;

class MlaLayer : public ::testing::TestWithParam<Case> {};

template <class T>
void check_against_single_rank(const Case& c) {
  auto config = small_config(c.strategy, c.bias, c.batch);
  config.overlap = c.overlap;
  config.q_lora_rank = c.q_lora;
  config.softmax_scale = c.softmax_scale;
  mlacp::test::expect_matches_single_rank_full_sequence<T>(config, c.flags);
}

TEST_P(MlaLayer, DoubleMatchesSingleRankFullSequence) { check_against_single_rank<double>(GetParam()); }
TEST_P(MlaLayer, FloatMatchesSingleRankFullSequence) { check_against_single_rank<float>(GetParam()); }

mlacp::MlaRequiresGrad frozen_weights() {
  mlacp::MlaRequiresGrad r;
  r.w_q = r.w_kva = r.w_kvb = r.g_kv = false;
  return r;
}
mlacp::MlaRequiresGrad no_input_grad() {
  mlacp::MlaRequiresGrad r;
  r.x = false;
  return r;
}
mlacp::MlaRequiresGrad only_output_projection() {
  auto r = mlacp::MlaRequiresGrad::none();
  r.w_o = r.b_o = true;
  return r;
}
mlacp::MlaRequiresGrad only_kv() {
  auto r = mlacp::MlaRequiresGrad::none();
  r.w_kvb = r.b_kvb = r.w_kva = true;
  return r;
}
mlacp::MlaRequiresGrad only_q() {
  auto r = mlacp::MlaRequiresGrad::none();
  r.w_q = r.b_q = r.w_qa = r.g_q = r.w_qb = true;
  return r;
}
// q-LoRA: only the query's up-projection and its bias learn (no d(cq), no query RMSNorm backward).
mlacp::MlaRequiresGrad only_q_up() {
  auto r = mlacp::MlaRequiresGrad::none();
  r.w_qb = r.b_q = true;
  return r;
}
// q-LoRA: only the query RMSNorm's gain learns (d(cq) and the norm's backward, no w_qa GEMMs).
mlacp::MlaRequiresGrad only_q_norm() {
  auto r = mlacp::MlaRequiresGrad::none();
  r.g_q = true;
  return r;
}
mlacp::MlaRequiresGrad frozen_q_lora() {
  mlacp::MlaRequiresGrad r;
  r.w_qa = r.g_q = r.w_qb = r.w_kva = r.w_kvb = r.g_kv = false;
  return r;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    for (bool bias : {false, true}) {
      cases.push_back({strategy, bias, "all", {}});
      cases.push_back({strategy, bias, "frozen_weights", frozen_weights()});
      cases.push_back({strategy, bias, "no_input_grad", no_input_grad()});
    }
    cases.push_back({strategy, true, "only_output_projection", only_output_projection()});
    cases.push_back({strategy, true, "only_kv", only_kv()});
    cases.push_back({strategy, true, "only_q", only_q()});
    cases.push_back({strategy, true, "all", {}, false});  // the blocking baseline computes the same numbers
    cases.push_back({strategy, true, "all", {}, true, 1});
    cases.push_back({strategy, false, "only_q", only_q(), false, 1});
    // q-LoRA (Rq = 20), with DeepSeek-V3's kind of softmax scale (not 1/sqrt(dqk)) on most cases.
    cases.push_back({strategy, true, "all", {}, true, 2, 20, 0.3});
    cases.push_back({strategy, false, "all", {}, true, 2, 20});
    cases.push_back({strategy, false, "frozen_weights", frozen_q_lora(), true, 2, 20, 0.3});
    cases.push_back({strategy, true, "no_input_grad", no_input_grad(), true, 2, 20, 0.3});
    cases.push_back({strategy, true, "only_q", only_q(), true, 2, 20, 0.3});
    cases.push_back({strategy, true, "only_q_up", only_q_up(), true, 2, 20});
    cases.push_back({strategy, false, "only_q_norm", only_q_norm(), true, 2, 20, 0.3});
    cases.push_back({strategy, true, "all", {}, false, 2, 20, 0.3});
    cases.push_back({strategy, false, "all", {}, true, 1, 20, 0.3});
    // A scale without q-LoRA.
    cases.push_back({strategy, true, "all", {}, true, 2, 0, 0.3});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaLayer, ::testing::ValuesIn(all_cases()), case_name);

// Gradients accumulate (+=) into caller-provided Views: two backwards of two forwards give twice one backward's.
TEST(MlaLayerGradients, AccumulateIntoCallerProvidedViews) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  auto config = small_config(mlacp::MlaStrategy::latent, true);
  const auto weights = mlacp::test::make_weights<double, Mem>(config, 11);
  mlacp::MlaAttention<double> layer(config, weights, mesh);
  Tensor3<double> x("x", config.batch, config.seq / mesh.size(), config.hidden);
  mlacp::test::fill(x, 12 + mesh.rank(), 1.0);
  auto once_forward = layer.forward(Space(), x);
  const auto once = layer.backward(Space(), once_forward, x);
  // The caller's Views, allocated by the caller (a training framework's gradient buffers, say).
  mlacp::MlaGradients<double, Mem> grads;
  grads.w_q = decltype(grads.w_q)("my dw_q", weights.w_q.extent(0), weights.w_q.extent(1));
  grads.dx = Tensor3<double>("my dx", x.extent(0), x.extent(1), x.extent(2));
  const auto* w_q_data = grads.w_q.data();
  for (int i = 0; i < 2; ++i) {
    auto forward = layer.forward(Space(), x);
    layer.backward(Space(), forward, x, grads);
  }
  EXPECT_EQ(grads.w_q.data(), w_q_data) << "the caller's View was replaced instead of accumulated into";
  auto twice = [](const std::vector<double>& v) {
    auto out = v;
    for (auto& e : out) e *= 2;
    return out;
  };
  using mlacp::test::host_values;
  EXPECT_LE(mlacp::test::relative_error(host_values(grads.w_q), twice(host_values(once.w_q))), 1e-13);
  EXPECT_LE(mlacp::test::relative_error(host_values(grads.dx), twice(host_values(once.dx))), 1e-13);
  EXPECT_LE(mlacp::test::relative_error(host_values(grads.w_kvb), twice(host_values(once.w_kvb))), 1e-13);
}

// Gradient accumulation with two forwards pending at once (forward, forward, backward, backward): each Forward keeps
// its own workspace, so the gradients equal the sum of the two passes run one at a time, and the first output is not
// overwritten by the second forward. Both strategies.
TEST(MlaLayerGradients, TwoPendingForwardsGiveTheSumOfTheirGradients) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  using mlacp::test::host_values;
  using mlacp::test::relative_error;
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    const auto config = small_config(strategy, true);
    mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 21), mesh);
    const std::size_t s = static_cast<std::size_t>(config.seq / mesh.size());
    Tensor3<double> x1("x1", config.batch, s, config.hidden), x2("x2", config.batch, s, config.hidden);
    Tensor3<double> dy1("dy1", config.batch, s, config.hidden), dy2("dy2", config.batch, s, config.hidden);
    mlacp::test::fill(x1, 31 + mesh.rank(), 1.0);
    mlacp::test::fill(x2, 41 + mesh.rank(), 1.0);
    mlacp::test::fill(dy1, 51 + mesh.rank(), 1.0);
    mlacp::test::fill(dy2, 61 + mesh.rank(), 1.0);
    // One at a time.
    std::vector<double> y1_alone, y2_alone;
    mlacp::MlaGradients<double, Mem> g1, g2;
    {
      auto f = layer.forward(Space(), x1);
      y1_alone = host_values(f.output());
      g1 = layer.backward(Space(), f, dy1);
    }
    {
      auto f = layer.forward(Space(), x2);
      y2_alone = host_values(f.output());
      g2 = layer.backward(Space(), f, dy2);
    }
    // Both pending, consumed in reverse order, accumulated into one set of gradients.
    mlacp::MlaGradients<double, Mem> g;
    {
      auto f1 = layer.forward(Space(), x1);
      auto f2 = layer.forward(Space(), x2);
      EXPECT_EQ(layer.forward_workspaces_in_use(), 2u);
      EXPECT_EQ(relative_error(host_values(f1.output()), y1_alone), 0.0) << "the second forward overwrote the first";
      EXPECT_EQ(relative_error(host_values(f2.output()), y2_alone), 0.0);
      layer.backward(Space(), f2, dy2, g);
      layer.backward(Space(), f1, dy1, g);
    }
    EXPECT_EQ(layer.forward_workspaces(), 2u) << "two pending forwards need two workspaces, no more";
    EXPECT_EQ(layer.forward_workspaces_in_use(), 0u);
    auto sum = [](const auto& a, const auto& b) {
      auto out = host_values(a);
      const auto other = host_values(b);
      for (std::size_t i = 0; i < out.size(); ++i) out[i] += other[i];
      return out;
    };
    const std::string what = mlacp::to_string(strategy);
    EXPECT_LE(relative_error(host_values(g.dx), sum(g1.dx, g2.dx)), 1e-13) << what;
    EXPECT_LE(relative_error(host_values(g.w_q), sum(g1.w_q, g2.w_q)), 1e-13) << what;
    EXPECT_LE(relative_error(host_values(g.w_kva), sum(g1.w_kva, g2.w_kva)), 1e-13) << what;
    EXPECT_LE(relative_error(host_values(g.g_kv), sum(g1.g_kv, g2.g_kv)), 1e-13) << what;
    EXPECT_LE(relative_error(host_values(g.w_kvb), sum(g1.w_kvb, g2.w_kvb)), 1e-13) << what;
    EXPECT_LE(relative_error(host_values(g.w_o), sum(g1.w_o, g2.w_o)), 1e-13) << what;
    EXPECT_LE(relative_error(host_values(g.b_kvb), sum(g1.b_kvb, g2.b_kvb)), 1e-13) << what;
  }
}

// A consumed Forward gives its workspace back and drops what it referenced (the input x); a destroyed, unconsumed one
// too. An output the caller still holds keeps its values but not its workspace (issue 19, defect 5): the workspace is
// free, and when it is taken again it lets the held y go and writes a new one.
TEST(MlaLayerMemory, ConsumedOrDestroyedForwardReleasesItsMemory) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto config = small_config(mlacp::MlaStrategy::latent, false);
  mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 3), mesh);
  Tensor3<double> x("x", config.batch, config.seq / mesh.size(), config.hidden);
  mlacp::test::fill(x, 5 + mesh.rank(), 1.0);
  const auto x_owners = x.use_count();
  auto f = layer.forward(Space(), x);
  EXPECT_TRUE(f.holds_workspace());
  EXPECT_EQ(x.use_count(), x_owners + 1) << "a pending Forward keeps its input for backward";
  EXPECT_EQ(layer.forward_workspaces_in_use(), 1u);
  layer.backward(Space(), f, x);
  EXPECT_FALSE(f.holds_workspace()) << "a consumed Forward must give its workspace back";
  EXPECT_EQ(x.use_count(), x_owners) << "a consumed Forward must drop its input";
  EXPECT_EQ(layer.forward_workspaces_in_use(), 0u) << "its output (held by the consumed Forward) pins nothing";
  const auto y = f.output();
  const auto y_values = mlacp::test::host_values(y);
  f = {};  // the Forward goes; the caller's copy of y stays
  EXPECT_EQ(layer.forward_workspaces_in_use(), 0u);
  {
    auto g = layer.forward(Space(), x);
    EXPECT_NE(g.output().data(), y.data()) << "a held output was overwritten";
    EXPECT_EQ(layer.forward_workspaces(), 1u) << "the free workspace is reused, with a new y";
  }  // destroyed without backward: its workspace comes back
  EXPECT_EQ(mlacp::test::relative_error(mlacp::test::host_values(y), y_values), 0.0);
  EXPECT_EQ(x.use_count(), x_owners);
  EXPECT_EQ(layer.forward_workspaces_in_use(), 0u);
  auto again = layer.forward(Space(), x);
  EXPECT_EQ(layer.forward_workspaces(), 1u) << "the free workspace is reused";
  layer.backward(Space(), again, x);
}

// ---- the P = 1 layer itself against independent references ---------------------------------------------------

// The layer's forward on one rank equals the plain-loop host reference of docs/spec.md
// (testing::reference::mla_forward).
// A pending Forward refers to its layer: the layer can be neither copied nor moved away from under it.
static_assert(!std::is_copy_constructible_v<mlacp::MlaAttention<double>> &&
                  !std::is_move_constructible_v<mlacp::MlaAttention<double>> &&
                  !std::is_move_assignable_v<mlacp::MlaAttention<double>>,
              "MlaAttention must stay where it was built while its Forwards are pending");

// A caller gradient View of the wrong shape on one rank only: every rank raises the same error before any collective
// (checked with the other inputs in the backward's agreement), so nothing hangs and nothing is written out of
// bounds. Short bias Views were not checked at all before; a transposed matrix of the right size passed a size check.
TEST(MlaLayerErrors, BadCallerGradientOnOneRankRaisesOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto config = small_config(mlacp::MlaStrategy::latent, true);
  const auto weights = mlacp::test::make_weights<double, Mem>(config, 11);
  mlacp::MlaAttention<double> layer(config, weights, mesh);
  Tensor3<double> x("x", config.batch, config.seq / mesh.size(), config.hidden);
  mlacp::test::fill(x, 12 + mesh.rank(), 1.0);
  using Grads = mlacp::MlaGradients<double, Mem>;
  const std::size_t qk = static_cast<std::size_t>(config.heads * config.qk_dim());
  const std::size_t kv = static_cast<std::size_t>(config.heads * (config.nope + config.vdim));
  const std::size_t R = static_cast<std::size_t>(config.latent), D = static_cast<std::size_t>(config.hidden);
  const std::string where = " on rank " + std::to_string(mesh.size() - 1);
  const std::vector<std::pair<std::function<void(Grads&)>, std::string>> cases = {
      {[&](Grads& g) { g.b_q = decltype(g.b_q)("short b_q", qk - 1); },
       "gradient b_q has shape [" + std::to_string(qk - 1) + "]; expected [" + std::to_string(qk) + "]" + where},
      {[&](Grads& g) { g.b_o = decltype(g.b_o)("short b_o", D - 2); },
       "gradient b_o has shape [" + std::to_string(D - 2) + "]; expected [" + std::to_string(D) + "]" + where},
      {[&](Grads& g) { g.w_kvb = decltype(g.w_kvb)("transposed w_kvb", R, kv); },
       "gradient w_kvb has shape [" + std::to_string(R) + ", " + std::to_string(kv) + "]; expected [" +
           std::to_string(kv) + ", " + std::to_string(R) + "]" + where},
      {[&](Grads& g) { g.dx = Tensor3<double>("wide dx", x.extent(0), x.extent(1), D + 1); },
       "gradient dx has shape [" + std::to_string(x.extent(0)) + ", " + std::to_string(x.extent(1)) + ", " +
           std::to_string(D + 1) + "]"}};
  for (const auto& [spoil, message] : cases) {
    auto forward = layer.forward(Space(), x);
    Grads grads;
    if (mesh.rank() == mesh.size() - 1) spoil(grads);
    mlacp::test::expect_error<mlacp::InvalidArgument>([&] { layer.backward(Space(), forward, x, grads); }, message);
    // The failed backward consumed nothing: the same Forward still runs a correct backward.
    Grads good;
    layer.backward(Space(), forward, x, good);
    EXPECT_NE(good.dx.data(), nullptr);
  }
}

// Settings that change which numbers come out or which collectives run must agree across ranks: a rank with another
// rope_base, rms_eps or overlap setting makes every rank raise an error naming the setting, at construction.
TEST(MlaLayerErrors, SettingsThatDifferAcrossRanksRaiseOnEveryRank) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const auto base = small_config(mlacp::MlaStrategy::latent, false);
  const auto weights = mlacp::test::make_weights<double, Mem>(base, 11);
  const bool odd_one = mesh.rank() == mesh.size() - 1 && mesh.size() > 1;
  const std::vector<std::pair<std::function<void(mlacp::MlaConfig&)>, std::string>> cases = {
      {[](mlacp::MlaConfig& c) { c.rope_base = 500000.0; }, "disagree on rope_base"},
      {[](mlacp::MlaConfig& c) { c.rms_eps = 1e-5; }, "disagree on rms_eps"},
      {[](mlacp::MlaConfig& c) { c.overlap = false; }, "disagree on overlap"},
      {[](mlacp::MlaConfig& c) { c.softmax_scale = 0.125; }, "disagree on softmax_scale"},
      // YaRN's rows (issue 34), each agreed whether or not the scaling is on.
      {[](mlacp::MlaConfig& c) {
         c.rope_factor = 8;
         c.rope_original_max_position = 64;
       },
       "disagree on rope_factor"},
      {[](mlacp::MlaConfig& c) { c.rope_original_max_position = 128; }, "disagree on rope_original_max_position"},
      {[](mlacp::MlaConfig& c) { c.rope_beta_slow = 2; }, "disagree on rope_beta_slow"},
      {[](mlacp::MlaConfig& c) { c.rope_attention_factor = 0.9; }, "disagree on rope_attention_factor"}};
  for (const auto& [change, message] : cases) {
    auto config = base;
    if (odd_one) change(config);
    if (mesh.size() == 1) {
      EXPECT_NO_THROW(mlacp::MlaAttention<double>(config, weights, mesh));
      continue;
    }
    mlacp::test::expect_error<mlacp::InvalidArgument>([&] { mlacp::MlaAttention<double>(config, weights, mesh); },
                                                      message);
  }
}

TEST(MlaLayerMath, SingleRankForwardMatchesPlainLoopReference) {
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded})
    for (bool bias : {false, true}) {
      mlacp::test::expect_single_rank_forward_matches_plain_loop(small_config(strategy, bias));
      auto config = small_config(strategy, bias);
      config.q_lora_rank = 20;
      mlacp::test::expect_single_rank_forward_matches_plain_loop(config, "Rq = 20");
      config.softmax_scale = 0.3;
      mlacp::test::expect_single_rank_forward_matches_plain_loop(config, "Rq = 20, softmax_scale = 0.3");
      config.q_lora_rank = 0;
      mlacp::test::expect_single_rank_forward_matches_plain_loop(config, "softmax_scale = 0.3");
    }
}

// The configured softmax scale is what it says: a layer with scale a/sqrt(dqk) computes what the default layer
// computes with w_q and b_q multiplied by a (q k^T * a/sqrt(dqk) = (a q) k^T / sqrt(dqk)), forward and dx; and a scale
// of exactly 1/sqrt(dqk) is the default's, bit for bit.
TEST(MlaLayerMath, SoftmaxScaleEqualsScaledQueryWeights) {
  mlacp::Mesh self(MPI_COMM_SELF);
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    auto config = small_config(strategy, true);
    const double a = 1.7;
    const auto w = mlacp::test::make_weights<double, Mem>(config, 3);
    auto scaled = mlacp::MlaWeights<double, Mem>::allocate(config);
    for_each_parameter(
        [&](const mlacp::ParameterInfo& info, const auto& from, const auto& to) {
          if (!info.present(config)) return;
          Kokkos::deep_copy(to, from);
          if (std::string(info.name) == "w_q" || std::string(info.name) == "b_q") {
            auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), to);
            for (std::size_t i = 0; i < h.size(); ++i) h.data()[i] *= a;
            Kokkos::deep_copy(to, h);
          }
        },
        w, scaled);
    Tensor3<double> x("x", config.batch, config.seq, config.hidden), dy("dy", config.batch, config.seq, config.hidden);
    mlacp::test::fill(x, 21, 1.0);
    mlacp::test::fill(dy, 22, 1.0);
    auto run = [&](const mlacp::MlaConfig& c, const mlacp::MlaWeights<double, Mem>& weights) {
      mlacp::MlaAttention<double> layer(c, weights, self);
      auto f = layer.forward(Space(), x);
      auto y = mlacp::test::host_values(f.output());
      const auto g = layer.backward(Space(), f, dy);
      return std::make_pair(y, mlacp::test::host_values(g.dx));
    };
    auto with_scale = config;
    with_scale.softmax_scale = a / std::sqrt(static_cast<double>(config.qk_dim()));
    const auto want = run(config, scaled), got = run(with_scale, w);
    EXPECT_LE(mlacp::test::relative_error(got.first, want.first), 1e-12) << mlacp::to_string(strategy) << " y";
    EXPECT_LE(mlacp::test::relative_error(got.second, want.second), 1e-12) << mlacp::to_string(strategy) << " dx";
    auto exact = config;
    exact.softmax_scale = 1.0 / std::sqrt(static_cast<double>(config.qk_dim()));
    EXPECT_EQ(run(exact, w).first, run(config, w).first) << mlacp::to_string(strategy);
  }
}

// Every gradient of the P = 1 layer equals central finite differences of L = sum(y * dy) along a random direction.
TEST(MlaLayerMath, SingleRankGradientsMatchFiniteDifferences) {
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    auto config = small_config(strategy, true);
    config.seq = 8;
    mlacp::test::expect_single_rank_gradients_match_finite_differences(config, 1000);
    config.q_lora_rank = 20;
    config.softmax_scale = 0.3;
    mlacp::test::expect_single_rank_gradients_match_finite_differences(config, 2000);
  }
}

}  // namespace
