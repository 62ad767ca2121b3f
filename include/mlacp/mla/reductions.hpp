// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Column reductions for bias gradients.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/view_utils.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace mlacp {

/// out1d[c] += sum_n g2d(n, c) for a rank-2 View g2d `[N, C]` and a rank-1 View out1d `[C]` (bias gradients).
/// One thread per column looping over the rows, accumulating in double: race-free, no atomics. Asynchronous on `space`.
template <class ExecSpace, class GView, class OutView>
void sum_rows_accumulate(const ExecSpace& space, const GView& g2d, const OutView& out1d) {
  static_assert(compat::view_rank_v<GView> == 2, "mlacp::sum_rows_accumulate: g2d must be a rank-2 View [N, C]");
  static_assert(compat::view_rank_v<OutView> == 1, "mlacp::sum_rows_accumulate: out1d must be a rank-1 View [C]");
  static_assert_accessible<ExecSpace, GView>();
  static_assert_accessible<ExecSpace, OutView>();
  using out_type = typename OutView::non_const_value_type;
  if (out1d.extent(0) != g2d.extent(1)) {
    throw mlacp::InvalidArgument("mlacp::sum_rows_accumulate: " + detail::named("out1d.extent(0)", out1d.extent(0)) +
                                 ", expected g2d.extent(1) = " + std::to_string(g2d.extent(1)));
  }
  const auto n_rows = static_cast<std::int64_t>(g2d.extent(0));
  const auto n_cols = static_cast<std::int64_t>(g2d.extent(1));
  if (n_cols == 0) return;
  Kokkos::parallel_for(
      "mlacp::sum_rows_accumulate", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n_cols),
      KOKKOS_LAMBDA(const std::int64_t c) {
        double acc = 0.0;
        for (std::int64_t n = 0; n < n_rows; ++n) acc += static_cast<double>(g2d(n, c));
        out1d(c) = static_cast<out_type>(static_cast<double>(out1d(c)) + acc);
      });
}

}  // namespace mlacp
