// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of the tiled (flash-style) causal attention core against the reference core (CausalAttentionCore, one thread
// per row, checked against a naive S x S softmax and finite differences in test_mla_kernels.cpp): both paths (BLAS
// tiles, team scratch), tiles that do and do not divide S, query and key tiles of different sizes, scores large
// enough to overflow without the running max, the gradient flags, long sequences in float against double, and the
// tile options.
#include "kernel_test_support.hpp"

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include <mlacp/mla/attention_core.hpp>
#include <mlacp/mla/flash_attention.hpp>
#include <mlacp/mla/softmax_exp.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using mlacp::FlashAttentionPath;
using mlacp::test::kernels::rel_error;
using mlacp::test::kernels::to_vec;
using mlacp::test::kernels::Vec;
using mlacp::test::kernels::View3;
using mlacp::test::kernels::View4;

/// Exact up to rounding; float's bound allows the tiled core's different summation order over long key ranges.
template <class T>
double tol() {
  return std::is_same_v<T, double> ? 1e-12 : 2e-5;
}

template <class V>
void fill(const V& v, std::uint32_t seed, double magnitude, bool integers = false) {
  auto h = Kokkos::create_mirror_view(v);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-magnitude, magnitude);
  for (std::size_t i = 0; i < h.span(); ++i) {
    const double x = dist(gen);
    h.data()[i] = static_cast<typename V::non_const_value_type>(integers ? std::round(x) : x);
  }
  Kokkos::deep_copy(v, h);
}

/// ||a - ref|| / max(||ref||, 1): relative where the reference is of order one or more, absolute where it vanishes
/// (the gradients of a one-token sequence are zero up to rounding).
double error(const Vec& a, const Vec& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1.0));
}

struct Shape {
  int b, s, h, dqk, dv;
};

/// Inputs, forward outputs and gradients of one attention problem.
template <class T>
struct Problem {
  View4<T> q, k, v, o, d_o, dq, dk, dv;
  View3<T> lse;
  Problem(const Shape& sh, double magnitude, bool integers)
      : q("q", sh.b, sh.s, sh.h, sh.dqk),
        k("k", sh.b, sh.s, sh.h, sh.dqk),
        v("v", sh.b, sh.s, sh.h, sh.dv),
        o("o", sh.b, sh.s, sh.h, sh.dv),
        d_o("d_o", sh.b, sh.s, sh.h, sh.dv),
        dq("dq", sh.b, sh.s, sh.h, sh.dqk),
        dk("dk", sh.b, sh.s, sh.h, sh.dqk),
        dv("dv", sh.b, sh.s, sh.h, sh.dv),
        lse("lse", sh.b, sh.h, sh.s) {
    fill(q, 1, magnitude, integers);
    fill(k, 2, magnitude, integers);
    fill(v, 3, 1.0);
    fill(d_o, 4, 1.0);
  }
  /// Runs forward and backward with `core`; the outputs and gradients start as garbage (they must be overwritten).
  template <class Core>
  void run(const Core& core) {
    for (const auto& out : {o, dq, dk, dv}) Kokkos::deep_copy(out, T(42));
    Kokkos::deep_copy(lse, T(42));
    ExecSpace space;
    core.forward(space, q, k, v, o, lse);
    core.backward(space, q, k, v, o, lse, d_o, dq, dk, dv);
    space.fence();
  }
};

mlacp::FlashAttentionCore flash(FlashAttentionPath path, int tq, int tk) {
  mlacp::FlashAttentionOptions o;
  o.path = path;
  o.query_tile = tq;
  o.key_tile = tk;
  return mlacp::FlashAttentionCore(o);
}

template <class T>
class FlashAttention : public ::testing::Test {};
using ValueTypes = ::testing::Types<double, float>;
TYPED_TEST_SUITE(FlashAttention, ValueTypes);

/// Every (path, tiles) against the reference core, forward (o, lse) and backward (dq, dk, dv).
TYPED_TEST(FlashAttention, MatchesReferenceCoreForEveryPathAndTiling) {
  using T = TypeParam;
  const std::vector<std::pair<int, int>> tilings = {{1, 1}, {3, 5}, {5, 3}, {4, 4}, {8, 16}, {16, 8}, {64, 64}, {0, 0}};
  const std::vector<Shape> shapes = {{2, 13, 3, 5, 3}, {1, 37, 2, 8, 6}, {1, 1, 1, 4, 4}};
  for (const Shape& sh : shapes) {
    // Magnitude 40 with integer entries gives scores of thousands: exp overflows without the running max.
    for (const double magnitude : {1.0, 40.0}) {
      Problem<T> ref(sh, magnitude, magnitude > 10.0);
      ref.run(mlacp::CausalAttentionCore{});
      for (const auto path : {FlashAttentionPath::blas, FlashAttentionPath::team}) {
        for (const auto& [tq, tk] : tilings) {
          Problem<T> got(sh, magnitude, magnitude > 10.0);
          got.run(flash(path, tq, tk));
          const std::string where = std::string(path == FlashAttentionPath::blas ? "blas" : "team") + " tiles " +
                                    std::to_string(tq) + "x" + std::to_string(tk) + " S=" + std::to_string(sh.s) +
                                    " magnitude " + std::to_string(magnitude);
          EXPECT_LT(error(to_vec(got.o), to_vec(ref.o)), tol<T>()) << where;
          EXPECT_LT(error(to_vec(got.lse), to_vec(ref.lse)), tol<T>()) << where;
          EXPECT_LT(error(to_vec(got.dq), to_vec(ref.dq)), tol<T>()) << where;
          EXPECT_LT(error(to_vec(got.dk), to_vec(ref.dk)), tol<T>()) << where;
          EXPECT_LT(error(to_vec(got.dv), to_vec(ref.dv)), tol<T>()) << where;
        }
      }
    }
  }
}

/// An empty gradient View means "not needed": its work is skipped and the others are unchanged.
TYPED_TEST(FlashAttention, SkipsGradientsThatAreNotNeeded) {
  using T = TypeParam;
  const Shape sh{1, 21, 2, 6, 4};
  for (const auto path : {FlashAttentionPath::blas, FlashAttentionPath::team}) {
    const auto core = flash(path, 4, 8);
    Problem<T> all(sh, 1.0, false);
    all.run(core);
    for (int mask = 0; mask < 8; ++mask) {
      Problem<T> p(sh, 1.0, false);
      ExecSpace space;
      core.forward(space, p.q, p.k, p.v, p.o, p.lse);
      View4<T> dq = mask & 1 ? p.dq : View4<T>(), dk = mask & 2 ? p.dk : View4<T>(), dv = mask & 4 ? p.dv : View4<T>();
      core.backward(space, p.q, p.k, p.v, p.o, p.lse, p.d_o, dq, dk, dv);
      space.fence();
      if (mask & 1) {
        EXPECT_EQ(to_vec(dq), to_vec(all.dq)) << "mask " << mask;
      }
      if (mask & 2) {
        EXPECT_EQ(to_vec(dk), to_vec(all.dk)) << "mask " << mask;
      }
      if (mask & 4) {
        EXPECT_EQ(to_vec(dv), to_vec(all.dv)) << "mask " << mask;
      }
    }
  }
}

/// Long sequences: float keeps float accuracy against double (softmax statistics and the row term in double, no
/// sum whose error grows with S beyond the GEMMs' own).
TEST(FlashAttentionLong, FloatAgreesWithDoubleAtS4096) {
  const Shape sh{1, 4096, 1, 32, 32};
  Problem<double> d(sh, 2.0, false);
  d.run(mlacp::FlashAttentionCore{});
  Problem<float> f(sh, 2.0, false);
  f.run(mlacp::FlashAttentionCore{});
  EXPECT_LT(rel_error(to_vec(f.o), to_vec(d.o)), 1e-5);
  EXPECT_LT(rel_error(to_vec(f.lse), to_vec(d.lse)), 1e-6);
  EXPECT_LT(rel_error(to_vec(f.dq), to_vec(d.dq)), 1e-4);
  EXPECT_LT(rel_error(to_vec(f.dk), to_vec(d.dk)), 1e-4);
  EXPECT_LT(rel_error(to_vec(f.dv), to_vec(d.dv)), 1e-5);
}

/// The portable team path agrees with the BLAS path on a longer sequence with several tiles per row.
TEST(FlashAttentionLong, TeamPathAgreesWithBlasPathAtS1024) {
  const Shape sh{1, 1024, 2, 24, 16};
  Problem<double> blas(sh, 2.0, false);
  blas.run(flash(FlashAttentionPath::blas, 0, 0));
  Problem<double> team(sh, 2.0, false);
  team.run(flash(FlashAttentionPath::team, 0, 0));
  EXPECT_LT(rel_error(to_vec(team.o), to_vec(blas.o)), 1e-12);
  EXPECT_LT(rel_error(to_vec(team.dq), to_vec(blas.dq)), 1e-12);
  EXPECT_LT(rel_error(to_vec(team.dk), to_vec(blas.dk)), 1e-12);
  EXPECT_LT(rel_error(to_vec(team.dv), to_vec(blas.dv)), 1e-12);
}

/// The softmax's exp against the C library's over the arguments it gets (<= 0), within a few ulp, and 0 where e^x is
/// below the smallest normal number.
TEST(SoftmaxExp, AgreesWithTheCLibrary) {
  double worst_d = 0, worst_f = 0;
  for (double x = -745.0; x <= 1e-3; x += 0.0173) {
    const double want = std::exp(x);
    const double got = mlacp::detail::softmax_exp(x);
    if (want >= 2.3e-308)
      worst_d = std::max(worst_d, std::abs(got - want) / want);
    else
      EXPECT_LE(got, 2.3e-308) << x;
    const auto xf = static_cast<float>(x);
    const double want_f = std::exp(static_cast<double>(xf));
    const double got_f = mlacp::detail::softmax_exp(xf);
    if (want_f >= 1.2e-38)
      worst_f = std::max(worst_f, std::abs(got_f - want_f) / want_f);
    else
      EXPECT_LE(got_f, 1.2e-38) << x;
  }
  EXPECT_LT(worst_d, 4 * 2.2e-16);
  EXPECT_LT(worst_f, 4 * 1.2e-7);
  EXPECT_EQ(mlacp::detail::softmax_exp(0.0), 1.0);
  EXPECT_EQ(mlacp::detail::softmax_exp(0.0f), 1.0f);
  EXPECT_EQ(mlacp::detail::softmax_exp(-1e6), 0.0);
  EXPECT_EQ(mlacp::detail::softmax_exp(-1e6f), 0.0f);
}

std::string invalid_argument_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const mlacp::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(FlashAttentionOptions, TilesFromOptionsEnvironmentAndDefaults) {
  mlacp::FlashAttentionOptions o;
  EXPECT_EQ(mlacp::detail::flash_tiles(o, true),
            std::make_pair(mlacp::flash_default_query_tile_blas, mlacp::flash_default_key_tile_blas));
  EXPECT_EQ(mlacp::detail::flash_tiles(o, false),
            std::make_pair(mlacp::flash_default_query_tile_team, mlacp::flash_default_key_tile_team));
  ::setenv("MLACP_ATTENTION_TILES", "48x96", 1);
  EXPECT_EQ(mlacp::detail::flash_tiles(o, true), std::make_pair(48, 96));
  o.key_tile = 7;  // explicit options win over the environment
  EXPECT_EQ(mlacp::detail::flash_tiles(o, true), std::make_pair(48, 7));
  for (const char* bad : {"48", "0x8", "8x", "x8", "8x8x8", "-4x8", "abc"}) {
    ::setenv("MLACP_ATTENTION_TILES", bad, 1);
    EXPECT_NE(invalid_argument_message([&] {
                mlacp::detail::flash_tiles({}, true);
              }).find(std::string("MLACP_ATTENTION_TILES='") + bad + "'; expected QxK"),
              std::string::npos)
        << bad;
  }
  ::unsetenv("MLACP_ATTENTION_TILES");
  o = {};
  o.query_tile = -1;
  EXPECT_NE(invalid_argument_message([&] { mlacp::detail::flash_tiles(o, true); }).find("query_tile = -1"),
            std::string::npos);
}

TEST(FlashAttentionOptions, RejectsMismatchedShapes) {
  ExecSpace space;
  View4<double> q("q", 1, 4, 2, 3), k("k", 1, 4, 2, 3), v("v", 1, 4, 2, 5), o("o", 1, 4, 2, 4);
  View3<double> lse("lse", 1, 2, 4);
  const std::string msg =
      invalid_argument_message([&] { mlacp::FlashAttentionCore{}.forward(space, q, k, v, o, lse); });
  EXPECT_NE(msg.find("o is [1, 4, 2, 4], expected [1, 4, 2, 5]"), std::string::npos) << msg;
}

}  // namespace
