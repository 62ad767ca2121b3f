// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The scratch the tiled attention core owns (allocated once per configuration, reused by every call) and the row term
// D_i = rowsum(dO_i o O_i) of the backward that both of its paths read from it.
#pragma once

#include <mlacp/compat.hpp>
#include <mlacp/view_types.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>

#include <cstdint>
#include <string>

namespace mlacp::detail {

/// What the core keeps between calls, grown once per configuration so that the steady state allocates nothing: the
/// host path's score tiles and row statistics, and the backward's row term D of both paths.
/// T is the accumulation type of the tiles (float for bf16 inputs, flash_attention_blas.hpp). Inputs stored in a
/// narrower type (bf16) also use the mixed-precision members: the probabilities and dS rounded for the next GEMM, and
/// the float accumulators of O, dK, dV (per tile) and dQ (per head).
template <class T, class MemSpace>
struct FlashScratch {
  detail::Matrix<T, MemSpace> scores, grads;          // [query_tile, key_tile]
  detail::Vector<double, MemSpace> row_max, row_sum;  // [query_tile]
  detail::Vector<double, MemSpace> row_term;          // D [B * h * S]
  // Mixed precision only (inputs in bf16): P and dS rounded to bf16 ([query_tile, key_tile]), and float accumulators.
  detail::Matrix<compat::bf16, MemSpace> scores_bf16, grads_bf16;
  detail::Matrix<T, MemSpace> o_acc;   // [query_tile, dv]
  detail::Matrix<T, MemSpace> dk_acc;  // [key_tile, dqk]
  detail::Matrix<T, MemSpace> dv_acc;  // [key_tile, dv]
  detail::Matrix<T, MemSpace> dq_acc;  // [S, dqk], one head at a time

  /// The mixed-precision members for tiles [tq, tk], head dims dqk and dv, and S tokens (grown, never shrunk).
  void reserve_mixed(std::int64_t tq, std::int64_t tk, std::int64_t dqk, std::int64_t dv, std::int64_t n_s) {
    grow_tile(scores_bf16, "mlacp::flash P (bf16)", tq, tk);
    grow_tile(grads_bf16, "mlacp::flash dS (bf16)", tq, tk);
    grow(o_acc, "mlacp::flash O accumulator", tq, dv);
    grow(dk_acc, "mlacp::flash dK accumulator", tk, dqk);
    grow(dv_acc, "mlacp::flash dV accumulator", tk, dv);
    grow(dq_acc, "mlacp::flash dQ accumulator", n_s, dqk);
  }

  /// The host path's [tq, tk] score tiles and [tq] row statistics, grown to the largest tiles seen and never shrunk:
  /// every pass reads a tile as its [rows, columns] corner (rows_cols), so calls of any shape share them.
  void reserve_tiles(std::int64_t tq, std::int64_t tk) {
    if (scores.extent(0) >= static_cast<std::size_t>(tq) && scores.extent(1) >= static_cast<std::size_t>(tk)) return;
    const std::int64_t rows = std::max<std::int64_t>(tq, static_cast<std::int64_t>(scores.extent(0)));
    const std::int64_t cols = std::max<std::int64_t>(tk, static_cast<std::int64_t>(scores.extent(1)));
    scores = decltype(scores)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::flash scores"), rows, cols);
    grads = decltype(grads)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::flash dS"), rows, cols);
    row_max = decltype(row_max)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::flash m"), rows);
    row_sum = decltype(row_sum)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::flash l"), rows);
  }
  /// `m` with at least `rows` rows of exactly `cols` columns (an accumulator of a head dim: zero_rows clears whole
  /// rows).
  template <class M>
  static void grow(M& m, const char* label, std::int64_t rows, std::int64_t cols) {
    if (m.extent(0) >= static_cast<std::size_t>(rows) && m.extent(1) == static_cast<std::size_t>(cols)) return;
    m = M(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), static_cast<std::size_t>(rows),
          static_cast<std::size_t>(cols));
  }
  /// A tile `m` grown to at least [rows, cols] (read as its corner), never shrunk.
  template <class M>
  static void grow_tile(M& m, const char* label, std::int64_t rows, std::int64_t cols) {
    if (m.extent(0) >= static_cast<std::size_t>(rows) && m.extent(1) >= static_cast<std::size_t>(cols)) return;
    m = M(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
          static_cast<std::size_t>(std::max<std::int64_t>(rows, static_cast<std::int64_t>(m.extent(0)))),
          static_cast<std::size_t>(std::max<std::int64_t>(cols, static_cast<std::int64_t>(m.extent(1)))));
  }
  /// At least `rows` entries of the backward's row term D (grown, never shrunk).
  void reserve_row_term(std::int64_t rows) {
    if (row_term.extent(0) < static_cast<std::size_t>(rows))
      row_term = decltype(row_term)(Kokkos::view_alloc(Kokkos::WithoutInitializing, "mlacp::flash D"), rows);
  }
};

/// D_i = rowsum(dO_i o O_i) for every (b, head, query) into ws.row_term[(b*h + head)*S + i], accumulated in double.
template <class ExecSpace, class O, class DO>
void flash_row_term(const ExecSpace& space, const O& o, const DO& d_o,
                    const detail::Vector<double, typename ExecSpace::memory_space>& row_term) {
  const auto n_s = static_cast<std::int64_t>(o.extent(1)), n_h = static_cast<std::int64_t>(o.extent(2));
  const auto d_v = static_cast<std::int64_t>(o.extent(3));
  const std::int64_t rows = static_cast<std::int64_t>(o.extent(0)) * n_s;
  Kokkos::parallel_for(
      "mlacp::flash_row_term", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t row) {
        const std::int64_t b = row / n_s, i = row % n_s;
        for (std::int64_t hd = 0; hd < n_h; ++hd) {
          double sum = 0;
          for (std::int64_t c = 0; c < d_v; ++c)
            sum += static_cast<double>(d_o(b, i, hd, c)) * static_cast<double>(o(b, i, hd, c));
          row_term((b * n_h + hd) * n_s + i) = sum;
        }
      });
}

}  // namespace mlacp::detail
