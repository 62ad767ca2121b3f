// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The distributed MLA layer against the same layer run on one rank over the full sequence (P = 1), for both
// strategies, float and double, with and without biases, and with frozen weights / no input gradient.
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/mla/reference_forward.hpp>

#include <string>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;

// Heads, sequence and head dimensions all different, dn != dv (MLA_SPEC's test dimensions).
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
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(mlacp::to_string(info.param.strategy)) + (info.param.bias ? "_bias_" : "_nobias_") +
         info.param.flags_name + (info.param.overlap ? "" : "_blocking") + (info.param.batch == 1 ? "_batch1" : "");
}

template <class T>
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;

// This rank's token shard of a full [B, S, D] tensor.
template <class T>
Tensor3<T> shard(const Tensor3<T>& full, const mlacp::Mesh& mesh) {
  const std::size_t s = full.extent(1) / static_cast<std::size_t>(mesh.size());
  const auto begin = s * static_cast<std::size_t>(mesh.rank());
  Tensor3<T> local("shard", full.extent(0), s, full.extent(2));
  Kokkos::deep_copy(local, Kokkos::subview(full, Kokkos::ALL(), std::make_pair(begin, begin + s), Kokkos::ALL()));
  return local;
}

// The sum over ranks of a host vector (weight gradients are per-rank partial sums).
std::vector<double> sum_over_ranks(std::vector<double> v) {
  MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return v;
}

class MlaLayer : public ::testing::TestWithParam<Case> {};

template <class T>
void check_against_single_rank(const Case& c) {
  const double tolerance = std::is_same_v<T, double> ? 1e-10 : 1e-4;
  const auto config = small_config(c.strategy, c.bias, c.batch);
  const auto weights = mlacp::test::make_weights<T, Mem>(config, 42);
  Tensor3<T> x("x", config.batch, config.seq, config.hidden), dy("dy", config.batch, config.seq, config.hidden);
  mlacp::test::fill(x, 100, 1.0);
  mlacp::test::fill(dy, 200, 1.0);
  const Space space;

  mlacp::Mesh self(MPI_COMM_SELF);
  mlacp::MlaAttention<T> reference(config, weights, self);
  auto ref_forward = reference.forward(space, x, c.flags);
  const auto ref_grads = reference.backward(space, ref_forward, dy);

  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mlacp::MlaAttention<T> layer(config, weights, mesh);
  auto forward = layer.forward(space, shard(x, mesh), c.flags);
  const auto grads = layer.backward(space, forward, shard(dy, mesh));

  using mlacp::test::host_values;
  using mlacp::test::relative_error;
  EXPECT_LE(relative_error(host_values(forward.output()), host_values(shard(ref_forward.output(), mesh))), tolerance)
      << "y";
  auto expect_gradient = [&](const char* name, const auto& got, const auto& want, bool flag, bool partial_sum) {
    if (!flag) {
      EXPECT_EQ(got.data(), nullptr) << name << " was computed although it needs no gradient";
      return;
    }
    ASSERT_NE(got.data(), nullptr) << name;
    const auto g = partial_sum ? sum_over_ranks(host_values(got)) : host_values(got);
    const double error = relative_error(g, host_values(want));
    EXPECT_LE(error, tolerance) << name;
  };
  const auto& f = c.flags;
  if (f.x)
    expect_gradient("dx", grads.dx, shard(ref_grads.dx, mesh), true, false);
  else
    EXPECT_EQ(grads.dx.data(), nullptr);
  expect_gradient("dw_q", grads.w_q, ref_grads.w_q, f.w_q, true);
  expect_gradient("dw_kva", grads.w_kva, ref_grads.w_kva, f.w_kva, true);
  expect_gradient("dg_kv", grads.g_kv, ref_grads.g_kv, f.g_kv, true);
  expect_gradient("dw_kvb", grads.w_kvb, ref_grads.w_kvb, f.w_kvb, true);
  expect_gradient("dw_o", grads.w_o, ref_grads.w_o, f.w_o, true);
  expect_gradient("db_q", grads.b_q, ref_grads.b_q, f.b_q && c.bias, true);
  expect_gradient("db_kvb", grads.b_kvb, ref_grads.b_kvb, f.b_kvb && c.bias, true);
  expect_gradient("db_o", grads.b_o, ref_grads.b_o, f.b_o && c.bias, true);
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
  r.w_q = r.b_q = true;
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

// ---- the P = 1 layer itself against independent references ---------------------------------------------------

// The layer's forward on one rank equals the plain-loop host reference of MLA_SPEC (reference::mla_forward).
TEST(MlaLayerMath, SingleRankForwardMatchesPlainLoopReference) {
  mlacp::Mesh self(MPI_COMM_SELF);
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    for (bool bias : {false, true}) {
      const auto config = small_config(strategy, bias);
      const auto w = mlacp::test::make_weights<double, Mem>(config, 5);
      Tensor3<double> x("x", config.batch, config.seq, config.hidden);
      mlacp::test::fill(x, 77, 1.0);
      mlacp::MlaAttention<double> layer(config, w, self);
      const auto y = layer.forward(Space(), x, mlacp::MlaRequiresGrad::none()).output();

      mlacp::reference::MlaWeights<double> hw;
      auto host = [](const auto& v) { return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v); };
      hw.w_q = host(w.w_q);
      hw.w_kva = host(w.w_kva);
      hw.g_kv = host(w.g_kv);
      hw.w_kvb = host(w.w_kvb);
      hw.w_o = host(w.w_o);
      if (bias) {
        hw.b_q = host(w.b_q);
        hw.b_kvb = host(w.b_kvb);
        hw.b_o = host(w.b_o);
      }
      const mlacp::reference::ReferenceDims dims{config.batch, config.seq,  config.hidden, config.heads,
                                                 config.nope,  config.rope, config.vdim,   config.latent};
      mlacp::reference::MlaWeights<double>::tensor3_type y_ref("y_ref", config.batch, config.seq, config.hidden);
      mlacp::reference::mla_forward(dims, hw, host(x), y_ref);
      std::vector<double> want(y_ref.data(), y_ref.data() + y_ref.size());
      EXPECT_LE(mlacp::test::relative_error(mlacp::test::host_values(y), want), 1e-12)
          << mlacp::to_string(strategy) << (bias ? " with" : " without") << " bias";
    }
  }
}

// Every gradient of the P = 1 layer equals central finite differences of L = sum(y * dy) along a random direction.
TEST(MlaLayerMath, SingleRankGradientsMatchFiniteDifferences) {
  mlacp::Mesh self(MPI_COMM_SELF);
  for (auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    auto config = small_config(strategy, true);
    config.seq = 8;
    const auto w = mlacp::test::make_weights<double, Mem>(config, 9);
    Tensor3<double> x("x", config.batch, config.seq, config.hidden), dy("dy", config.batch, config.seq, config.hidden);
    mlacp::test::fill(x, 31, 1.0);
    mlacp::test::fill(dy, 32, 1.0);
    mlacp::MlaAttention<double> layer(config, w, self);
    auto forward = layer.forward(Space(), x);
    const auto grads = layer.backward(Space(), forward, dy);
    auto loss = [&] {
      const auto y = mlacp::test::host_values(layer.forward(Space(), x, mlacp::MlaRequiresGrad::none()).output());
      const auto d = mlacp::test::host_values(dy);
      double l = 0;
      for (std::size_t i = 0; i < y.size(); ++i) l += y[i] * d[i];
      return l;
    };
    std::uint64_t seed = 1000;
    auto check = [&](const char* name, const auto& param, const auto& grad) {
      const auto base = mlacp::test::host_values(param);
      const auto direction = mlacp::test::pseudo_random(base.size(), ++seed, 1.0);
      const double eps = 1e-5;
      auto set = [&](double t) {
        auto h = Kokkos::create_mirror_view(param);
        for (std::size_t i = 0; i < base.size(); ++i) h.data()[i] = base[i] + t * direction[i];
        Kokkos::deep_copy(param, h);
      };
      set(eps);
      const double plus = loss();
      set(-eps);
      const double minus = loss();
      set(0);
      const double numeric = (plus - minus) / (2 * eps);
      const auto g = mlacp::test::host_values(grad);
      double analytic = 0;
      for (std::size_t i = 0; i < g.size(); ++i) analytic += g[i] * direction[i];
      EXPECT_NEAR(analytic, numeric, 1e-6 * (std::abs(numeric) + 1.0)) << mlacp::to_string(strategy) << " " << name;
    };
    check("x", x, grads.dx);
    check("w_q", w.w_q, grads.w_q);
    check("b_q", w.b_q, grads.b_q);
    check("w_kva", w.w_kva, grads.w_kva);
    check("g_kv", w.g_kv, grads.g_kv);
    check("w_kvb", w.w_kvb, grads.w_kvb);
    check("b_kvb", w.b_kvb, grads.b_kvb);
    check("w_o", w.w_o, grads.w_o);
    check("b_o", w.b_o, grads.b_o);
  }
}

}  // namespace
