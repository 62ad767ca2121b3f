// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// RMSNorm of the latent (docs/spec.md step 3) over the first R columns of rank-3 Views `[B, s, W]`, W >= R (the latent
// is the first R columns of the payload [c, k_pe]); R is gain.extent(0):
//   y[j] = x[j] * rstd * g[j],  rstd = 1 / sqrt(mean_{k < R}(x[k]^2) + eps),  j < R.
// Columns >= R of the outputs are never touched. Statistics and reductions accumulate in double.
//
// The saved rstd is a rank-1 View `[B*s]`, token (b, t) at index b*s + t.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/kernels/reductions.hpp>
#include <mlacp/mla/kernels/view_utils.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace mlacp {

/// The eps of docs/spec.md's RMSNorm.
inline constexpr double rms_norm_default_eps = 1e-6;

namespace detail {

template <class RowView>
void rms_norm_check_rows(const char* who, const char* name, const RowView& v, std::size_t n_b, std::size_t n_s,
                         std::size_t r) {
  static_assert(compat::view_rank_v<RowView> == 3, "mlacp RMSNorm: row tensors must be rank-3 Views [B, s, W]");
  if (v.extent(0) != n_b || v.extent(1) != n_s || v.extent(2) < r) {
    throw mlacp::InvalidArgument(std::string("mlacp::") + who + ": " + name + " is [" + std::to_string(v.extent(0)) +
                                 ", " + std::to_string(v.extent(1)) + ", " + std::to_string(v.extent(2)) +
                                 "], expected [" + std::to_string(n_b) + ", " + std::to_string(n_s) +
                                 ", W >= R = " + std::to_string(r) + "]");
  }
}

// The kernels walk rows through pointers: the token tensors must be LayoutRight (rows contiguous, one stride apart).
template <class... Views>
constexpr void rms_norm_check_layout() {
  static_assert((std::is_same_v<typename Views::array_layout, Kokkos::LayoutRight> && ...),
                "mlacp RMSNorm: the token tensors and the gain must be LayoutRight Views");
}

// sum_j a_j * b_j * c_j over n contiguous values, in double, with four partial sums: a single running sum is bound by
// the latency of the floating-point add (one per element), four independent ones let the loop run at memory speed.
template <class A, class B, class C>
KOKKOS_INLINE_FUNCTION double triple_dot(const A* a, const B* b, const C* c, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    s0 += static_cast<double>(a[j]) * static_cast<double>(b[j]) * static_cast<double>(c[j]);
    s1 += static_cast<double>(a[j + 1]) * static_cast<double>(b[j + 1]) * static_cast<double>(c[j + 1]);
    s2 += static_cast<double>(a[j + 2]) * static_cast<double>(b[j + 2]) * static_cast<double>(c[j + 2]);
    s3 += static_cast<double>(a[j + 3]) * static_cast<double>(b[j + 3]) * static_cast<double>(c[j + 3]);
  }
  for (; j < n; ++j) s0 += static_cast<double>(a[j]) * static_cast<double>(b[j]) * static_cast<double>(c[j]);
  return (s0 + s1) + (s2 + s3);
}

// The same with c = 1 (sum of a_j * b_j).
template <class A, class B>
KOKKOS_INLINE_FUNCTION double pair_dot(const A* a, const B* b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    s0 += static_cast<double>(a[j]) * static_cast<double>(b[j]);
    s1 += static_cast<double>(a[j + 1]) * static_cast<double>(b[j + 1]);
    s2 += static_cast<double>(a[j + 2]) * static_cast<double>(b[j + 2]);
    s3 += static_cast<double>(a[j + 3]) * static_cast<double>(b[j + 3]);
  }
  for (; j < n; ++j) s0 += static_cast<double>(a[j]) * static_cast<double>(b[j]);
  return (s0 + s1) + (s2 + s3);
}

// The gain gradient's term for token `tok`, column j: dy_j * x_j * rstd (at namespace scope: a device functor).
template <class X, class D, class R>
struct RmsGainTerm {
  const X* x;
  const D* d;
  const R* rs;
  std::int64_t x_row, dy_row;
  KOKKOS_INLINE_FUNCTION double operator()(std::int64_t tok, std::int64_t j) const {
    return static_cast<double>(d[tok * dy_row + j]) * static_cast<double>(x[tok * x_row + j]) *
           static_cast<double>(rs[tok]);
  }
};

template <class RstdView>
void rms_norm_check_rstd(const char* who, const RstdView& rstd, std::size_t n_tokens) {
  static_assert(compat::view_rank_v<RstdView> == 1, "mlacp RMSNorm: rstd must be a rank-1 View [B*s]");
  if (rstd.extent(0) != n_tokens) {
    throw mlacp::InvalidArgument(std::string("mlacp::") + who + ": " + named("rstd.extent(0)", rstd.extent(0)) +
                                 ", expected B*s = " + std::to_string(n_tokens));
  }
}

}  // namespace detail

/// y_out[:, :, 0:R] = RMSNorm(x_in[:, :, 0:R]) * gain, R = gain.extent(0); saves rstd_out[b*s + t]. x_in `[B, s, W]`,
/// y_out `[B, s, W']` (W, W' >= R; y_out may be x_in: in place), gain `[R]`, rstd_out `[B*s]`. Asynchronous on `space`.
template <class ExecSpace, class XView, class GainView, class YView, class RstdView>
void rms_norm_forward(const ExecSpace& space, const XView& x_in, const GainView& gain, const YView& y_out,
                      const RstdView& rstd_out, double eps = rms_norm_default_eps) {
  static_assert(compat::view_rank_v<GainView> == 1, "mlacp::rms_norm_forward: gain must be a rank-1 View [R]");
  static_assert_accessible<ExecSpace, XView>();
  static_assert_accessible<ExecSpace, GainView>();
  static_assert_accessible<ExecSpace, YView>();
  static_assert_accessible<ExecSpace, RstdView>();
  detail::rms_norm_check_layout<XView, YView, GainView>();
  using y_type = typename YView::non_const_value_type;
  using r_type = typename RstdView::non_const_value_type;
  const auto r = gain.extent(0);
  const auto n_b = x_in.extent(0);
  const auto n_s = x_in.extent(1);
  detail::rms_norm_check_rows("rms_norm_forward", "x_in", x_in, n_b, n_s, r);
  detail::rms_norm_check_rows("rms_norm_forward", "y_out", y_out, n_b, n_s, r);
  detail::rms_norm_check_rstd("rms_norm_forward", rstd_out, n_b * n_s);
  if (r == 0) throw mlacp::InvalidArgument("mlacp::rms_norm_forward: gain.extent(0) = 0, expected R > 0");
  const int n_cols = static_cast<int>(r);
  const auto n_tokens = static_cast<std::int64_t>(n_b * n_s);
  if (n_tokens == 0) return;
  // One work item per token; its R values are contiguous (LayoutRight rows of stride W), read twice through pointers.
  const auto* x_data = x_in.data();
  y_type* y_data = y_out.data();
  const auto* g_data = gain.data();
  r_type* rstd_data = rstd_out.data();
  const auto x_row = static_cast<std::int64_t>(x_in.stride(1)), y_row = static_cast<std::int64_t>(y_out.stride(1));
  Kokkos::parallel_for(
      "mlacp::rms_norm_forward", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n_tokens),
      KOKKOS_LAMBDA(const std::int64_t tok) {
        const auto* x = x_data + tok * x_row;
        y_type* y = y_data + tok * y_row;
        const double sum_sq = detail::pair_dot(x, x, n_cols);
        const double rstd = 1.0 / compat::math::sqrt(sum_sq / static_cast<double>(n_cols) + eps);
        for (int j = 0; j < n_cols; ++j)
          y[j] = static_cast<y_type>(static_cast<double>(x[j]) * rstd * static_cast<double>(g_data[j]));
        rstd_data[tok] = static_cast<r_type>(rstd);
      });
}

/// Backward of rms_norm_forward given its saved rstd `[B*s]` and the upstream gradient dy `[B, s, W'']` (columns
/// [0, R) read):
/// - dx_out `[B, s, W''']` columns [0, R) = the gradient with respect to x_in (overwritten; other columns untouched);
///   an empty dx_out means "not needed";
/// - dgain_accumulate `[R]` += sum over tokens of dy * x * rstd; an empty View means "not needed".
/// Race-free (no atomics). Asynchronous on `space`.
template <class ExecSpace, class XView, class GainView, class RstdView, class DyView, class DxView, class DgainView>
void rms_norm_backward(const ExecSpace& space, const XView& x_in, const GainView& gain, const RstdView& rstd,
                       const DyView& dy, const DxView& dx_out, const DgainView& dgain_accumulate) {
  static_assert(compat::view_rank_v<GainView> == 1, "mlacp::rms_norm_backward: gain must be a rank-1 View [R]");
  static_assert(compat::view_rank_v<DgainView> == 1, "mlacp::rms_norm_backward: dgain must be a rank-1 View [R]");
  static_assert_accessible<ExecSpace, XView>();
  static_assert_accessible<ExecSpace, GainView>();
  static_assert_accessible<ExecSpace, RstdView>();
  static_assert_accessible<ExecSpace, DyView>();
  static_assert_accessible<ExecSpace, DxView>();
  static_assert_accessible<ExecSpace, DgainView>();
  detail::rms_norm_check_layout<XView, DyView, DxView>();
  using dx_type = typename DxView::non_const_value_type;
  const auto r = gain.extent(0);
  const auto n_b = x_in.extent(0);
  const auto n_s = x_in.extent(1);
  const bool do_dx = !view_is_empty(dx_out);
  const bool do_dg = !view_is_empty(dgain_accumulate);
  detail::rms_norm_check_rows("rms_norm_backward", "x_in", x_in, n_b, n_s, r);
  detail::rms_norm_check_rows("rms_norm_backward", "dy", dy, n_b, n_s, r);
  if (do_dx) detail::rms_norm_check_rows("rms_norm_backward", "dx_out", dx_out, n_b, n_s, r);
  detail::rms_norm_check_rstd("rms_norm_backward", rstd, n_b * n_s);
  if (do_dg && dgain_accumulate.extent(0) != r) {
    throw mlacp::InvalidArgument(
        "mlacp::rms_norm_backward: " + detail::named("dgain_accumulate.extent(0)", dgain_accumulate.extent(0)) +
        ", expected R = " + std::to_string(r));
  }
  const int n_cols = static_cast<int>(r);
  const auto n_tokens = static_cast<std::int64_t>(n_b * n_s);
  if (n_tokens == 0 || n_cols == 0) return;
  const auto* x_data = x_in.data();
  const auto* g_data = gain.data();
  const auto* rstd_data = rstd.data();
  const auto* dy_data = dy.data();
  const auto x_row = static_cast<std::int64_t>(x_in.stride(1)), dy_row = static_cast<std::int64_t>(dy.stride(1));

  if (do_dx) {
    dx_type* dx_data = dx_out.data();
    const auto dx_row = static_cast<std::int64_t>(dx_out.stride(1));
    // dx_k = rstd * g_k * dy_k - x_k * rstd^3 / R * sum_j(dy_j * g_j * x_j); one work item per token.
    Kokkos::parallel_for(
        "mlacp::rms_norm_backward_dx",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n_tokens),
        KOKKOS_LAMBDA(const std::int64_t tok) {
          const auto* x = x_data + tok * x_row;
          const auto* d = dy_data + tok * dy_row;
          dx_type* out = dx_data + tok * dx_row;
          const double dot = detail::triple_dot(d, g_data, x, n_cols);
          const double rs = static_cast<double>(rstd_data[tok]);
          const double coef = rs * rs * rs * dot / static_cast<double>(n_cols);
          for (int j = 0; j < n_cols; ++j)
            out[j] = static_cast<dx_type>(rs * static_cast<double>(g_data[j]) * static_cast<double>(d[j]) -
                                          static_cast<double>(x[j]) * coef);
        });
  }
  if (do_dg) {
    // dg_j += sum over tokens of dy_j * x_j * rstd: a column sum (detail::accumulate_column_sums picks the loop order).
    detail::accumulate_column_sums(
        space, "mlacp::rms_norm_backward_dgain", n_tokens, static_cast<std::int64_t>(n_cols), dgain_accumulate,
        detail::RmsGainTerm<typename XView::non_const_value_type, typename DyView::non_const_value_type,
                            typename RstdView::non_const_value_type>{x_data, dy_data, rstd_data, x_row, dy_row});
  }
}

}  // namespace mlacp
