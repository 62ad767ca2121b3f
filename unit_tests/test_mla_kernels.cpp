// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of the single-process MLA kernels (RoPE, RMSNorm, causal attention core, row sums) and of the host reference
// forward, on the default execution space, in float and double.
#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include <mlacp/mla/attention_core.hpp>
#include <mlacp/mla/kv_layout.hpp>
#include <mlacp/mla/reductions.hpp>
#include <mlacp/mla/rms_norm.hpp>
#include <mlacp/mla/rope.hpp>
#include <mlacp/mla/view_utils.hpp>
#include <mlacp/testing/reference_forward.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
template <class T>
using View1 = Kokkos::View<T*, Kokkos::LayoutRight, MemSpace>;
template <class T>
using View2 = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;
template <class T>
using View3 = Kokkos::View<T***, Kokkos::LayoutRight, MemSpace>;
template <class T>
using View4 = Kokkos::View<T****, Kokkos::LayoutRight, MemSpace>;
using Vec = std::vector<double>;

/// Relative tolerance where the result is exact up to rounding.
template <class T>
double tol() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}

/// The View's elements (contiguous, LayoutRight order) as doubles.
template <class V>
Vec to_vec(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  Vec out(h.span());
  for (std::size_t i = 0; i < h.span(); ++i) out[i] = static_cast<double>(h.data()[i]);
  return out;
}

/// Writes a flat vector (LayoutRight order) into the View.
template <class V>
void from_vec(const V& v, const Vec& values) {
  auto h = Kokkos::create_mirror_view(v);
  EXPECT_EQ(h.span(), values.size());
  for (std::size_t i = 0; i < h.span(); ++i) h.data()[i] = static_cast<typename V::non_const_value_type>(values[i]);
  Kokkos::deep_copy(v, h);
}

Vec random_vec(std::size_t n, std::uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

/// Rounds every value through T (so that float and double runs see the same inputs).
template <class T>
Vec rounded(Vec v) {
  for (auto& x : v) x = static_cast<double>(static_cast<T>(x));
  return v;
}

/// ||a - ref|| / ||ref|| (Frobenius).
double rel_error(const Vec& a, const Vec& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// Central finite differences of a scalar function of a vector, in double.
Vec finite_difference(const Vec& x0, const std::function<double(const Vec&)>& f, double h = 1e-5) {
  Vec g(x0.size());
  Vec x = x0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = x0[i] + h;
    const double fp = f(x);
    x[i] = x0[i] - h;
    const double fm = f(x);
    x[i] = x0[i];
    g[i] = (fp - fm) / (2.0 * h);
  }
  return g;
}

/// The message of the mlacp::InvalidArgument that fn throws ("" when it throws none).
std::string invalid_argument_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const mlacp::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

template <class T>
class MlaKernels : public ::testing::Test {};
using ValueTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(MlaKernels, ValueTypes);

// ---- RoPE -----------------------------------------------------------------------------------------------------------

/// MLA_SPEC step 4 directly: rotates columns [first, first+width) of each row of length d at position offset + t.
Vec rope_host(Vec x, int n_b, int n_s, int n_h, int d, int first, int width, std::int64_t offset) {
  const int half = width / 2;
  for (int b = 0; b < n_b; ++b) {
    for (int t = 0; t < n_s; ++t) {
      for (int n = 0; n < n_h; ++n) {
        double* row = &x[((static_cast<std::size_t>(b) * n_s + t) * n_h + n) * d + first];
        Vec rotated(width);
        for (int e = 0; e < width; ++e) {
          const int j = e % half;
          const double theta = static_cast<double>(offset + t) * std::pow(10000.0, -2.0 * j / width);
          const double rot_half = e < half ? -row[e + half] : row[e - half];
          rotated[e] = row[e] * std::cos(theta) + rot_half * std::sin(theta);
        }
        for (int e = 0; e < width; ++e) row[e] = rotated[e];
      }
    }
  }
  return x;
}

TYPED_TEST(MlaKernels, RopeForwardMatchesSpecFormulaAndLeavesOtherColumns) {
  using T = TypeParam;
  const int n_b = 2, n_s = 3, n_h = 2, d = 11, first = 3, width = 6;
  const std::int64_t offset = 1000003;
  ExecSpace space;
  View4<T> x("x", n_b, n_s, n_h, d);
  const Vec x0 = rounded<T>(random_vec(x.size(), 1));
  from_vec(x, x0);
  mlacp::rope_forward(space, x, first, width, offset);
  space.fence();
  const Vec got = to_vec(x);
  const Vec expected = rope_host(x0, n_b, n_s, n_h, d, first, width, offset);
  EXPECT_LT(rel_error(got, expected), tol<T>());
  EXPECT_GT(rel_error(got, x0), 0.1);  // it did rotate
  for (std::size_t i = 0; i < got.size(); ++i) {
    const int col = static_cast<int>(i % d);
    if (col < first || col >= first + width) {
      EXPECT_EQ(got[i], x0[i]) << "column " << col << " was touched";
    }
  }
}

TYPED_TEST(MlaKernels, RopeBackwardInvertsForwardAndIsItsAdjoint) {
  using T = TypeParam;
  const int n_b = 2, n_s = 5, n_h = 3, d = 8, first = 2, width = 6;
  const std::int64_t offset = 37;
  ExecSpace space;
  View4<T> x("x", n_b, n_s, n_h, d);
  View4<T> y("y", n_b, n_s, n_h, d);
  const Vec x0 = rounded<T>(random_vec(x.size(), 2));
  const Vec y0 = rounded<T>(random_vec(y.size(), 3));
  from_vec(x, x0);
  from_vec(y, y0);
  mlacp::rope_forward(space, x, first, width, offset);
  mlacp::rope_backward(space, y, first, width, offset);
  space.fence();
  const Vec fx = to_vec(x);
  const Vec by = to_vec(y);
  // <rope(x), y> == <x, rope^T(y)>
  const double lhs = dot(fx, y0), rhs = dot(x0, by);
  EXPECT_LT(std::abs(lhs - rhs) / std::abs(lhs), tol<T>()) << lhs << " vs " << rhs;
  // rope^T(rope(x)) == x
  mlacp::rope_backward(space, x, first, width, offset);
  space.fence();
  EXPECT_LT(rel_error(to_vec(x), x0), tol<T>());
}

TYPED_TEST(MlaKernels, RopeOnRank3ThroughAsRank4) {
  using T = TypeParam;
  const int n_b = 2, n_s = 4, r = 5, dr = 4;
  const std::int64_t offset = 12;
  ExecSpace space;
  View3<T> payload("payload", n_b, n_s, r + dr);
  const Vec p0 = rounded<T>(random_vec(payload.size(), 4));
  from_vec(payload, p0);
  auto p4 = mlacp::as_rank4(payload);
  static_assert(mlacp::compat::view_rank_v<decltype(p4)> == 4);
  ASSERT_EQ(p4.data(), payload.data());
  ASSERT_EQ(p4.extent(2), 1u);
  mlacp::rope_forward(space, p4, r, dr, offset);
  space.fence();
  EXPECT_LT(rel_error(to_vec(payload), rope_host(p0, n_b, n_s, 1, r + dr, r, dr, offset)), tol<T>());
}

TYPED_TEST(MlaKernels, RopeRejectsBadArgumentsNamingTheValue) {
  using T = TypeParam;
  ExecSpace space;
  View4<T> x("x", 1, 2, 1, 8);
  auto rope = [&](int first, int width) { return [=] { mlacp::rope_forward(space, x, first, width, 0); }; };
  EXPECT_NE(invalid_argument_message(rope(0, 3)).find("width = 3"), std::string::npos);
  EXPECT_NE(invalid_argument_message(rope(0, 0)).find("width = 0"), std::string::npos);
  EXPECT_NE(invalid_argument_message(rope(0, -2)).find("width = -2"), std::string::npos);
  EXPECT_NE(invalid_argument_message(rope(-1, 2)).find("first_column = -1"), std::string::npos);
  const std::string too_far = invalid_argument_message(rope(4, 6));
  EXPECT_NE(too_far.find("first_column = 4"), std::string::npos) << too_far;
  EXPECT_NE(too_far.find("width = 6"), std::string::npos) << too_far;
  EXPECT_NE(invalid_argument_message([&] { mlacp::rope_backward(space, x, 0, 5, 0); }).find("width = 5"),
            std::string::npos);
  EXPECT_EQ(invalid_argument_message(rope(2, 6)), "");  // the last valid placement
}

// ---- RMSNorm --------------------------------------------------------------------------------------------------------

struct RmsShape {
  int n_b = 2, n_s = 5, w_in = 11, r = 8, w_out = 9;
};

/// y columns [0, r) and rstd of the spec's formula, from x [n_b, n_s, w_in] and g [r].
void rms_host(const RmsShape& sh, const Vec& x, const Vec& g, Vec& y, Vec& rstd) {
  const int tokens = sh.n_b * sh.n_s;
  y.assign(static_cast<std::size_t>(tokens) * sh.r, 0.0);
  rstd.assign(tokens, 0.0);
  for (int tok = 0; tok < tokens; ++tok) {
    double ss = 0.0;
    for (int j = 0; j < sh.r; ++j) ss += x[tok * sh.w_in + j] * x[tok * sh.w_in + j];
    rstd[tok] = 1.0 / std::sqrt(ss / sh.r + 1e-6);
    for (int j = 0; j < sh.r; ++j) y[tok * sh.r + j] = x[tok * sh.w_in + j] * rstd[tok] * g[j];
  }
}

TYPED_TEST(MlaKernels, RmsNormForwardMatchesFormulaAndLeavesOtherColumns) {
  using T = TypeParam;
  const RmsShape sh;
  const double sentinel = 7.0;
  ExecSpace space;
  View3<T> x("x", sh.n_b, sh.n_s, sh.w_in);
  View3<T> y("y", sh.n_b, sh.n_s, sh.w_out);
  View1<T> g("g", sh.r);
  View1<T> rstd("rstd", sh.n_b * sh.n_s);
  const Vec x0 = rounded<T>(random_vec(x.size(), 5));
  const Vec g0 = rounded<T>(random_vec(g.size(), 6, 0.5, 1.5));
  from_vec(x, x0);
  from_vec(g, g0);
  Kokkos::deep_copy(y, static_cast<T>(sentinel));
  mlacp::rms_norm_forward(space, x, g, y, rstd);
  space.fence();
  Vec y_ref, rstd_ref;
  rms_host(sh, x0, g0, y_ref, rstd_ref);
  const Vec y_got = to_vec(y);
  Vec y_first_r;
  for (std::size_t i = 0; i < y_got.size(); ++i) {
    const int col = static_cast<int>(i % sh.w_out);
    if (col < sh.r) {
      y_first_r.push_back(y_got[i]);
    } else {
      EXPECT_EQ(y_got[i], sentinel) << "column " << col << " was touched";
    }
  }
  EXPECT_LT(rel_error(y_first_r, y_ref), tol<T>());
  EXPECT_LT(rel_error(to_vec(rstd), rstd_ref), tol<T>());

  View3<T> bad("bad", sh.n_b, sh.n_s, sh.r - 1);
  EXPECT_NE(invalid_argument_message([&] { mlacp::rms_norm_forward(space, x, g, bad, rstd); }).find("y_out"),
            std::string::npos);
}

struct RmsGrads {
  Vec dx;  ///< [n_b, n_s, w_in], as the kernel leaves it (sentinel beyond r)
  Vec dg;  ///< [r], the accumulated value
};

/// Runs forward then backward in U; dx starts as the sentinel, dgain as dg_init.
template <class U>
RmsGrads rms_grads(const RmsShape& sh, const Vec& x0, const Vec& g0, const Vec& dy0, const Vec& dg_init,
                   double sentinel) {
  ExecSpace space;
  View3<U> x("x", sh.n_b, sh.n_s, sh.w_in);
  View3<U> y("y", sh.n_b, sh.n_s, sh.w_out);
  View3<U> dy("dy", sh.n_b, sh.n_s, sh.w_out);
  View3<U> dx("dx", sh.n_b, sh.n_s, sh.w_in);
  View1<U> g("g", sh.r);
  View1<U> dg("dg", sh.r);
  View1<U> rstd("rstd", sh.n_b * sh.n_s);
  from_vec(x, x0);
  from_vec(g, g0);
  from_vec(dy, dy0);
  from_vec(dg, dg_init);
  Kokkos::deep_copy(dx, static_cast<U>(sentinel));
  mlacp::rms_norm_forward(space, x, g, y, rstd);
  mlacp::rms_norm_backward(space, x, g, rstd, dy, dx, dg);
  space.fence();
  return {to_vec(dx), to_vec(dg)};
}

/// L = sum over columns [0, r) of y * dy, in double.
double rms_loss(const RmsShape& sh, const Vec& x, const Vec& g, const Vec& dy) {
  Vec y, rstd;
  rms_host(sh, x, g, y, rstd);
  double loss = 0.0;
  for (int tok = 0; tok < sh.n_b * sh.n_s; ++tok) {
    for (int j = 0; j < sh.r; ++j) loss += y[tok * sh.r + j] * dy[tok * sh.w_out + j];
  }
  return loss;
}

TYPED_TEST(MlaKernels, RmsNormBackwardMatchesFiniteDifferences) {
  using T = TypeParam;
  const RmsShape sh;
  const double sentinel = -3.0;
  const Vec x0 = rounded<T>(random_vec(static_cast<std::size_t>(sh.n_b) * sh.n_s * sh.w_in, 7));
  const Vec g0 = rounded<T>(random_vec(sh.r, 8, 0.5, 1.5));
  const Vec dy0 = rounded<T>(random_vec(static_cast<std::size_t>(sh.n_b) * sh.n_s * sh.w_out, 9));
  const Vec dg_init = rounded<T>(random_vec(sh.r, 10));

  const RmsGrads in_double = rms_grads<double>(sh, x0, g0, dy0, dg_init, sentinel);
  const RmsGrads in_t = rms_grads<T>(sh, x0, g0, dy0, dg_init, sentinel);

  // finite differences of the host formula
  const Vec fd_x = finite_difference(x0, [&](const Vec& x) { return rms_loss(sh, x, g0, dy0); });
  const Vec fd_g = finite_difference(g0, [&](const Vec& g) { return rms_loss(sh, x0, g, dy0); });
  Vec dx_first_r, fd_first_r, dx_t_first_r;
  for (std::size_t i = 0; i < fd_x.size(); ++i) {
    const int col = static_cast<int>(i % sh.w_in);
    if (col < sh.r) {
      dx_first_r.push_back(in_double.dx[i]);
      dx_t_first_r.push_back(in_t.dx[i]);
      fd_first_r.push_back(fd_x[i]);
    } else {
      EXPECT_EQ(in_t.dx[i], sentinel) << "dx column " << col << " was touched";
    }
  }
  Vec dg_added(sh.r), dg_added_t(sh.r);
  for (int j = 0; j < sh.r; ++j) {
    dg_added[j] = in_double.dg[j] - dg_init[j];
    dg_added_t[j] = in_t.dg[j] - dg_init[j];
  }
  EXPECT_LT(rel_error(dx_first_r, fd_first_r), 1e-6);
  EXPECT_LT(rel_error(dg_added, fd_g), 1e-6);
  // the value type's result against the (finite-difference-checked) double one
  EXPECT_LT(rel_error(dx_t_first_r, dx_first_r), tol<T>());
  EXPECT_LT(rel_error(dg_added_t, dg_added), (std::is_same_v<T, double> ? 1e-12 : 1e-5));

  // an empty dgain View skips it; dx alone is the same
  ExecSpace space;
  View3<T> x("x", sh.n_b, sh.n_s, sh.w_in), y("y", sh.n_b, sh.n_s, sh.w_out), dy("dy", sh.n_b, sh.n_s, sh.w_out);
  View3<T> dx("dx", sh.n_b, sh.n_s, sh.w_in);
  View1<T> g("g", sh.r), rstd("rstd", sh.n_b * sh.n_s);
  from_vec(x, x0);
  from_vec(g, g0);
  from_vec(dy, dy0);
  Kokkos::deep_copy(dx, static_cast<T>(sentinel));
  mlacp::rms_norm_forward(space, x, g, y, rstd);
  mlacp::rms_norm_backward(space, x, g, rstd, dy, dx, View1<T>());
  space.fence();
  EXPECT_EQ(to_vec(dx), in_t.dx);
}

// ---- attention ------------------------------------------------------------------------------------------------------

struct AttnShape {
  int n_b, n_s, n_h, d_qk, d_v;
  std::size_t qk_size() const { return static_cast<std::size_t>(n_b) * n_s * n_h * d_qk; }
  std::size_t v_size() const { return static_cast<std::size_t>(n_b) * n_s * n_h * d_v; }
  std::size_t at(int b, int t, int hd, int c, int d) const {
    return ((static_cast<std::size_t>(b) * n_s + t) * n_h + hd) * d + c;
  }
};

/// Naive causal softmax attention, materialising each S x S score matrix: o [B, S, h, dv] and lse [B, h, S].
void attention_host(const AttnShape& sh, const Vec& q, const Vec& k, const Vec& v, Vec& o, Vec& lse) {
  o.assign(sh.v_size(), 0.0);
  lse.assign(static_cast<std::size_t>(sh.n_b) * sh.n_h * sh.n_s, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(sh.d_qk));
  for (int b = 0; b < sh.n_b; ++b) {
    for (int hd = 0; hd < sh.n_h; ++hd) {
      std::vector<Vec> scores(sh.n_s, Vec(sh.n_s, 0.0));
      for (int i = 0; i < sh.n_s; ++i) {
        for (int j = 0; j < sh.n_s; ++j) {
          for (int c = 0; c < sh.d_qk; ++c) {
            scores[i][j] += q[sh.at(b, i, hd, c, sh.d_qk)] * k[sh.at(b, j, hd, c, sh.d_qk)] * scale;
          }
        }
      }
      for (int i = 0; i < sh.n_s; ++i) {
        double mx = -HUGE_VAL;
        for (int j = 0; j <= i; ++j) mx = std::max(mx, scores[i][j]);
        double sum = 0.0;
        for (int j = 0; j <= i; ++j) sum += std::exp(scores[i][j] - mx);
        lse[(static_cast<std::size_t>(b) * sh.n_h + hd) * sh.n_s + i] = mx + std::log(sum);
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(scores[i][j] - mx) / sum;
          for (int c = 0; c < sh.d_v; ++c) o[sh.at(b, i, hd, c, sh.d_v)] += p * v[sh.at(b, j, hd, c, sh.d_v)];
        }
      }
    }
  }
}

template <class U>
struct AttnRun {
  View4<U> q, k, v, o;
  View3<U> lse;
  AttnRun(const AttnShape& sh, const Vec& q0, const Vec& k0, const Vec& v0)
      : q("q", sh.n_b, sh.n_s, sh.n_h, sh.d_qk),
        k("k", sh.n_b, sh.n_s, sh.n_h, sh.d_qk),
        v("v", sh.n_b, sh.n_s, sh.n_h, sh.d_v),
        o("o", sh.n_b, sh.n_s, sh.n_h, sh.d_v),
        lse("lse", sh.n_b, sh.n_h, sh.n_s) {
    from_vec(q, q0);
    from_vec(k, k0);
    from_vec(v, v0);
    ExecSpace space;
    mlacp::CausalAttentionCore{}.forward(space, q, k, v, o, lse);
    space.fence();
  }
};

TYPED_TEST(MlaKernels, AttentionForwardMatchesNaiveSoftmax) {
  using T = TypeParam;
  // Magnitude 40 with integer entries: scores of thousands (exp overflows double without the running max), computed
  // exactly in float too.
  for (const double magnitude : {1.0, 6.0, 40.0}) {
    const bool integers = magnitude > 10.0;
    auto input = [&](std::size_t n, std::uint32_t seed) {
      Vec values = random_vec(n, seed, -magnitude, magnitude);
      if (integers) {
        for (auto& x : values) x = std::round(x);
      }
      return rounded<T>(values);
    };
    const AttnShape sh{2, 13, 3, 5, 3};
    const Vec q0 = input(sh.qk_size(), 11);
    const Vec k0 = input(sh.qk_size(), 12);
    const Vec v0 = rounded<T>(random_vec(sh.v_size(), 13));
    AttnRun<T> run(sh, q0, k0, v0);
    Vec o_ref, lse_ref;
    attention_host(sh, q0, k0, v0, o_ref, lse_ref);
    EXPECT_LT(rel_error(to_vec(run.o), o_ref), tol<T>()) << "magnitude " << magnitude;
    EXPECT_LT(rel_error(to_vec(run.lse), lse_ref), tol<T>()) << "magnitude " << magnitude;
  }
}

struct AttnGrads {
  Vec dq, dk, dv;
};

template <class U>
AttnGrads attention_grads(const AttnShape& sh, const Vec& q0, const Vec& k0, const Vec& v0, const Vec& do0,
                          bool want_dq = true, bool want_dk = true, bool want_dv = true) {
  AttnRun<U> run(sh, q0, k0, v0);
  View4<U> d_o("d_o", sh.n_b, sh.n_s, sh.n_h, sh.d_v);
  from_vec(d_o, do0);
  View4<U> dq, dk, dv;
  if (want_dq) dq = View4<U>("dq", sh.n_b, sh.n_s, sh.n_h, sh.d_qk);
  if (want_dk) dk = View4<U>("dk", sh.n_b, sh.n_s, sh.n_h, sh.d_qk);
  if (want_dv) dv = View4<U>("dv", sh.n_b, sh.n_s, sh.n_h, sh.d_v);
  // garbage first: the gradients are overwritten, not accumulated
  for (auto* g : {&dq, &dk, &dv}) {
    if (g->size() != 0) Kokkos::deep_copy(*g, U(42));
  }
  ExecSpace space;
  mlacp::CausalAttentionCore{}.backward(space, run.q, run.k, run.v, run.o, run.lse, d_o, dq, dk, dv);
  space.fence();
  return {want_dq ? to_vec(dq) : Vec(), want_dk ? to_vec(dk) : Vec(), want_dv ? to_vec(dv) : Vec()};
}

TYPED_TEST(MlaKernels, AttentionBackwardMatchesFiniteDifferences) {
  using T = TypeParam;
  const AttnShape sh{2, 7, 2, 5, 3};
  const Vec q0 = rounded<T>(random_vec(sh.qk_size(), 21, -2.0, 2.0));
  const Vec k0 = rounded<T>(random_vec(sh.qk_size(), 22, -2.0, 2.0));
  const Vec v0 = rounded<T>(random_vec(sh.v_size(), 23));
  const Vec do0 = rounded<T>(random_vec(sh.v_size(), 24));
  auto loss = [&](const Vec& q, const Vec& k, const Vec& v) {
    AttnRun<double> run(sh, q, k, v);
    return dot(to_vec(run.o), do0);
  };
  const Vec fd_q = finite_difference(q0, [&](const Vec& q) { return loss(q, k0, v0); });
  const Vec fd_k = finite_difference(k0, [&](const Vec& k) { return loss(q0, k, v0); });
  const Vec fd_v = finite_difference(v0, [&](const Vec& v) { return loss(q0, k0, v); });
  const AttnGrads in_double = attention_grads<double>(sh, q0, k0, v0, do0);
  EXPECT_LT(rel_error(in_double.dq, fd_q), 1e-6);
  EXPECT_LT(rel_error(in_double.dk, fd_k), 1e-6);
  EXPECT_LT(rel_error(in_double.dv, fd_v), 1e-6);
  const AttnGrads in_t = attention_grads<T>(sh, q0, k0, v0, do0);
  EXPECT_LT(rel_error(in_t.dq, in_double.dq), tol<T>());
  EXPECT_LT(rel_error(in_t.dk, in_double.dk), tol<T>());
  EXPECT_LT(rel_error(in_t.dv, in_double.dv), tol<T>());
}

TYPED_TEST(MlaKernels, AttentionBackwardSkipsEmptyGradients) {
  using T = TypeParam;
  const AttnShape sh{1, 6, 2, 4, 5};
  const Vec q0 = rounded<T>(random_vec(sh.qk_size(), 31));
  const Vec k0 = rounded<T>(random_vec(sh.qk_size(), 32));
  const Vec v0 = rounded<T>(random_vec(sh.v_size(), 33));
  const Vec do0 = rounded<T>(random_vec(sh.v_size(), 34));
  const AttnGrads all = attention_grads<T>(sh, q0, k0, v0, do0);
  const AttnGrads no_q = attention_grads<T>(sh, q0, k0, v0, do0, false, true, true);
  EXPECT_EQ(no_q.dk, all.dk);
  EXPECT_EQ(no_q.dv, all.dv);
  const AttnGrads only_dv = attention_grads<T>(sh, q0, k0, v0, do0, false, false, true);
  EXPECT_EQ(only_dv.dv, all.dv);
  const AttnGrads only_dk = attention_grads<T>(sh, q0, k0, v0, do0, false, true, false);
  EXPECT_EQ(only_dk.dk, all.dk);
  const AttnGrads only_dq = attention_grads<T>(sh, q0, k0, v0, do0, true, false, false);
  EXPECT_EQ(only_dq.dq, all.dq);
  const AttnGrads none = attention_grads<T>(sh, q0, k0, v0, do0, false, false, false);
  EXPECT_TRUE(none.dq.empty() && none.dk.empty() && none.dv.empty());
}

TYPED_TEST(MlaKernels, AttentionRejectsMismatchedShapes) {
  using T = TypeParam;
  ExecSpace space;
  View4<T> q("q", 1, 4, 2, 3), k("k", 1, 4, 2, 3), v("v", 1, 4, 2, 5), o("o", 1, 4, 2, 4);
  View3<T> lse("lse", 1, 2, 4);
  const std::string msg = invalid_argument_message([&] { mlacp::attention_forward(space, q, k, v, o, lse); });
  EXPECT_NE(msg.find("o is [1, 4, 2, 4], expected [1, 4, 2, 5]"), std::string::npos) << msg;
}

// ---- row sums -------------------------------------------------------------------------------------------------------

TYPED_TEST(MlaKernels, SumRowsAccumulates) {
  using T = TypeParam;
  const int n = 37, c = 5;
  ExecSpace space;
  View2<T> g("g", n, c);
  View1<T> out("out", c);
  const Vec g0 = rounded<T>(random_vec(g.size(), 41));
  const Vec out0 = rounded<T>(random_vec(c, 42));
  from_vec(g, g0);
  from_vec(out, out0);
  Vec sums(c, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < c; ++j) sums[j] += g0[i * c + j];
  }
  for (int times = 1; times <= 2; ++times) {
    mlacp::sum_rows_accumulate(space, g, out);
    space.fence();
    Vec expected(c);
    for (int j = 0; j < c; ++j) expected[j] = out0[j] + times * sums[j];
    EXPECT_LT(rel_error(to_vec(out), expected), tol<T>()) << "after " << times << " call(s)";
  }
}

// Wider than one host chunk of columns (64), with a partial last chunk, and on a strided (column-subview) matrix.
TYPED_TEST(MlaKernels, SumRowsAccumulatesOverChunksAndStridedColumns) {
  using T = TypeParam;
  const int n = 23, wide = 2 * 150, c = 150;
  ExecSpace space;
  View2<T> full("full", n, wide);
  const Vec f0 = rounded<T>(random_vec(full.size(), 43));
  from_vec(full, f0);
  const auto contiguous = Kokkos::subview(full, std::make_pair(0, n), Kokkos::ALL());
  // Every second column: a LayoutStride View whose column stride is 2.
  Kokkos::View<T**, Kokkos::LayoutStride, MemSpace> strided(full.data(), Kokkos::LayoutStride(n, wide, c, 2));
  View1<T> out_all("out_all", wide), out_strided("out_strided", c);
  mlacp::sum_rows_accumulate(space, contiguous, out_all);
  mlacp::sum_rows_accumulate(space, strided, out_strided);
  space.fence();
  Vec all(wide, 0.0), every_second(c, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < wide; ++j) all[j] += f0[i * wide + j];
  for (int j = 0; j < c; ++j) every_second[j] = all[2 * j];
  EXPECT_LT(rel_error(to_vec(out_all), all), tol<T>());
  EXPECT_LT(rel_error(to_vec(out_strided), every_second), tol<T>());
}

// The table form of RoPE (one table per configuration, out of place) gives the in-place per-call form's numbers.
TYPED_TEST(MlaKernels, RopeWithATableOutOfPlaceMatchesInPlace) {
  using T = TypeParam;
  const int n_b = 2, n_s = 5, n_h = 3, d = 10, first = 4, width = 6, dst_first = 1;
  const std::int64_t offset = 17;
  ExecSpace space;
  View4<T> x("x", n_b, n_s, n_h, d), in_place("in_place", n_b, n_s, n_h, d), out("out", n_b, n_s, n_h, width + 2);
  const Vec x0 = rounded<T>(random_vec(x.size(), 44));
  from_vec(x, x0);
  from_vec(in_place, x0);
  mlacp::rope_forward(space, in_place, first, width, offset);
  const auto table = mlacp::detail::make_rope_table(space, n_s, offset, width, 10000.0);
  mlacp::rope_forward(space, x, first, out, dst_first, table);
  space.fence();
  const Vec rotated = to_vec(in_place), got = to_vec(out);
  Vec want(got.size(), 0.0), have(got.size(), 0.0);
  for (int row = 0; row < n_b * n_s * n_h; ++row)
    for (int c = 0; c < width; ++c) {
      want[row * (width + 2) + c] = rotated[row * d + first + c];
      have[row * (width + 2) + c] = got[row * (width + 2) + dst_first + c];
    }
  EXPECT_LT(rel_error(have, want), tol<T>());
  EXPECT_EQ(to_vec(x), x0) << "out of place leaves the source alone";
  mlacp::rope_backward(space, out, dst_first, out, dst_first, table);
  space.fence();
  const Vec back = to_vec(out);
  Vec original(got.size(), 0.0), restored(got.size(), 0.0);
  for (int row = 0; row < n_b * n_s * n_h; ++row)
    for (int c = 0; c < width; ++c) {
      original[row * (width + 2) + c] = x0[row * d + first + c];
      restored[row * (width + 2) + c] = back[row * (width + 2) + dst_first + c];
    }
  EXPECT_LT(rel_error(restored, original), tol<T>());
}

// The KV adjoint read from P head blocks (as the inverse all-to-all delivers them) equals the plain adjoint of the
// unpacked tensor.
TYPED_TEST(MlaKernels, KvGradientFromHeadBlocksMatchesUnpacked) {
  using T = TypeParam;
  const int parts = 2, n_b = 2, n = 3, h = 2, dn = 3, dr = 2, dv = 4, heads = parts * h;
  ExecSpace space;
  Kokkos::View<T*****, Kokkos::LayoutRight, MemSpace> dk_blocks("dk", parts, n_b, n, h, dn + dr),
      dv_blocks("dv", parts, n_b, n, h, dv);
  const Vec k0 = rounded<T>(random_vec(dk_blocks.size(), 45)), v0 = rounded<T>(random_vec(dv_blocks.size(), 46));
  from_vec(dk_blocks, k0);
  from_vec(dv_blocks, v0);
  // Unpack on the host: token-local head r*h + i of token (b, t) is block r's head i.
  View4<T> dk("dk local", n_b, n, heads, dn + dr), dv_local("dv local", n_b, n, heads, dv);
  Vec k_local(dk.size()), v_local(dv_local.size());
  for (int r = 0; r < parts; ++r)
    for (int tok = 0; tok < n_b * n; ++tok)
      for (int i = 0; i < h; ++i) {
        for (int c = 0; c < dn + dr; ++c)
          k_local[(tok * heads + r * h + i) * (dn + dr) + c] = k0[((r * n_b * n + tok) * h + i) * (dn + dr) + c];
        for (int c = 0; c < dv; ++c)
          v_local[(tok * heads + r * h + i) * dv + c] = v0[((r * n_b * n + tok) * h + i) * dv + c];
      }
  from_vec(dk, k_local);
  from_vec(dv_local, v_local);
  View4<T> dkv_blocks("dkv blocks", n_b, n, heads, dn + dv), dkv_plain("dkv plain", n_b, n, heads, dn + dv);
  View3<T> dkpe_blocks("dkpe blocks", n_b, n, dr), dkpe_plain("dkpe plain", n_b, n, dr);
  mlacp::detail::key_grad_from_blocks(space, dk_blocks.data(), parts, dkv_blocks, dkpe_blocks, dn);
  mlacp::detail::value_grad_from_blocks(space, dv_blocks.data(), parts, dkv_blocks, dn);
  mlacp::detail::disassemble_kv_grad(space, dk, dv_local, dkv_plain, dkpe_plain, dn);
  space.fence();
  EXPECT_EQ(to_vec(dkv_blocks), to_vec(dkv_plain));
  EXPECT_LT(rel_error(to_vec(dkpe_blocks), to_vec(dkpe_plain)), tol<T>());
  // dkpe is the sum over all heads of dk's last dr columns.
  Vec shared(n_b * n * dr, 0.0);
  for (int tok = 0; tok < n_b * n; ++tok)
    for (int head = 0; head < heads; ++head)
      for (int c = 0; c < dr; ++c) shared[tok * dr + c] += k_local[(tok * heads + head) * (dn + dr) + dn + c];
  EXPECT_LT(rel_error(to_vec(dkpe_plain), shared), tol<T>());
}

// ---- reference forward ----------------------------------------------------------------------------------------------

template <class T>
mlacp::testing::reference::ReferenceWeights<T> random_weights(const mlacp::testing::reference::ReferenceDims& d,
                                                              std::uint32_t seed, bool biases) {
  using W = mlacp::testing::reference::ReferenceWeights<T>;
  const int dqk = d.dn + d.dr;
  auto host_matrix = [&](const char* name, int rows, int cols, std::uint32_t s) {
    typename W::matrix_type m(std::string(name), rows, cols);
    const Vec values = random_vec(m.size(), s, -0.5, 0.5);
    for (std::size_t i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(values[i]);
    return m;
  };
  auto host_vector = [&](const char* name, int n, std::uint32_t s, double lo, double hi) {
    typename W::vector_type v(std::string(name), n);
    const Vec values = random_vec(v.size(), s, lo, hi);
    for (std::size_t i = 0; i < v.size(); ++i) v.data()[i] = static_cast<T>(values[i]);
    return v;
  };
  W w;
  w.w_q = host_matrix("w_q", d.H * dqk, d.D, seed + 1);
  w.w_kva = host_matrix("w_kva", d.R + d.dr, d.D, seed + 2);
  w.g_kv = host_vector("g_kv", d.R, seed + 3, 0.5, 1.5);
  w.w_kvb = host_matrix("w_kvb", d.H * (d.dn + d.dv), d.R, seed + 4);
  w.w_o = host_matrix("w_o", d.D, d.H * d.dv, seed + 5);
  if (biases) {
    w.b_q = host_vector("b_q", d.H * dqk, seed + 6, -0.5, 0.5);
    w.b_kvb = host_vector("b_kvb", d.H * (d.dn + d.dv), seed + 7, -0.5, 0.5);
    w.b_o = host_vector("b_o", d.D, seed + 8, -0.5, 0.5);
  }
  return w;
}

template <class T>
typename mlacp::testing::reference::ReferenceWeights<T>::tensor3_type host_input(
    const mlacp::testing::reference::ReferenceDims& d, std::uint32_t seed) {
  typename mlacp::testing::reference::ReferenceWeights<T>::tensor3_type x("x", d.B, d.S, d.D);
  const Vec values = random_vec(x.size(), seed);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = static_cast<T>(values[i]);
  return x;
}

TYPED_TEST(MlaKernels, ReferenceSingleTokenIsTheValuePath) {
  // One token, one head: the softmax is 1, so y = (RMSNorm(x w_kva^T [:R]) w_kvb_v^T + b_kvb_v) w_o^T + b_o,
  // independent of q and of RoPE.
  using T = TypeParam;
  const mlacp::testing::reference::ReferenceDims d{1, 1, 4, 1, 2, 2, 3, 4};
  const auto w = random_weights<T>(d, 100, true);
  const auto x = host_input<T>(d, 101);
  typename mlacp::testing::reference::ReferenceWeights<T>::tensor3_type y("y", d.B, d.S, d.D);
  mlacp::testing::reference::mla_forward(d, w, x, y);
  Vec c(d.R);
  double ss = 0.0;
  for (int j = 0; j < d.R; ++j) {
    for (int i = 0; i < d.D; ++i) c[j] += double(x(0, 0, i)) * double(w.w_kva(j, i));
    ss += c[j] * c[j];
  }
  for (int j = 0; j < d.R; ++j) c[j] *= double(w.g_kv(j)) / std::sqrt(ss / d.R + 1e-6);
  Vec v(d.dv);
  for (int e = 0; e < d.dv; ++e) {
    v[e] = double(w.b_kvb(d.dn + e));
    for (int j = 0; j < d.R; ++j) v[e] += c[j] * double(w.w_kvb(d.dn + e, j));
  }
  Vec expected(d.D), got(d.D);
  for (int i = 0; i < d.D; ++i) {
    expected[i] = double(w.b_o(i));
    for (int e = 0; e < d.dv; ++e) expected[i] += v[e] * double(w.w_o(i, e));
    got[i] = double(y(0, 0, i));
  }
  EXPECT_LT(rel_error(got, expected), tol<T>());
}

TYPED_TEST(MlaKernels, ReferenceIsCausal) {
  using T = TypeParam;
  const mlacp::testing::reference::ReferenceDims d{2, 5, 6, 2, 3, 4, 3, 5};
  const auto w = random_weights<T>(d, 200, true);
  const auto x = host_input<T>(d, 201);
  typename mlacp::testing::reference::ReferenceWeights<T>::tensor3_type y0("y0", d.B, d.S, d.D),
      y1("y1", d.B, d.S, d.D);
  mlacp::testing::reference::mla_forward(d, w, x, y0);
  for (int b = 0; b < d.B; ++b) {
    for (int i = 0; i < d.D; ++i) x(b, d.S - 1, i) += T(0.25);
  }
  mlacp::testing::reference::mla_forward(d, w, x, y1);
  for (int b = 0; b < d.B; ++b) {
    double last_change = 0.0;
    for (int i = 0; i < d.D; ++i) {
      for (int t = 0; t < d.S - 1; ++t) EXPECT_EQ(y1(b, t, i), y0(b, t, i)) << "b " << b << " t " << t;
      last_change = std::max(last_change, std::abs(double(y1(b, d.S - 1, i)) - double(y0(b, d.S - 1, i))));
    }
    EXPECT_GT(last_change, 1e-3) << "b " << b;
  }
}

TYPED_TEST(MlaKernels, ReferenceMatchesTheKernelsComposed) {
  // The spec's forward recomputed from the kernels (RMSNorm, RoPE on q_pe and on the rank-3 payload, attention core),
  // with the projections done by plain host loops here: an independent check of the reference's layouts.
  using T = TypeParam;
  const mlacp::testing::reference::ReferenceDims d{2, 6, 7, 3, 3, 4, 5, 6};
  const int dqk = d.dn + d.dr, n_tok = d.B * d.S;
  const auto w = random_weights<T>(d, 300, true);
  const auto x = host_input<T>(d, 301);
  typename mlacp::testing::reference::ReferenceWeights<T>::tensor3_type y_ref("y_ref", d.B, d.S, d.D);
  mlacp::testing::reference::mla_forward(d, w, x, y_ref);

  auto linear = [&](const Vec& in, int n_in, const auto& wm, const auto& bias, int n_out) {
    Vec out(static_cast<std::size_t>(n_tok) * n_out);
    for (int n = 0; n < n_tok; ++n) {
      for (int o = 0; o < n_out; ++o) {
        double acc = bias.size() ? double(bias(o)) : 0.0;
        for (int i = 0; i < n_in; ++i) acc += in[n * n_in + i] * double(wm(o, i));
        out[n * n_out + o] = double(T(acc));  // rounded to T as a T pipeline would store it
      }
    }
    return out;
  };
  const Vec xv(x.data(), x.data() + x.size());
  const typename mlacp::testing::reference::ReferenceWeights<T>::vector_type no_bias;
  ExecSpace space;
  View4<T> q("q", d.B, d.S, d.H, dqk);
  from_vec(q, linear(xv, d.D, w.w_q, w.b_q, d.H * dqk));
  View3<T> payload("payload", d.B, d.S, d.R + d.dr);
  from_vec(payload, linear(xv, d.D, w.w_kva, no_bias, d.R + d.dr));
  View1<T> g("g", d.R), rstd("rstd", n_tok);
  Kokkos::deep_copy(g, w.g_kv);
  mlacp::rms_norm_forward(space, payload, g, payload, rstd);  // in place
  mlacp::rope_forward(space, q, d.dn, d.dr, 0);
  mlacp::rope_forward(space, mlacp::as_rank4(payload), d.R, d.dr, 0);
  space.fence();
  const Vec pay = to_vec(payload);
  Vec c(static_cast<std::size_t>(n_tok) * d.R);
  for (int n = 0; n < n_tok; ++n) {
    for (int j = 0; j < d.R; ++j) c[n * d.R + j] = pay[n * (d.R + d.dr) + j];
  }
  const Vec kv = linear(c, d.R, w.w_kvb, w.b_kvb, d.H * (d.dn + d.dv));
  Vec kh(static_cast<std::size_t>(n_tok) * d.H * dqk), vh(static_cast<std::size_t>(n_tok) * d.H * d.dv);
  for (int n = 0; n < n_tok; ++n) {
    for (int hd = 0; hd < d.H; ++hd) {
      const double* kvh = &kv[(n * d.H + hd) * (d.dn + d.dv)];
      for (int e = 0; e < d.dn; ++e) kh[(n * d.H + hd) * dqk + e] = kvh[e];
      for (int e = 0; e < d.dr; ++e) kh[(n * d.H + hd) * dqk + d.dn + e] = pay[n * (d.R + d.dr) + d.R + e];
      for (int e = 0; e < d.dv; ++e) vh[(n * d.H + hd) * d.dv + e] = kvh[d.dn + e];
    }
  }
  const AttnShape sh{d.B, d.S, d.H, dqk, d.dv};
  AttnRun<T> run(sh, to_vec(q), kh, vh);
  const Vec y = linear(to_vec(run.o), d.H * d.dv, w.w_o, w.b_o, d.D);
  const Vec yr(y_ref.data(), y_ref.data() + y_ref.size());
  EXPECT_LT(rel_error(y, yr), (std::is_same_v<T, double> ? 1e-12 : 1e-5));
}

}  // namespace
