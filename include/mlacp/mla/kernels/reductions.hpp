// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Column reductions for bias gradients.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/kernels/view_utils.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mlacp {
namespace detail {

/// out(c) += sum over n in [0, n_rows) of value(n, c), c in [0, n_cols), accumulated in double, race-free (each column
/// is summed by one work item; no atomics). The loop order follows the hardware: on a host execution space a work item
/// sums a chunk of adjacent columns over all rows, its inner loop running along a row (contiguous, vectorised, one pass
/// over the matrix); on a device one thread per column loops over the rows, so that adjacent threads read adjacent
/// columns (coalesced). `value` is a device-callable functor (n, c) -> double.
template <class ExecSpace, class OutView, class Value>
void accumulate_column_sums(const ExecSpace& space, const char* label, std::int64_t n_rows, std::int64_t n_cols,
                            const OutView& out, const Value& value) {
  using out_type = typename OutView::non_const_value_type;
  using policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  if (n_cols == 0) return;
  if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) {
    constexpr std::int64_t chunk = 64;
    Kokkos::parallel_for(
        label, policy(space, 0, (n_cols + chunk - 1) / chunk), KOKKOS_LAMBDA(const std::int64_t k) {
          const std::int64_t first = k * chunk;
          const std::int64_t width = n_cols - first < chunk ? n_cols - first : chunk;
          double acc[chunk] = {};
          for (std::int64_t n = 0; n < n_rows; ++n)
            for (std::int64_t c = 0; c < width; ++c) acc[c] += value(n, first + c);
          for (std::int64_t c = 0; c < width; ++c)
            out(first + c) = static_cast<out_type>(static_cast<double>(out(first + c)) + acc[c]);
        });
  } else {
    Kokkos::parallel_for(
        label, policy(space, 0, n_cols), KOKKOS_LAMBDA(const std::int64_t c) {
          double acc = 0.0;
          for (std::int64_t n = 0; n < n_rows; ++n) acc += value(n, c);
          out(c) = static_cast<out_type>(static_cast<double>(out(c)) + acc);
        });
  }
}

/// Device-callable (n, c) -> double reading a matrix through its pointer: rows `row_stride` apart, contiguous columns
/// (the common case, which the host loop vectorises) or `column_stride` apart.
template <class T>
struct MatrixValue {
  const T* data;
  std::int64_t row_stride;
  KOKKOS_INLINE_FUNCTION double operator()(std::int64_t n, std::int64_t c) const {
    return static_cast<double>(data[n * row_stride + c]);
  }
};
template <class T>
struct StridedMatrixValue {
  const T* data;
  std::int64_t row_stride;
  std::int64_t column_stride;
  KOKKOS_INLINE_FUNCTION double operator()(std::int64_t n, std::int64_t c) const {
    return static_cast<double>(data[n * row_stride + c * column_stride]);
  }
};

}  // namespace detail

/// out1d[c] += sum_n g2d(n, c) for a rank-2 View g2d `[N, C]` and a rank-1 View out1d `[C]` (bias gradients).
/// Accumulates in double, race-free, no atomics (detail::accumulate_column_sums). Asynchronous on `space`.
template <class ExecSpace, class GView, class OutView>
void sum_rows_accumulate(const ExecSpace& space, const GView& g2d, const OutView& out1d) {
  static_assert(compat::view_rank_v<GView> == 2, "mlacp::sum_rows_accumulate: g2d must be a rank-2 View [N, C]");
  static_assert(compat::view_rank_v<OutView> == 1, "mlacp::sum_rows_accumulate: out1d must be a rank-1 View [C]");
  static_assert_accessible<ExecSpace, GView>();
  static_assert_accessible<ExecSpace, OutView>();
  if (out1d.extent(0) != g2d.extent(1)) {
    throw mlacp::InvalidArgument("mlacp::sum_rows_accumulate: " + detail::named("out1d.extent(0)", out1d.extent(0)) +
                                 ", expected g2d.extent(1) = " + std::to_string(g2d.extent(1)));
  }
  const auto n_rows = static_cast<std::int64_t>(g2d.extent(0));
  const auto n_cols = static_cast<std::int64_t>(g2d.extent(1));
  using T = typename GView::non_const_value_type;
  const auto row_stride = static_cast<std::int64_t>(g2d.stride(0));
  if (g2d.stride(1) == 1)
    detail::accumulate_column_sums(space, "mlacp::sum_rows_accumulate", n_rows, n_cols, out1d,
                                   detail::MatrixValue<T>{g2d.data(), row_stride});
  else
    detail::accumulate_column_sums(
        space, "mlacp::sum_rows_accumulate", n_rows, n_cols, out1d,
        detail::StridedMatrixValue<T>{g2d.data(), row_stride, static_cast<std::int64_t>(g2d.stride(1))});
}

}  // namespace mlacp
