// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Rotary position embedding (RoPE), rotate-half (GPT-NeoX) form, as MLA_SPEC step 4:
//   inv_freq[j] = base^(-2j/width), j in [0, width/2);  angle = p * inv_freq[j];
//   cos/sin repeated to length width as [f, f];  rot(x) = x*cos + rotate_half(x)*sin,  rotate_half([x1, x2]) = [-x2,
//   x1]
// i.e. for each pair (x1 = x[j], x2 = x[j + width/2]):  x1' = x1*cos - x2*sin,  x2' = x2*cos + x1*sin.
// Angles are computed in double whatever the value type.
//
// Rank-3 tensors `[B, s, d]` (the shared rope key of the latent payload) go through as_rank4() (view_utils.hpp).
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/view_utils.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mlacp {
namespace detail {

template <class View4>
void rope_validate(const char* who, const View4& x, int first_column, int width) {
  static_assert(compat::view_rank_v<View4> == 4, "mlacp RoPE: expects a rank-4 View [B, s, n, d]");
  const std::string prefix = std::string("mlacp::") + who + ": ";
  if (width <= 0 || width % 2 != 0) {
    throw mlacp::InvalidArgument(prefix + named("width", width) + ", expected an even number > 0");
  }
  if (first_column < 0) {
    throw mlacp::InvalidArgument(prefix + named("first_column", first_column) + ", expected >= 0");
  }
  if (static_cast<std::int64_t>(first_column) + width > static_cast<std::int64_t>(x.extent(3))) {
    throw mlacp::InvalidArgument(prefix + named("first_column", first_column) + " + " + named("width", width) +
                                 " exceeds the last extent " + std::to_string(x.extent(3)) +
                                 ", expected first_column + width <= extent(3)");
  }
}

/// sin_sign = +1: the rotation; -1: its transpose (= inverse).
template <class ExecSpace, class View4>
void rope_apply(const ExecSpace& space, const View4& x, int first_column, int width, std::int64_t position_offset,
                double base, double sin_sign) {
  static_assert_accessible<ExecSpace, View4>();
  using value_type = typename View4::non_const_value_type;
  const std::int64_t n_b = static_cast<std::int64_t>(x.extent(0));
  const std::int64_t n_s = static_cast<std::int64_t>(x.extent(1));
  const std::int64_t n_h = static_cast<std::int64_t>(x.extent(2));
  const std::int64_t half = width / 2;
  const std::int64_t total = n_b * n_s * n_h * half;
  const double width_double = static_cast<double>(width);
  if (total == 0) return;
  // The angles depend on (t, j) only: one cos/sin table of [s, width/2] instead of transcendental calls per element.
  using table_type = Kokkos::View<double**, Kokkos::LayoutRight, typename View4::memory_space>;
  table_type cos_table(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::rope cos"), n_s, half);
  table_type sin_table(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::rope sin"), n_s, half);
  Kokkos::parallel_for(
      "mlacp::rope_table", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n_s * half),
      KOKKOS_LAMBDA(const std::int64_t idx) {
        const std::int64_t j = idx % half;
        const std::int64_t t = idx / half;
        const double inv_freq = compat::math::pow(base, -2.0 * static_cast<double>(j) / width_double);
        const double angle = static_cast<double>(position_offset + t) * inv_freq;
        cos_table(t, j) = compat::math::cos(angle);
        sin_table(t, j) = sin_sign * compat::math::sin(angle);
      });
  // One work item per (b, t, n) row.
  Kokkos::parallel_for(
      "mlacp::rope", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n_b * n_s * n_h),
      KOKKOS_LAMBDA(const std::int64_t row) {
        const std::int64_t n = row % n_h;
        const std::int64_t t = (row / n_h) % n_s;
        const std::int64_t b = row / (n_h * n_s);
        for (std::int64_t j = 0; j < half; ++j) {
          const double c = cos_table(t, j);
          const double s = sin_table(t, j);
          const int col1 = first_column + static_cast<int>(j);
          const int col2 = col1 + static_cast<int>(half);
          const double x1 = static_cast<double>(x(b, t, n, col1));
          const double x2 = static_cast<double>(x(b, t, n, col2));
          x(b, t, n, col1) = static_cast<value_type>(x1 * c - x2 * s);
          x(b, t, n, col2) = static_cast<value_type>(x2 * c + x1 * s);
        }
      });
}

}  // namespace detail

/// Rotates, in place, columns [first_column, first_column + width) of every (b, t, n) row of the rank-4 View
/// x `[B, s, n, d]`, row t being at global position position_offset + t. Throws mlacp::InvalidArgument unless width is
/// even and > 0, first_column >= 0 and first_column + width <= x.extent(3). Asynchronous on `space`.
template <class ExecSpace, class View4>
void rope_forward(const ExecSpace& space, const View4& x, int first_column, int width, std::int64_t position_offset,
                  double base = 10000.0) {
  detail::rope_validate("rope_forward", x, first_column, width);
  detail::rope_apply(space, x, first_column, width, position_offset, base, 1.0);
}

/// The transpose (= inverse) of rope_forward, in place: maps the gradient with respect to the rotated values to the
/// gradient with respect to the unrotated ones. Same arguments and checks as rope_forward.
template <class ExecSpace, class View4>
void rope_backward(const ExecSpace& space, const View4& x, int first_column, int width, std::int64_t position_offset,
                   double base = 10000.0) {
  detail::rope_validate("rope_backward", x, first_column, width);
  detail::rope_apply(space, x, first_column, width, position_offset, base, -1.0);
}

}  // namespace mlacp
