// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of RMSNorm (docs/spec.md step 3): the formula and the backward against finite differences; float and double.
#include "kernel_test_support.hpp"

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include <mlacp/mla/kernels/rms_norm.hpp>

namespace {

using namespace mlacp::test::kernels;

template <class T>
class RmsNorm : public ::testing::Test {};
TYPED_TEST_SUITE(RmsNorm, ValueTypes);

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

TYPED_TEST(RmsNorm, RmsNormForwardMatchesFormulaAndLeavesOtherColumns) {
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

TYPED_TEST(RmsNorm, RmsNormBackwardMatchesFiniteDifferences) {
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

}  // namespace
