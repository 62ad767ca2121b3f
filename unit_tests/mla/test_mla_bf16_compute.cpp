// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// How a bf16 layer computes (issue 36, part 4; MlaConfig::bf16_compute). The float path is, bit for bit, a float
// layer with bf16 on the wire run on the widened bf16 weights and x, with y and dx rounded to bf16 once; its weight
// gradients are that layer's. The automatic choice times both paths at the first forward, agrees the slowest rank's
// times (the same choice and times on every rank), keeps the faster, and computes what a layer pinned to that path
// computes; MLACP_BF16_COMPUTE decides for an automatic configuration and not for an explicit one. The suite's
// environment pins MLACP_BF16_COMPUTE=bf16 (cmake/MlacpMpiTest.cmake); this binary also runs with it set to auto.
#include "layer_reference_checks.hpp"
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"
#include "scoped_environment.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/mla/mla_attention.hpp>
#include <mlacp/wire/cast.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using bf16 = mlacp::bf16;
using mlacp::test::host_values;
using mlacp::test::LayerTensor;
using mlacp::test::shard;

mlacp::MlaConfig config_of(mlacp::MlaStrategy strategy, mlacp::Bf16Compute compute) {
  // S = 37 and H = 6: uneven over 2 and 4 ranks; biases on.
  auto c = mlacp::test::make_config(2, 37, 48, 6, 8, 4, 6, 12, true, strategy);
  c.bf16_compute = compute;
  return c;
}

// `from`'s values in float (exact for bf16).
template <class From>
LayerTensor<float> widened(const From& from) {
  LayerTensor<float> out("widened", from.extent(0), from.extent(1), from.extent(2));
  mlacp::test::convert_into(from, out);
  return out;
}

// `from`'s float values rounded to bf16 as the library rounds (nearest even), as doubles.
std::vector<double> rounded(const std::vector<double>& from) {
  std::vector<double> out(from.size());
  for (std::size_t i = 0; i < from.size(); ++i)
    out[i] = static_cast<double>(
        mlacp::detail::cast_value<float>(mlacp::detail::cast_value<bf16>(static_cast<float>(from[i]))));
  return out;
}

std::string environment_choice() {
  const char* v = std::getenv("MLACP_BF16_COMPUTE");
  return v == nullptr ? "" : v;
}

// A test's mesh (MPI_COMM_WORLD), weights (seed 42), and full x and dy (seeds 100, 200).
struct Inputs {
  explicit Inputs(const mlacp::MlaConfig& config)
      : w(mlacp::test::make_weights<bf16, Mem>(config, 42)),
        x("x", config.batch, config.seq, config.hidden),
        dy("dy", config.batch, config.seq, config.hidden) {
    mlacp::test::fill(x, 100, 1.0);
    mlacp::test::fill(dy, 200, 1.0);
  }
  mlacp::Mesh mesh{MPI_COMM_WORLD};
  Space space;
  mlacp::MlaWeights<bf16, Mem> w;
  LayerTensor<bf16> x, dy;
};

class Bf16Compute : public ::testing::TestWithParam<mlacp::MlaStrategy> {};

// The float path against a float layer with bf16 on the wire over the widened weights and x: y, dx and every weight
// gradient bit for bit (y and dx through one rounding), over two micro-batches into the same gradients, for the
// default float weight gradients and the bf16 ones on request.
TEST_P(Bf16Compute, FloatPathIsAFloatLayerWithABf16WireBitForBit) {
  const auto config = config_of(GetParam(), mlacp::Bf16Compute::float32);
  const Inputs in(config);
  const auto& [mesh, space, w, x, dy] = in;

  mlacp::MlaAttention<bf16> layer(config, w, mesh);
  ASSERT_EQ(layer.bf16_compute_choice().requested, mlacp::Bf16Compute::float32) << "the configuration decides";
  ASSERT_EQ(layer.bf16_compute_choice().chosen, mlacp::Bf16Compute::float32);

  auto float_config = config;
  float_config.wire_dtype = mlacp::WireDtype::bfloat16;
  auto w_float = mlacp::MlaWeights<float, Mem>::allocate(config);
  mlacp::for_each_parameter(
      [&](const mlacp::ParameterInfo& info, const auto& from, const auto& to) {
        if (info.present(config)) mlacp::test::convert_into(from, to);
      },
      w, w_float);
  mlacp::MlaAttention<float> reference(float_config, w_float, mesh);

  const int rank = mesh.rank();
  const auto& seq = layer.seq_partition();
  const auto x_local = shard(x, seq, rank), dy_local = shard(dy, seq, rank);

  // The expected dx and bf16 weight gradients, carried as the layer carries them: each backward starts the float
  // layer's dx from the bf16 dx so far (widened) and rounds the result once; each adds one pass's float weight
  // gradients (computed from zero) to the bf16 ones and rounds once.
  std::vector<double> dx_expected(x_local.size(), 0.0);
  std::vector<std::vector<double>> bf16_expected(mlacp::parameter_count);
  mlacp::MlaAttention<bf16>::gradients_type g;
  mlacp::MlaAttention<bf16>::bf16_gradients_type g_bf16;
  mlacp::MlaAttention<float>::gradients_type g_ref;
  for (int step = 0; step < 2; ++step) {
    if (step == 1) {  // the caller updates a weight: the float path widens it again at the next forward
      mlacp::test::fill(w.w_o, 300, 0.5);
      mlacp::test::convert_into(w.w_o, w_float.w_o);
    }
    auto f = layer.forward(space, x_local);
    auto f_ref = reference.forward(space, widened(x_local));
    EXPECT_TRUE(f.holds_workspace());
    EXPECT_EQ(host_values(f.output()), rounded(host_values(f_ref.output()))) << "y, step " << step;
    auto f2 = layer.forward(space, x_local);
    layer.backward(space, f, dy_local, g);
    layer.backward(space, f2, dy_local, g_bf16);
    reference.backward(space, f_ref, widened(dy_local), g_ref);
    EXPECT_FALSE(f.holds_workspace());

    mlacp::MlaAttention<float>::gradients_type one;
    one.dx = LayerTensor<float>("dx so far", x_local.extent(0), x_local.extent(1), x_local.extent(2));
    auto h_dx = Kokkos::create_mirror_view(one.dx);
    for (std::size_t i = 0; i < dx_expected.size(); ++i) h_dx.data()[i] = static_cast<float>(dx_expected[i]);
    Kokkos::deep_copy(one.dx, h_dx);
    auto f_one = reference.forward(space, widened(x_local));
    reference.backward(space, f_one, widened(dy_local), one);
    dx_expected = rounded(host_values(one.dx));
    std::size_t k = 0;
    mlacp::for_each_parameter(
        [&](const mlacp::ParameterInfo&, const auto& pass) {
          auto& e = bf16_expected[k++];
          const auto p = host_values(pass);
          e.resize(p.size(), 0.0);
          for (std::size_t i = 0; i < p.size(); ++i)
            e[i] = rounded({static_cast<double>(static_cast<float>(e[i]) + static_cast<float>(p[i]))})[0];
        },
        one);
  }
  EXPECT_EQ(host_values(g.dx), dx_expected) << "dx";
  EXPECT_EQ(host_values(g_bf16.dx), dx_expected) << "dx (bf16 weight gradients)";
  mlacp::for_each_parameter(
      [&](const mlacp::ParameterInfo& info, const auto& got, const auto& want) {
        if (!info.present(config)) return;
        EXPECT_EQ(host_values(got), host_values(want)) << "d" << info.name;
      },
      g, g_ref);
  std::size_t k = 0;
  mlacp::for_each_parameter(
      [&](const mlacp::ParameterInfo& info, const auto& got) {
        const auto& want = bf16_expected[k++];
        if (info.present(config)) {
          EXPECT_EQ(host_values(got), want) << "d" << info.name << " in bf16";
        }
      },
      g_bf16);
  // The float path holds float copies of the weights: counted in the layer's workspace bytes.
  EXPECT_GT(layer.forward_workspace_bytes(), 0u);
  layer.release_memory();
  EXPECT_EQ(layer.forward_workspaces(), 0u);
}

// The automatic choice: both paths timed at the first forward, the same choice and times on every rank, the faster
// kept, and what it computes is what a layer pinned to that path computes. Under the suite's pinned environment
// (MLACP_BF16_COMPUTE=bf16) the environment decides instead, without timing; an explicit configuration ignores it.
TEST_P(Bf16Compute, AutomaticTimesBothAgreesAndKeepsTheFaster) {
  const std::string env = environment_choice();
  const auto config = config_of(GetParam(), mlacp::Bf16Compute::automatic);
  const Inputs in(config);
  const auto& [mesh, space, w, x, dy] = in;

  mlacp::MlaAttention<bf16> layer(config, w, mesh);
  const auto& before = layer.bf16_compute_choice();
  if (env.empty() || env == "auto") {
    EXPECT_EQ(before.requested, mlacp::Bf16Compute::automatic);
    EXPECT_EQ(before.chosen, mlacp::Bf16Compute::automatic) << "nothing is chosen before the first forward";
  } else {
    EXPECT_EQ(before.requested, mlacp::parse_bf16_compute(env)) << "MLACP_BF16_COMPUTE decides for auto";
    EXPECT_EQ(before.chosen, before.requested);
  }
  const int rank = mesh.rank();
  const auto& seq = layer.seq_partition();
  const auto x_local = shard(x, seq, rank), dy_local = shard(dy, seq, rank);
  auto f = layer.forward(space, x_local);
  const auto choice = layer.bf16_compute_choice();
  ASSERT_TRUE(choice.chosen == mlacp::Bf16Compute::bfloat16 || choice.chosen == mlacp::Bf16Compute::float32);
  // bf16 matrix hardware on every rank: bf16 without timing (the suite's ranks share one CPU).
  const bool hardware = layer.bf16_gemm_plan()->on_bf16_hardware();
  if (choice.requested == mlacp::Bf16Compute::automatic && hardware) {
    EXPECT_TRUE(choice.by_hardware);
    EXPECT_EQ(choice.chosen, mlacp::Bf16Compute::bfloat16);
    EXPECT_EQ(choice.bf16_seconds, 0.0) << "nothing timed";
    EXPECT_EQ(choice.float_seconds, 0.0);
  } else if (choice.requested == mlacp::Bf16Compute::automatic) {
    EXPECT_FALSE(choice.by_hardware);
    EXPECT_GT(choice.bf16_seconds, 0.0);
    EXPECT_GT(choice.float_seconds, 0.0);
    EXPECT_EQ(choice.chosen == mlacp::Bf16Compute::float32, choice.float_seconds < choice.bf16_seconds);
  } else {
    EXPECT_FALSE(choice.by_hardware);
    EXPECT_EQ(choice.bf16_seconds, 0.0) << "nothing timed";
    EXPECT_EQ(choice.float_seconds, 0.0);
  }
  if (mesh.rank() == 0)
    std::printf("[bf16 compute] %s: requested %s, chose %s (bf16 pass %.3g s, float pass %.3g s)\n",
                mlacp::to_string(GetParam()), mlacp::to_string(choice.requested), mlacp::to_string(choice.chosen),
                choice.bf16_seconds, choice.float_seconds);
  // The same on every rank: the choice and the agreed times, bit for bit.
  double mine[3] = {choice.chosen == mlacp::Bf16Compute::float32 ? 1.0 : 0.0, choice.bf16_seconds,
                    choice.float_seconds};
  std::vector<double> all(3 * static_cast<std::size_t>(mesh.size()));
  MPI_Allgather(mine, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, MPI_COMM_WORLD);
  for (int r = 0; r < mesh.size(); ++r)
    EXPECT_EQ(std::memcmp(mine, all.data() + 3 * r, sizeof mine), 0) << "rank " << r << " chose otherwise";

  // What it computes is the pinned path's: bit for bit where the two layers run the same kernels. The float path
  // always does; the bf16 path where each layer's Bf16GemmPlan, which times its backends per shape on first use,
  // chose the same backend for every shape (else within the bf16 tolerance, 2e-2).
  auto pinned_config = config;
  pinned_config.bf16_compute = choice.chosen;
  mlacp::MlaAttention<bf16> pinned(pinned_config, w, mesh);
  EXPECT_EQ(pinned.bf16_compute_choice().chosen, choice.chosen) << "an explicit configuration ignores the environment";
  auto f_pinned = pinned.forward(space, x_local);
  const auto y = host_values(f.output()), y_pinned = host_values(f_pinned.output());
  const auto g = layer.backward(space, f, dy_local);
  const auto g_pinned = pinned.backward(space, f_pinned, dy_local);
  std::vector<std::pair<std::string, std::pair<std::vector<double>, std::vector<double>>>> results = {
      {"y", {y, y_pinned}}, {"dx", {host_values(g.dx), host_values(g_pinned.dx)}}};
  mlacp::for_each_parameter(
      [&](const mlacp::ParameterInfo& info, const auto& got, const auto& want) {
        if (info.present(config))
          results.push_back({std::string("d") + info.name, {host_values(got), host_values(want)}});
      },
      g, g_pinned);
  bool same_kernels = choice.chosen == mlacp::Bf16Compute::float32;
  if (!same_kernels) {
    const auto& a = layer.bf16_gemm_plan()->choices();
    const auto& b = pinned.bf16_gemm_plan()->choices();
    same_kernels = a.size() == b.size();
    for (auto i = a.begin(), j = b.begin(); same_kernels && i != a.end(); ++i, ++j)
      same_kernels = !(i->first < j->first) && !(j->first < i->first) && i->second.backend == j->second.backend;
  }
  for (const auto& [name, values] : results) {
    if (same_kernels) {
      EXPECT_EQ(values.first, values.second) << name;
    } else {
      EXPECT_LE(mlacp::test::relative_error(values.first, values.second), 2e-2) << name;
    }
  }
  // The choice is made once: a second forward keeps it and its times.
  auto again = layer.forward(space, x_local);
  EXPECT_EQ(layer.bf16_compute_choice().chosen, choice.chosen);
  EXPECT_EQ(layer.bf16_compute_choice().bf16_seconds, choice.bf16_seconds);
  // The path not chosen holds no memory: the layer's workspaces are the pinned layer's.
  EXPECT_EQ(layer.forward_workspaces(), pinned.forward_workspaces());
}

// A first call that needs no gradient (inference) times forwards only, and still chooses on every rank.
TEST(Bf16ComputeChoice, AnInferenceFirstCallChoosesToo) {
  auto config = config_of(mlacp::MlaStrategy::latent, mlacp::Bf16Compute::automatic);
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  const Space space;
  mlacp::MlaAttention<bf16> layer(config, mlacp::test::make_weights<bf16, Mem>(config, 7), mesh);
  LayerTensor<bf16> x("x", config.batch, layer.local_seq_for(config.seq), config.hidden);
  mlacp::test::fill(x, 11 + static_cast<std::uint64_t>(mesh.rank()), 1.0);
  auto f = layer.forward(space, x, mlacp::MlaRequiresGrad::none());
  EXPECT_FALSE(f.holds_workspace());
  EXPECT_NE(layer.bf16_compute_choice().chosen, mlacp::Bf16Compute::automatic);
  EXPECT_EQ(layer.forward_workspaces_in_use(), 0u);
}

TEST(Bf16ComputeChoice, NamesParseAndABadOneIsNamed) {
  for (const auto c : {mlacp::Bf16Compute::automatic, mlacp::Bf16Compute::bfloat16, mlacp::Bf16Compute::float32})
    EXPECT_EQ(mlacp::parse_bf16_compute(mlacp::to_string(c)), c);
  try {
    mlacp::parse_bf16_compute("fast");
    ADD_FAILURE() << "'fast' parsed";
  } catch (const mlacp::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'fast'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'auto', 'bf16' or 'float'"), std::string::npos) << e.what();
  }
}

// The one rule the layer and the memory model follow: a fixed configuration wins; auto takes MLACP_BF16_COMPUTE where
// it is set, and stays auto (the first forward chooses) where it is not. The layer reports what it was asked.
TEST(Bf16ComputeChoice, RequestedIsTheConfigurationElseTheEnvironment) {
  using mlacp::Bf16Compute;
  using mlacp::requested_bf16_compute;
  {
    const mlacp::test::ScopedEnvironment env("MLACP_BF16_COMPUTE", "float");
    EXPECT_EQ(requested_bf16_compute(Bf16Compute::bfloat16), Bf16Compute::bfloat16);
    EXPECT_EQ(requested_bf16_compute(Bf16Compute::automatic), Bf16Compute::float32);
    auto config = config_of(mlacp::MlaStrategy::latent, Bf16Compute::automatic);
    mlacp::Mesh mesh(MPI_COMM_WORLD);
    mlacp::MlaAttention<bf16> layer(config, mlacp::test::make_weights<bf16, Mem>(config, 7), mesh);
    EXPECT_EQ(layer.bf16_compute_choice().requested, Bf16Compute::float32);
    EXPECT_EQ(layer.bf16_compute_choice().chosen, Bf16Compute::float32);
  }
  {
    const mlacp::test::ScopedEnvironment env("MLACP_BF16_COMPUTE", nullptr);
    EXPECT_EQ(requested_bf16_compute(Bf16Compute::automatic), Bf16Compute::automatic);
    EXPECT_EQ(requested_bf16_compute(Bf16Compute::float32), Bf16Compute::float32);
  }
}

// Before any timing: auto on bf16 matrix hardware takes bf16; auto without it stays auto (timed); a fixed request
// stands either way. The layer's untimed choice (Bf16Compute.AutomaticTimesBothAgreesAndKeepsTheFaster) and the memory
// model's priced path (test_memory_model) both come from this function.
TEST(Bf16ComputeChoice, UntimedIsBf16OnlyForAutoOnBf16Hardware) {
  using mlacp::Bf16Compute;
  using mlacp::untimed_bf16_compute;
  EXPECT_EQ(untimed_bf16_compute(Bf16Compute::automatic, true), Bf16Compute::bfloat16);
  EXPECT_EQ(untimed_bf16_compute(Bf16Compute::automatic, false), Bf16Compute::automatic);
  for (const bool hardware : {true, false}) {
    EXPECT_EQ(untimed_bf16_compute(Bf16Compute::float32, hardware), Bf16Compute::float32) << hardware;
    EXPECT_EQ(untimed_bf16_compute(Bf16Compute::bfloat16, hardware), Bf16Compute::bfloat16) << hardware;
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, Bf16Compute,
                         ::testing::Values(mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded),
                         [](const ::testing::TestParamInfo<mlacp::MlaStrategy>& strategy) {
                           return std::string(mlacp::to_string(strategy.param));
                         });

}  // namespace
