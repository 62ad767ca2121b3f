// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// RMSNorm of the latent (MLA_SPEC step 3) over the first R columns of rank-3 Views `[B, s, W]`, W >= R (the latent is
// the first R columns of the payload [c, k_pe]); R is gain.extent(0):
//   y[j] = x[j] * rstd * g[j],  rstd = 1 / sqrt(mean_{k < R}(x[k]^2) + eps),  j < R.
// Columns >= R of the outputs are never touched. Statistics and reductions accumulate in double.
//
// The saved rstd is a rank-1 View `[B*s]`, token (b, t) at index b*s + t.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/view_utils.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mlacp {

/// The eps of MLA_SPEC's RMSNorm.
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
  const std::int64_t s_ct = static_cast<std::int64_t>(n_s);
  const auto n_tokens = static_cast<std::int64_t>(n_b * n_s);
  if (n_tokens == 0) return;
  using policy_type = Kokkos::TeamPolicy<ExecSpace>;
  using member_type = typename policy_type::member_type;
  Kokkos::parallel_for(
      "mlacp::rms_norm_forward", policy_type(space, n_tokens, Kokkos::AUTO), KOKKOS_LAMBDA(const member_type& team) {
        const std::int64_t tok = team.league_rank();
        const std::int64_t b = tok / s_ct;
        const std::int64_t t = tok % s_ct;
        double sum_sq = 0.0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, n_cols),
            [&](const int j, double& acc) {
              const double v = static_cast<double>(x_in(b, t, j));
              acc += v * v;
            },
            sum_sq);
        const double rstd = 1.0 / compat::math::sqrt(sum_sq / static_cast<double>(n_cols) + eps);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n_cols), [&](const int j) {
          y_out(b, t, j) =
              static_cast<y_type>(static_cast<double>(x_in(b, t, j)) * rstd * static_cast<double>(gain(j)));
        });
        Kokkos::single(Kokkos::PerTeam(team), [&]() { rstd_out(tok) = static_cast<r_type>(rstd); });
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
  using dx_type = typename DxView::non_const_value_type;
  using dg_type = typename DgainView::non_const_value_type;
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
  const std::int64_t s_ct = static_cast<std::int64_t>(n_s);
  const auto n_tokens = static_cast<std::int64_t>(n_b * n_s);
  if (n_tokens == 0 || n_cols == 0) return;

  if (do_dx) {
    using policy_type = Kokkos::TeamPolicy<ExecSpace>;
    using member_type = typename policy_type::member_type;
    // dx_k = rstd * g_k * dy_k - x_k * rstd^3 / R * sum_j(dy_j * g_j * x_j)
    Kokkos::parallel_for(
        "mlacp::rms_norm_backward_dx", policy_type(space, n_tokens, Kokkos::AUTO),
        KOKKOS_LAMBDA(const member_type& team) {
          const std::int64_t tok = team.league_rank();
          const std::int64_t b = tok / s_ct;
          const std::int64_t t = tok % s_ct;
          double dot = 0.0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, n_cols),
              [&](const int j, double& acc) {
                acc += static_cast<double>(dy(b, t, j)) * static_cast<double>(gain(j)) *
                       static_cast<double>(x_in(b, t, j));
              },
              dot);
          const double rs = static_cast<double>(rstd(tok));
          const double coef = rs * rs * rs * dot / static_cast<double>(n_cols);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n_cols), [&](const int j) {
            dx_out(b, t, j) =
                static_cast<dx_type>(rs * static_cast<double>(gain(j)) * static_cast<double>(dy(b, t, j)) -
                                     static_cast<double>(x_in(b, t, j)) * coef);
          });
        });
  }
  if (do_dg) {
    // One thread per column, looping over the tokens: adjacent threads read adjacent columns.
    Kokkos::parallel_for(
        "mlacp::rms_norm_backward_dgain", Kokkos::RangePolicy<ExecSpace>(space, 0, n_cols), KOKKOS_LAMBDA(const int j) {
          double acc = 0.0;
          for (std::int64_t tok = 0; tok < n_tokens; ++tok) {
            const std::int64_t b = tok / s_ct;
            const std::int64_t t = tok % s_ct;
            acc +=
                static_cast<double>(dy(b, t, j)) * static_cast<double>(x_in(b, t, j)) * static_cast<double>(rstd(tok));
          }
          dgain_accumulate(j) = static_cast<dg_type>(static_cast<double>(dgain_accumulate(j)) + acc);
        });
  }
}

}  // namespace mlacp
