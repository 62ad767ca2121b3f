// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// bf16 on the wire for float layers (issue 20 item 3, MlaConfig::wire_dtype): a float layer whose all-to-alls and
// latent all-gather (and with bf16_all the latent reduce-scatter) move bf16 against the float64 layer on one rank over
// the full sequence, on the same values (the float weights, x and dy widened to double): relative Frobenius error
// <= 2e-2 for y, dx and every weight gradient (docs/spec.md's bf16 tolerance), both strategies, an even split and S, H
// that the group size does not divide. Also: the default (`same`) is today's path bit for bit; the recorded schedule
// (launches, waits, compute phases, their order) is the same with bf16 on the wire; the collectives move half the
// bytes (collective_bytes.hpp, checked against the Views' shapes); and the combinations that make no sense are refused.
#include "layer_reference_checks.hpp"
#include "mla_test_data.hpp"
#include "mpi_test_harness.hpp"

#include <gtest/gtest.h>
#include <mpi.h>
#include <mlacp/collective_bytes.hpp>
#include <mlacp/diagnostics.hpp>
#include <mlacp/event_recorder.hpp>
#include <mlacp/mla/mla_attention.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
template <class T>
using Tensor3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
using mlacp::WireDtype;

constexpr double kTolerance = 2e-2;  // docs/spec.md: bf16 against the float64 reference
// fp8 E4M3 with a scale per row on the forward's exchanges (bf16 on the backward's): each value carries up to 2^-4
// relative error (3 mantissa bits), about 2^-4 / sqrt(3) = 3.6% RMS for values spread over a binade; the products and
// sums that follow average it down, and y, dx and the weight gradients measure 1-3% here (docs/wire.md). Held to
// 6e-2, three times bf16's, with a floor that says the codec does round.
constexpr double kFp8Tolerance = 6e-2;
double tolerance_of(WireDtype wire) { return wire == WireDtype::float8_e4m3 ? kFp8Tolerance : kTolerance; }

using mlacp::test::frobenius_norm;
using mlacp::test::host_values;
using mlacp::test::relative_error;
using mlacp::test::shard;
using mlacp::test::sum_over_ranks;

using mlacp::test::to_double;

struct Case {
  mlacp::MlaStrategy strategy;
  WireDtype wire;
  bool bias;
  int seq;
  int heads;
  std::string name;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(mlacp::to_string(info.param.strategy)) + "_" + mlacp::to_string(info.param.wire) +
         (info.param.bias ? "_bias_" : "_nobias_") + info.param.name;
}

mlacp::MlaConfig config_of(const Case& k) {
  auto c = mlacp::test::make_config(2, k.seq, 48, k.heads, 8, 4, 6, 12, k.bias, k.strategy);
  c.wire_dtype = k.wire;
  return c;
}

class MlaWire : public ::testing::TestWithParam<Case> {};

TEST_P(MlaWire, MatchesFloat64ReferenceWithin2e2) {
  const auto config = config_of(GetParam());
  mlacp::Mesh mesh(MPI_COMM_WORLD), self(MPI_COMM_SELF);
  const Space space;
  const auto w = mlacp::test::make_weights<float, Mem>(config, 42);
  Tensor3<float> x("x", config.batch, config.seq, config.hidden), dy("dy", config.batch, config.seq, config.hidden);
  mlacp::test::fill(x, 100, 1.0);
  mlacp::test::fill(dy, 200, 1.0);

  auto reference_config = config;
  reference_config.wire_dtype = WireDtype::same;
  mlacp::MlaAttention<double> reference(reference_config, to_double(config, w), self);
  auto ref_forward = reference.forward(space, to_double(x));
  const auto ref = reference.backward(space, ref_forward, to_double(dy));

  mlacp::MlaAttention<float> layer(config, w, mesh);
  const int rank = mesh.rank();
  const auto& seq = layer.seq_partition();
  auto f = layer.forward(space, shard(x, seq, rank));
  const auto g = layer.backward(space, f, shard(dy, seq, rank));

  const double y_error = relative_error(host_values(f.output()), host_values(shard(ref_forward.output(), seq, rank)));
  const double tolerance = tolerance_of(config.wire_dtype);
  EXPECT_LE(y_error, tolerance) << "y";
  const double dx_error = relative_error(host_values(g.dx), host_values(shard(ref.dx, seq, rank)));
  EXPECT_LE(dx_error, tolerance) << "dx";
  double floor = 0;  // as layer_reference_checks.hpp: a gradient that is rounding noise is measured against 1%
  for (const auto* v : {&ref.w_q, &ref.w_kva, &ref.w_kvb, &ref.w_o})
    floor = std::max(floor, 1e-2 * frobenius_norm(host_values(*v)));
  double worst = std::max(y_error, dx_error);
  std::string report;
  char buffer[64];
  mlacp::for_each_parameter(
      [&](const mlacp::ParameterInfo& info, const auto& got, const auto& want) {
        if (!info.present(config)) return;
        const double e = relative_error(sum_over_ranks(host_values(got)), host_values(want), floor);
        worst = std::max(worst, e);
        EXPECT_LE(e, tolerance) << "d" << info.name;
        std::snprintf(buffer, sizeof buffer, " d%s %.2e", info.name, e);
        report += buffer;
      },
      g, ref);
  // Every rank's worst (y and dx are per rank).
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (mesh.size() > 1) {
    // The wire rounds: bf16's 2^-9 relative shows in the result, unlike float's 1e-6.
    EXPECT_GT(worst, 1e-4) << "bf16 on the wire is as exact as float: is anything rounded?";
  } else {
    // P == 1: nothing is sent, nothing is rounded: float accuracy.
    EXPECT_LT(worst, 1e-4) << "at P == 1 nothing goes on the wire";
  }
  if (rank == 0)
    std::printf("[wire] P=%d %s: y %.2e dx %.2e%s; worst over ranks %.2e (tolerance %.0e)\n", mesh.size(),
                case_name(::testing::TestParamInfo<Case>(GetParam(), 0)).c_str(), y_error, dx_error, report.c_str(),
                worst, tolerance);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded})
    for (const auto wire : {WireDtype::bfloat16, WireDtype::bfloat16_all, WireDtype::float8_e4m3}) {
      out.push_back({strategy, wire, true, 32, 4, "even"});
      out.push_back({strategy, wire, false, 33, 5, "uneven_S33_H5"});
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaWire, ::testing::ValuesIn(cases()), case_name);

// One forward + backward of a float layer with `wire` on MPI_COMM_WORLD: y and dx on this rank, and what the
// collectives moved (collective_bytes.hpp) and recorded (the events, kind and name, forward and backward).
struct WireRun {
  std::vector<double> y, dx;
  mlacp::CollectiveBytes bytes;
  std::vector<std::pair<mlacp::EventKind, std::string>> events;
};

WireRun run(mlacp::MlaConfig config, const WireDtype* wire) {
  if (wire != nullptr) config.wire_dtype = *wire;
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  mlacp::MlaAttention<float> layer(config, mlacp::test::make_weights<float, Mem>(config, 7), mesh);
  Tensor3<float> x("x", config.batch, layer.local_seq(), config.hidden);
  Tensor3<float> dy("dy", config.batch, layer.local_seq(), config.hidden);
  mlacp::test::fill(x, 1 + mesh.rank(), 1.0);
  mlacp::test::fill(dy, 11 + mesh.rank(), 1.0);
  mlacp::reset_collective_bytes();
  mlacp::events::clear();
  mlacp::events::enable(true);
  auto f = layer.forward(Space(), x);
  const auto g = layer.backward(Space(), f, dy);
  mlacp::events::enable(false);
  WireRun out{host_values(f.output()), host_values(g.dx), mlacp::collective_bytes(), {}};
  for (const auto& e : mlacp::events::snapshot()) out.events.emplace_back(e.kind, e.name);
  return out;
}

// The default is today's path: a configuration that never mentions wire_dtype has `same`, which runs the float
// collectives unchanged (bit-equal y and dx with the setting absent and set to `same`), and bf16 does change the
// numbers at P > 1 (the setting is not ignored).
TEST(MlaWireDefault, SameIsTodaysPathBitForBit) {
  for (const auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    const auto config = mlacp::test::make_config(1, 32, 32, 4, 8, 4, 8, 16, true, strategy);
    EXPECT_EQ(config.wire_dtype, WireDtype::same);
    const WireDtype same = WireDtype::same, bf16 = WireDtype::bfloat16;
    const WireRun absent = run(config, nullptr), explicit_same = run(config, &same), wire = run(config, &bf16);
    EXPECT_EQ(absent.y, explicit_same.y) << mlacp::to_string(strategy);
    EXPECT_EQ(absent.dx, explicit_same.dx) << mlacp::to_string(strategy);
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) {
      int differs = absent.y != wire.y ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &differs, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      EXPECT_EQ(differs, 1) << mlacp::to_string(strategy) << ": wire_dtype = bf16 changed nothing";
    } else {
      EXPECT_EQ(absent.y, wire.y) << "P == 1: nothing on the wire, nothing rounded";
    }
  }
}

// The overlap schedule is the same with bf16 on the wire: the same launches, waits and compute phases, in the same
// order (the rounding runs before each launch, the widening after each wait, neither as a phase of its own).
TEST(MlaWireSchedule, SameEventsInTheSameOrder) {
  for (const auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded})
    for (const bool overlap : {true, false}) {
      auto config = mlacp::test::make_config(1, 32, 32, 4, 8, 4, 8, 16, false, strategy);
      config.overlap = overlap;
      const WireDtype same = WireDtype::same;
      const WireRun a = run(config, &same);
      EXPECT_FALSE(a.events.empty());
      for (const WireDtype wire : {WireDtype::bfloat16_all, WireDtype::float8_e4m3}) {
        const WireRun b = run(config, &wire);
        ASSERT_EQ(a.events.size(), b.events.size()) << mlacp::to_string(strategy) << " " << mlacp::to_string(wire);
        for (std::size_t i = 0; i < a.events.size(); ++i) {
          EXPECT_EQ(a.events[i].first, b.events[i].first) << "event " << i << " " << mlacp::to_string(wire);
          EXPECT_EQ(a.events[i].second, b.events[i].second) << "event " << i << " " << mlacp::to_string(wire);
        }
        std::size_t launches = 0;
        for (const auto& e : b.events) launches += e.first == mlacp::EventKind::launch ? 1 : 0;
        EXPECT_GE(launches, strategy == mlacp::MlaStrategy::latent ? 6u : 8u) << mlacp::to_string(strategy);
      }
    }
}

// bf16 on the wire moves half the bytes: every all-to-all and the all-gather with bf16; the latent reduce-scatter too
// with bf16_all and not with bf16. The float counts are the Views' shapes times 4 bytes (checked on an even split).
TEST(MlaWireBytes, HalfTheBytes) {
  int P = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  const int B = 2, S = 32, D = 32, H = 4, dn = 8, dr = 4, dv = 8, R = 16;
  const WireDtype same = WireDtype::same, bf16 = WireDtype::bfloat16, all = WireDtype::bfloat16_all;
  for (const auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    const auto config = mlacp::test::make_config(B, S, D, H, dn, dr, dv, R, false, strategy);
    const WireDtype fp8 = WireDtype::float8_e4m3;
    const WireRun full = run(config, &same), half = run(config, &bf16), all_half = run(config, &all),
                  eighth = run(config, &fp8);
    const char* name = mlacp::to_string(strategy);
    if (P == 1) {
      EXPECT_EQ(full.bytes.total(), 0u) << "P == 1 sends nothing";
      EXPECT_EQ(half.bytes.total(), 0u);
      continue;
    }
    // What the send buffers hold, in elements: each all-to-all sends its whole input, the all-gather its shard, the
    // reduce-scatter its whole [B, S, R+dr] of partial sums; the O exchange (per peer) the other ranks' tokens.
    const std::int64_t s = S / P, h = H / P, dqk = dn + dr;
    const std::int64_t o_exchange = B * (S - s) * h * dv, do_a2a = B * s * H * dv, q_a2a = B * s * H * dqk,
                       dq_a2a = B * S * h * dqk;
    std::int64_t a2a = q_a2a + dq_a2a + do_a2a, ag = 0, rs = 0;
    if (strategy == mlacp::MlaStrategy::latent) {
      ag = B * s * (R + dr);
      rs = B * S * (R + dr);
    } else {
      a2a += B * s * H * (dqk + dv) + B * S * h * (dqk + dv);  // K and V forward, and their inverses
    }
    if (S % P == 0 && H % P == 0) {  // (an uneven split, P = 3, sends blocks of other sizes: halving checked below)
      EXPECT_EQ(full.bytes.all_to_all, static_cast<std::uint64_t>(4 * a2a)) << name;
      EXPECT_EQ(full.bytes.all_gather, static_cast<std::uint64_t>(4 * ag)) << name;
      EXPECT_EQ(full.bytes.reduce_scatter, static_cast<std::uint64_t>(4 * rs)) << name;
      EXPECT_EQ(full.bytes.send_recv, static_cast<std::uint64_t>(4 * o_exchange)) << name;
      // fp8: each forward row (one head of one token; one token's payload) as its codes and a 4-byte scale; the
      // backward's all-to-alls in bf16; the reduce-scatter's partial sums in float.
      std::int64_t fwd = B * s * H * (dqk + 4), bwd = 2 * (dq_a2a + do_a2a);
      if (strategy == mlacp::MlaStrategy::expanded) {
        fwd += B * s * H * (dqk + 4) + B * s * H * (dv + 4);
        bwd += 2 * B * S * h * (dqk + dv);
      }
      EXPECT_EQ(eighth.bytes.all_to_all, static_cast<std::uint64_t>(fwd + bwd)) << name;
      EXPECT_EQ(eighth.bytes.all_gather, static_cast<std::uint64_t>(ag == 0 ? 0 : B * s * (R + dr + 4))) << name;
      EXPECT_EQ(eighth.bytes.reduce_scatter, full.bytes.reduce_scatter) << name;
      EXPECT_EQ(eighth.bytes.send_recv, static_cast<std::uint64_t>(B * (S - s) * h * (dv + 4))) << name;
    }
    EXPECT_EQ(2 * half.bytes.all_to_all, full.bytes.all_to_all) << name;
    EXPECT_EQ(2 * half.bytes.all_gather, full.bytes.all_gather) << name;
    EXPECT_EQ(2 * half.bytes.send_recv, full.bytes.send_recv) << name;
    EXPECT_EQ(half.bytes.reduce_scatter, full.bytes.reduce_scatter) << name << ": bf16 keeps float partial sums";
    EXPECT_EQ(2 * all_half.bytes.total(), full.bytes.total()) << name;
    if (mlacp::test::world_rank() == 0)
      std::printf("[wire] P=%d %s: bytes sent per forward + backward: same %llu, bf16 %llu, bf16_all %llu\n", P, name,
                  static_cast<unsigned long long>(full.bytes.total()),
                  static_cast<unsigned long long>(half.bytes.total()),
                  static_cast<unsigned long long>(all_half.bytes.total()));
    if (mlacp::test::world_rank() == 0)
      std::printf("[wire] P=%d %s: bytes of the forward's exchanges: same %llu, fp8 %llu\n", P, name,
                  static_cast<unsigned long long>(full.bytes.all_gather + full.bytes.send_recv),
                  static_cast<unsigned long long>(eighth.bytes.all_gather + eighth.bytes.send_recv));
  }
}

// The wire's bf16 buffers belong to the schedule's scratch: allocated by the first iteration, reused by every later
// one (no View, no communication buffer), as the float path's.
TEST(MlaWireMemory, SteadyStateAllocatesNothing) {
  ASSERT_TRUE(mlacp::diagnostics::count_view_allocations());
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  for (const auto strategy : {mlacp::MlaStrategy::latent, mlacp::MlaStrategy::expanded}) {
    auto c = mlacp::test::make_config(2, 33, 16, 5, 4, 2, 3, 6, true, strategy);  // uneven at P = 2, 3, 4
    c.wire_dtype = strategy == mlacp::MlaStrategy::latent ? WireDtype::bfloat16_all : WireDtype::float8_e4m3;
    mlacp::MlaAttention<float> layer(c, mlacp::test::make_weights<float, Mem>(c, 3), mesh);
    Tensor3<float> x("x", c.batch, layer.local_seq(), c.hidden);
    mlacp::test::fill(x, 4, 1.0);
    mlacp::MlaGradients<float, Mem> g;
    static_cast<mlacp::MlaParameters<float, Mem>&>(g) = mlacp::MlaParameters<float, Mem>::allocate(c, "my ");
    g.dx = decltype(g.dx)("my dx", c.batch, layer.local_seq(), c.hidden);
    auto step = [&] {
      auto forward = layer.forward(Space(), x);
      layer.backward(Space(), forward, x, g);
    };
    step();
    const auto views = mlacp::diagnostics::view_allocations();
    const auto buffers = mlacp::diagnostics::communication_buffer_allocations();
    for (int i = 0; i < 3; ++i) step();
    EXPECT_EQ(mlacp::diagnostics::view_allocations(), views) << mlacp::to_string(strategy);
    EXPECT_EQ(mlacp::diagnostics::communication_buffer_allocations(), buffers) << mlacp::to_string(strategy);
  }
}

TEST(MlaWireConfig, NamesAndDescription) {
  for (const auto wire : {WireDtype::same, WireDtype::bfloat16, WireDtype::bfloat16_all, WireDtype::float8_e4m3})
    EXPECT_EQ(mlacp::parse_wire_dtype(mlacp::to_string(wire)), wire);
  EXPECT_STREQ(mlacp::to_string(WireDtype::float8_e4m3), "fp8");
  mlacp::test::expect_error<mlacp::InvalidArgument>([] { mlacp::parse_wire_dtype("fp16"); },
                                                    "wire dtype 'fp16' is not known; expected one of 'same', 'bf16', "
                                                    "'bf16_all', 'fp8'");
  auto config = mlacp::test::make_config(1, 8, 16, 2, 4, 2, 4, 8);
  EXPECT_NE(config.describe().find(" wire=same"), std::string::npos) << config.describe();
  config.wire_dtype = WireDtype::bfloat16;
  EXPECT_NE(config.describe().find(" wire=bf16"), std::string::npos) << config.describe();
}

// A double layer (the accuracy reference) refuses bf16 on the wire, on every rank; a bf16 layer accepts it (its wire
// is bf16 already); bf16_all refuses the mpi reduce-scatter algorithm (no bf16 sum) where the reduce-scatter runs.
TEST(MlaWireConfig, RefusesWhatMakesNoSense) {
  mlacp::Mesh mesh(MPI_COMM_WORLD);
  auto config = mlacp::test::make_config(1, 8 * mesh.size(), 16, 2, 4, 2, 4, 8);
  config.wire_dtype = WireDtype::bfloat16;
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 1), mesh); },
      "mlacp::MlaAttention: wire_dtype = bf16 on a double layer; expected wire_dtype = same");
  EXPECT_NO_THROW({
    mlacp::MlaAttention<mlacp::bf16> layer(config, mlacp::test::make_weights<mlacp::bf16, Mem>(config, 1), mesh);
  });
  config.wire_dtype = WireDtype::float8_e4m3;  // the fp8 codec carries float payloads only
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] { mlacp::MlaAttention<double> layer(config, mlacp::test::make_weights<double, Mem>(config, 1), mesh); },
      "mlacp::MlaAttention: wire_dtype = fp8 on a double layer; expected wire_dtype = same");
  mlacp::test::expect_error<mlacp::InvalidArgument>(
      [&] {
        mlacp::MlaAttention<mlacp::bf16> layer(config, mlacp::test::make_weights<mlacp::bf16, Mem>(config, 1), mesh);
      },
      "mlacp::MlaAttention: wire_dtype = fp8 on a bf16 layer; expected wire_dtype = same, bf16 or bf16_all");
  config.strategy = mlacp::MlaStrategy::latent;  // its reduce-scatter stays float: the mpi algorithm may sum it
  mesh.set_reduce_scatter_algorithm(mlacp::ReduceScatterAlgorithm::mpi);
  EXPECT_NO_THROW(
      { mlacp::MlaAttention<float> layer(config, mlacp::test::make_weights<float, Mem>(config, 1), mesh); });
  mesh.set_reduce_scatter_algorithm(mlacp::ReduceScatterAlgorithm::pairwise);

  config.wire_dtype = WireDtype::bfloat16_all;
  mesh.set_reduce_scatter_algorithm(mlacp::ReduceScatterAlgorithm::mpi);
  if (mesh.size() > 1) {
    mlacp::test::expect_error<mlacp::InvalidArgument>(
        [&] { mlacp::MlaAttention<float> layer(config, mlacp::test::make_weights<float, Mem>(config, 1), mesh); },
        "wire_dtype = bf16_all moves the latent reduce-scatter's partial sums as bf16, which the mpi reduce-scatter "
        "algorithm");
  }
  config.strategy = mlacp::MlaStrategy::expanded;  // no reduce-scatter: nothing to refuse
  EXPECT_NO_THROW(
      { mlacp::MlaAttention<float> layer(config, mlacp::test::make_weights<float, Mem>(config, 1), mesh); });
  config.strategy = mlacp::MlaStrategy::latent;
  config.wire_dtype = WireDtype::bfloat16;  // float partial sums: MPI sums them
  EXPECT_NO_THROW(
      { mlacp::MlaAttention<float> layer(config, mlacp::test::make_weights<float, Mem>(config, 1), mesh); });
}

}  // namespace
