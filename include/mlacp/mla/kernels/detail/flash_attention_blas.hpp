// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The host path of the tiled causal attention core: for each (batch, head) the score tiles are GEMMs of Kokkos Kernels
// (the BLAS TPL on host builds) on tiles of q, k, v read in place (a head's rows of a [B, S, h, d] View are a
// row-major matrix with leading dimension h*d), and the softmax, masking and row statistics are Kokkos kernels on the
// tile. Memory is O(tile) per call plus the row term D of the backward, never S x S. The row loops of the softmax, the
// probabilities and dS run host_row_kernels.hpp's copy for the CPU's widest vector instructions (the path is host-only:
// those loops are plain host lambdas).
//
// Forward, per query tile Q_i and key tiles K_j, V_j up to the diagonal (online softmax, statistics in double):
//   S = Q_i K_j^T;  m' = max(m, rowmax(scale*S));  P = exp(scale*S - m');  l = l*exp(m - m') + rowsum(P);
//   O_i = O_i*exp(m - m') + P V_j;   at the end O_i /= l, lse_i = m + log(l).
// Backward, per key tile j and the query tiles i at or below the diagonal (P recomputed from lse):
//   P = exp(scale*Q_i K_j^T - lse_i);  dV_j += P^T dO_i;  dS = scale * P o (dO_i V_j^T - D_i);
//   dK_j += dS^T Q_i;  dQ_i += dS K_j;   D_i = rowsum(dO_i o O_i) computed once.
// Entries with key > query, or key before the query's document start (DocumentLayout), are zero in P: the tiles that
// hold such entries are masked, the tiles that hold nothing else (above the diagonal, or entirely across a document
// boundary) are skipped.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/kernels/detail/flash_attention_rows.hpp>
#include <mlacp/mla/kernels/detail/flash_attention_scratch.hpp>
#include <mlacp/mla/kernels/detail/host_row_kernels.hpp>
#include <mlacp/progress.hpp>
#include <mlacp/view_types.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

namespace mlacp::detail {

/// Rows [row0, row0 + n) of head `hd` of batch `b` of a LayoutRight [B, S, h, d] View, as a row-major [n, d] matrix
/// whose leading dimension is the token stride (h*d): a LayoutRight subview that the BLAS TPL takes as it is.
template <class View4>
auto head_rows(const View4& t, std::int64_t b, std::int64_t hd, std::int64_t row0, std::int64_t n) {
  using value_type = typename View4::value_type;
  using full_type = detail::Matrix<value_type, typename View4::memory_space, detail::Unmanaged>;
  const auto ld = static_cast<std::int64_t>(t.stride(1));
  const auto col0 = static_cast<std::size_t>(hd * static_cast<std::int64_t>(t.stride(2)));
  const full_type full(t.data() + b * static_cast<std::int64_t>(t.stride(0)) + row0 * ld, static_cast<std::size_t>(n),
                       static_cast<std::size_t>(ld));
  auto tile = Kokkos::subview(full, Kokkos::ALL(), std::make_pair(col0, col0 + t.extent(3)));
  static_assert(std::is_same_v<typename decltype(tile)::array_layout, Kokkos::LayoutRight>,
                "mlacp: a head's rows must stay a LayoutRight matrix for the BLAS TPL");
  return tile;
}

/// Rows [row0, row0 + rows) and the first `cols` columns of a matrix (a LayoutRight subview).
template <class Mat>
auto rows_cols(const Mat& m, std::int64_t row0, std::int64_t rows, std::int64_t cols) {
  return Kokkos::subview(m, std::make_pair(static_cast<std::size_t>(row0), static_cast<std::size_t>(row0 + rows)),
                         std::make_pair<std::size_t, std::size_t>(0, static_cast<std::size_t>(cols)));
}

/// Rows per block where a score tile crosses the diagonal: such rows are computed in row blocks whose key range ends
/// at the block's last query, so that little of the masked half is computed (with 128 x 128 tiles at S = 1024, whole
/// diagonal tiles are 12% of the computed scores, 32-row blocks 3%).
inline constexpr std::int64_t flash_diagonal_block_rows = 32;
/// The same for bf16 inputs, whose tile products are bf16 matmuls (oneDNN on the host): a call costs more there, so
/// taller blocks that compute a little more of the masked half pay (measured in docs/performance.md, issue 36).
inline constexpr std::int64_t flash_diagonal_block_rows_bf16 = 64;

/// The row blocks of a query tile [i0, i0 + nq) against a key tile starting at j0 with nk keys: `fn(a, na, ka, nka)`
/// for rows [a, a + na) of the tile and keys [ka, ka + nka) of the key tile, the keys any of those rows can see (blocks
/// that see none are skipped). The rows that see every key of the tile (at or after its last key, and in a document
/// that starts at or before its first: an interval, as start_of does not decrease) are one block, the whole tile where
/// that is every row, and where they are at least block_rows; the other rows (on the diagonal, or across a document
/// boundary) are cut into blocks of block_rows rows, each computing only the key range
/// [start_of(first row), last row] it can see. So a tall tile that crosses the diagonal (a query tile longer than the
/// key tile) keeps one large product for its visible part, and a square tile on the diagonal is cut as it always was.
/// `block_rows`: the height of the partial blocks (flash_diagonal_rows below for the core's stored type).
template <class Docs, class Fn>
void for_each_row_block(const Docs& docs, std::int64_t i0, std::int64_t nq, std::int64_t j0, std::int64_t nk,
                        std::int64_t block_rows, Fn&& fn) {
  if (tile_fully_visible(i0, docs.start_of(i0 + nq - 1), j0, nk)) {
    fn(std::int64_t(0), nq, std::int64_t(0), nk);
    return;
  }
  // Rows [full_begin, full_end) see every key: at or after the last key, and their document starts at or before j0.
  const std::int64_t full_begin = std::min(nq, std::max(std::int64_t(0), j0 + nk - 1 - i0));
  std::int64_t full_end = full_begin;
  for (std::int64_t lo = full_begin, hi = nq; lo < hi;) {  // the first row from full_begin whose document starts later
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (docs.start_of(i0 + mid) <= j0)
      lo = full_end = mid + 1;
    else
      hi = mid;
  }
  auto partial = [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t a = begin; a < end; a += block_rows) {
      const std::int64_t na = std::min(block_rows, end - a);
      const std::int64_t ka = std::max(std::int64_t(0), docs.start_of(i0 + a) - j0);
      const std::int64_t kend = std::min(nk, i0 + a + na - j0);
      if (kend > ka) fn(a, na, ka, kend - ka);
    }
  };
  // Fewer full rows than one block (a square tile on the diagonal has one): no gain from a call of their own.
  if (full_end - full_begin < block_rows) {
    partial(0, nq);
    return;
  }
  partial(0, full_begin);
  fn(full_begin, full_end - full_begin, std::int64_t(0), nk);
  partial(full_end, nq);
}

/// Whether the core's inputs are stored in a narrower type than it accumulates in (bf16): then the tile products take
/// bf16 operands (P and dS rounded to bf16 for the GEMM that consumes them, as FlashAttention does on GPUs) through
/// the installed bf16 GEMM plan (detail::gemm_values), and O, dK, dV and dQ accumulate in float scratch and are rounded
/// into the outputs once.
template <class Stored>
inline constexpr bool flash_mixed_precision = !std::is_same_v<Stored, compat::accumulation_t<Stored>>;

/// The diagonal row blocks' height for inputs stored in Stored (for_each_row_block).
template <class Stored>
inline constexpr std::int64_t flash_diagonal_rows =
    flash_mixed_precision<Stored> ? flash_diagonal_block_rows_bf16 : flash_diagonal_block_rows;

/// `dst` (a bf16 tile) = `src` (a float tile), rows [0, rows) and columns [0, cols).
/// Host rows of mlacp::bfloat16 (the BLAS path's, host-only) are rounded by the row kernel of the CPU's widest
/// instruction set (host_row_kernels.hpp; measured: the scalar loop was 11% of the bf16 core's time), bit for bit
/// what the conversion gives; other bf16 types (Kokkos' bhalf_t) convert element by element.
template <class Dst>
inline constexpr bool flash_rounds_by_row_kernel = std::is_same_v<typename Dst::non_const_value_type, mlacp::bfloat16>;

template <class ExecSpace, class Src, class Dst>
void flash_round_tile(const ExecSpace& space, const Src& src, const Dst& dst, std::int64_t rows, std::int64_t cols) {
  using D = typename Dst::non_const_value_type;
  using policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  if constexpr (flash_rounds_by_row_kernel<Dst>) {
    if (cols > 0 && src.stride(1) == 1 && dst.stride(1) == 1) {  // rows contiguous (every tile and head row here)
      const auto round = host_row_kernels<typename Src::non_const_value_type>().round_bf16;
      Kokkos::parallel_for("mlacp::flash_round_tile", policy(space, 0, rows),
                           [=](const std::int64_t r) { round(&src(r, 0), &dst(r, 0), cols); });
      return;
    }
  }
  Kokkos::parallel_for(
      "mlacp::flash_round_tile", policy(space, 0, rows), KOKKOS_LAMBDA(const std::int64_t r) {
        for (std::int64_t c = 0; c < cols; ++c) dst(r, c) = static_cast<D>(src(r, c));
      });
}
/// The queries and keys of one call of the generalised kernels: query rows [q_row, q_row + n_q) of the q View (and of
/// o, lse, d_o, dq) hold the tokens at global positions [q_pos, q_pos + n_q), key rows [k_row, k_row + n_k) of k, v
/// (dk, dv) those at [k_pos, k_pos + n_k). The square core is q_pos = q_row = k_pos = k_row = 0, n_q = n_k = S.
/// Query tiles are aligned to q_row, key tiles to k_row.
struct FlashRange {
  std::int64_t q_pos = 0, q_row = 0, n_q = 0;
  std::int64_t k_pos = 0, k_row = 0, n_k = 0;
};

/// Whether any query of [q_pos, q_pos + n_q) sees any key of [k_pos, k_pos + n_k): the keys the queries see form the
/// one range [start_of(q_pos), q_pos + n_q - 1] (for_each_row_block above).
template <class Docs>
bool flash_range_visible(const Docs& docs, const FlashRange& rg) {
  if (rg.n_q <= 0 || rg.n_k <= 0) return false;
  return std::max(rg.k_pos, docs.start_of(rg.q_pos)) <= std::min(rg.k_pos + rg.n_k, rg.q_pos + rg.n_q) - 1;
}

/// Lets the collectives in flight progress between tiles while one worth polling is pending (host spaces;
/// progress.hpp says why, OverlapPolicy when). Both BLAS paths call it once per (query tile, key tile) pair they
/// compute: a transfer beside the core is polled every few hundred microseconds whatever the tile sizes (per key tile
/// only, the 256 x 256 tiles left the ring's backward transfer half the polls, twice as far apart, and it finished
/// late on a 2 Gbit/s link).
inline void flash_progress() {
  if (mlacp::polled_collectives() > 0) mlacp::progress();
}

/// The forward of the queries of `rg` against its keys. merge == false: o and lse of those rows are overwritten with
/// this call's attention (a row that sees no key: o = 0, lse = -inf). merge == true: they hold an earlier partial
/// result (o normalised, lse its log-sum-exp; -inf: none) and are merged with this one by log-sum-exp; rows that see
/// no key are left as they are. The running statistics start at m = -inf, l = 0, and a row with l = 0 has seen no key
/// yet: its statistics and output start at the first key it sees. O accumulates in place where o is in the
/// accumulation type and not merged into, else in the scratch ws.o_acc (rounded or merged into o per query tile).
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class Docs, class T, class Mem>
void flash_forward_blas_range(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
                              const Docs& docs, const FlashRange& rg, bool merge, std::int64_t tile_q,
                              std::int64_t tile_k, FlashScratch<T, Mem>& ws) {
  const auto n_b = static_cast<std::int64_t>(q.extent(0)), n_h = static_cast<std::int64_t>(q.extent(2));
  const auto d_v = static_cast<std::int64_t>(v.extent(3));
  const double scale = 1.0 / compat::math::sqrt(static_cast<double>(q.extent(3)));
  using o_type = typename O::non_const_value_type;
  constexpr bool mixed = flash_mixed_precision<typename Q::non_const_value_type>;
  constexpr bool o_is_acc = std::is_same_v<o_type, T>;
  static_assert(std::is_same_v<T, compat::accumulation_t<typename Q::non_const_value_type>>,
                "the scratch is in the accumulation type");
  ws.reserve_tiles(tile_q, tile_k);
  if constexpr (mixed) ws.reserve_mixed(tile_q, tile_k, static_cast<std::int64_t>(q.extent(3)), d_v, 0);
  if (!o_is_acc || merge) FlashScratch<T, Mem>::grow(ws.o_acc, "mlacp::flash O accumulator", tile_q, d_v);
  using policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  using lse_type = typename Lse::non_const_value_type;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const auto m = ws.row_max, l = ws.row_sum;
  const HostRowKernels<T> rows = host_row_kernels<T>();  // host-only: the row loops below are plain host lambdas
  const std::int64_t k_shift = rg.k_row - rg.k_pos;      // key row of a key position
  for (std::int64_t b = 0; b < n_b; ++b) {
    for (std::int64_t hd = 0; hd < n_h; ++hd) {
      for (std::int64_t i0 = 0; i0 < rg.n_q; i0 += tile_q) {
        const std::int64_t nq = std::min(tile_q, rg.n_q - i0);
        const std::int64_t p0 = rg.q_pos + i0, r0 = rg.q_row + i0;  // position and row of the tile's first query
        const auto o_i = head_rows(o, b, hd, r0, nq);
        // Keys [k_first, k_end) of the range (relative to k_pos): those any query of the tile can see.
        const std::int64_t k_first = std::max(std::int64_t(0), docs.start_of(p0) - rg.k_pos);
        const std::int64_t k_end = std::min(rg.n_k, p0 + nq - rg.k_pos);
        // O of the tile accumulates in acc_i: o's rows themselves (o in the accumulation type, not merged into) or the
        // scratch, both a LayoutRight window in T. (Not a generic lambda: nvcc refuses device lambdas inside one.)
        using acc_view = detail::Matrix<T, Mem, detail::Unmanaged>;
        using acc_type = T;
        auto tile = [&](const acc_view& acc_i) {
          Kokkos::parallel_for(
              "mlacp::flash_forward_start", policy(space, 0, nq), KOKKOS_LAMBDA(const std::int64_t r) {
                m(r) = neg_inf;
                l(r) = 0.0;
              });
          // Key tiles from the one holding the first query's document start up to the last query of the tile; keys
          // outside are never needed.
          const std::int64_t j_begin = k_end > k_first ? k_first / tile_k * tile_k : k_end;
          for (std::int64_t j0 = j_begin; j0 < k_end; j0 += tile_k) {
            flash_progress();
            const bool tile_first = j0 == j_begin;
            const std::int64_t kp0 = rg.k_pos + j0;  // position of the key tile's first key
            for_each_row_block(
                docs, p0, nq, kp0, std::min(tile_k, k_end - j0), flash_diagonal_rows<typename Q::non_const_value_type>,
                [&](std::int64_t a, std::int64_t na, std::int64_t ka, std::int64_t nk) {
                  const std::int64_t row0 = p0 + a, jb = kp0 + ka;  // positions
                  const auto s = rows_cols(ws.scores, 0, na, nk);
                  const auto acc_a = rows_cols(acc_i, a, na, d_v);
                  const auto k_b = head_rows(k, b, hd, jb + k_shift, nk);
                  const auto v_b = head_rows(v, b, hd, jb + k_shift, nk);
                  gemm_values(space, "N", "T", T(1), head_rows(q, b, hd, r0 + a, na), k_b, T(0), s);
                  // Some key of the block lies after some query, or before some query's document start.
                  const bool masked = !tile_fully_visible(row0, docs.start_of(row0 + na - 1), jb, nk);
                  Kokkos::parallel_for("mlacp::flash_forward_softmax", policy(space, 0, na), [=](const std::int64_t r) {
                    const std::int64_t start = docs.start_of(row0 + r);
                    // No earlier key tile held a key of this row: its statistics and output start here.
                    const bool row_first = l(a + r) == 0.0;
                    const std::int64_t first = masked ? first_visible(start, jb, nk) : 0;
                    const std::int64_t last = masked ? last_visible(row0 + r, jb, nk) : nk - 1;
                    const double alpha =
                        rows.online_softmax(&s(r, 0), nk, first, last, scale, row_first, m(a + r), l(a + r));
                    acc_type* out = &acc_a(r, 0);
                    if (row_first) {
                      if (!tile_first)
                        for (std::int64_t c = 0; c < d_v; ++c) out[c] = acc_type(0);
                    } else if (alpha != 1.0) {
                      const auto factor = static_cast<acc_type>(alpha);
                      for (std::int64_t c = 0; c < d_v; ++c) out[c] *= factor;
                    }
                  });
                  if constexpr (mixed) {
                    const auto p = rows_cols(ws.scores_bf16, 0, na, nk);
                    flash_round_tile(space, s, p, na, nk);
                    gemm_values(space, "N", "N", T(1), p, v_b, tile_first ? T(0) : T(1), acc_a);
                  } else {
                    gemm_values(space, "N", "N", T(1), s, v_b, tile_first ? T(0) : T(1), acc_a);
                  }
                });
          }
          if (!merge) {
            Kokkos::parallel_for(
                "mlacp::flash_forward_finish", policy(space, 0, nq), KOKKOS_LAMBDA(const std::int64_t r) {
                  if (l(r) == 0.0) {  // no key seen: no attention
                    for (std::int64_t c = 0; c < d_v; ++c) o_i(r, c) = o_type(0);
                    lse(b, hd, r0 + r) = static_cast<lse_type>(neg_inf);
                    return;
                  }
                  const auto inv = static_cast<acc_type>(1.0 / l(r));
                  for (std::int64_t c = 0; c < d_v; ++c) o_i(r, c) = static_cast<o_type>(acc_i(r, c) * inv);
                  lse(b, hd, r0 + r) = static_cast<lse_type>(m(r) + compat::math::log(l(r)));
                });
          } else {
            Kokkos::parallel_for(
                "mlacp::flash_forward_merge", policy(space, 0, nq), KOKKOS_LAMBDA(const std::int64_t r) {
                  if (l(r) == 0.0) return;  // no key seen: the earlier result stands
                  const LseMerge mg = lse_merge(static_cast<double>(lse(b, hd, r0 + r)), m(r), l(r));
                  for (std::int64_t c = 0; c < d_v; ++c)
                    o_i(r, c) = static_cast<o_type>(mg.w_old * static_cast<double>(o_i(r, c)) +
                                                    mg.w_new * static_cast<double>(acc_i(r, c)));
                  lse(b, hd, r0 + r) = static_cast<lse_type>(mg.lse);
                });
          }
        };
        if constexpr (o_is_acc) {
          if (!merge) {
            tile(o_i);
            continue;
          }
        }
        tile(rows_cols(ws.o_acc, 0, nq, d_v));
      }
    }
  }
}

/// Sets rows [row0, row0 + n) of head `hd` of batch `b` of a [B, S, h, d] View to zero.
template <class ExecSpace, class View4>
void zero_head_rows(const ExecSpace& space, const View4& t, std::int64_t b, std::int64_t hd, std::int64_t row0,
                    std::int64_t n) {
  using value_type = typename View4::non_const_value_type;
  const auto rows = head_rows(t, b, hd, row0, n);
  const auto d = static_cast<std::int64_t>(t.extent(3));
  Kokkos::parallel_for(
      "mlacp::flash_zero_rows", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n),
      KOKKOS_LAMBDA(const std::int64_t r) {
        value_type* row = &rows(r, 0);
        for (std::int64_t c = 0; c < d; ++c) row[c] = value_type(0);
      });
}

/// Rounds rows [0, n) of a float accumulator into rows [row0, row0 + n) of head `hd` of batch `b` of a bf16 View.
template <class ExecSpace, class Acc, class View4>
void flash_round_head_rows(const ExecSpace& space, const Acc& acc, const View4& t, std::int64_t b, std::int64_t hd,
                           std::int64_t row0, std::int64_t n) {
  flash_round_tile(space, acc, head_rows(t, b, hd, row0, n), n, static_cast<std::int64_t>(t.extent(3)));
}

/// Sets rows [0, n) of a matrix to zero.
template <class ExecSpace, class Mat>
void zero_rows(const ExecSpace& space, const Mat& m, std::int64_t n) {
  using value_type = typename Mat::non_const_value_type;
  const auto d = static_cast<std::int64_t>(m.extent(1));
  Kokkos::parallel_for(
      "mlacp::flash_zero_rows", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n),
      KOKKOS_LAMBDA(const std::int64_t r) {
        for (std::int64_t c = 0; c < d; ++c) m(r, c) = value_type(0);
      });
}

/// The backward of the queries of `rg` against its keys, reading the row term D of the q View's rows from row_term
/// [(b * h + head) * q.extent(1) + row] (flash_row_term). accumulate == false: dq, dk, dv of the range's rows are
/// overwritten (the square core; outputs stored narrower than the accumulation type accumulate in float scratch and are
/// rounded into them once). accumulate == true: the range's contribution is added to them (outputs in the
/// accumulation type only).
template <class ExecSpace, class Q, class K, class V, class Lse, class DO, class DQ, class DK, class DV, class Docs,
          class T, class Mem>
void flash_backward_blas_range(const ExecSpace& space, const Q& q, const K& k, const V& v, const Lse& lse,
                               const DO& d_o, const DQ& dq, const DK& dk, const DV& dv, bool do_dq, bool do_dk,
                               bool do_dv, const Docs& docs, const FlashRange& rg, bool accumulate, std::int64_t tile_q,
                               std::int64_t tile_k, FlashScratch<T, Mem>& ws,
                               const detail::Vector<double, Mem>& row_term) {
  const auto n_b = static_cast<std::int64_t>(q.extent(0)), n_rows = static_cast<std::int64_t>(q.extent(1));
  const auto n_h = static_cast<std::int64_t>(q.extent(2));
  const auto d_qk = static_cast<std::int64_t>(q.extent(3)), d_v = static_cast<std::int64_t>(v.extent(3));
  const double scale = 1.0 / compat::math::sqrt(static_cast<double>(d_qk));
  const bool need_ds = do_dq || do_dk;
  constexpr bool mixed = flash_mixed_precision<typename DO::non_const_value_type>;
  // Outputs stored narrower than the accumulation type accumulate in float scratch, rounded into them once.
  constexpr bool round_dq = !std::is_same_v<typename DQ::non_const_value_type, T>;
  constexpr bool round_dk = !std::is_same_v<typename DK::non_const_value_type, T>;
  constexpr bool round_dv = !std::is_same_v<typename DV::non_const_value_type, T>;
  if (accumulate && ((round_dq && do_dq) || (round_dk && do_dk) || (round_dv && do_dv)))
    throw InvalidArgument("mlacp::FlashAttentionCore: accumulated gradients must be in the accumulation type");
  ws.reserve_tiles(tile_q, tile_k);
  if constexpr (mixed) ws.reserve_mixed(tile_q, tile_k, d_qk, d_v, round_dq ? rg.n_q : 0);
  const HostRowKernels<T> rows = host_row_kernels<T>();  // host-only: the row loops below are plain host lambdas
  using policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  // One document: every query sees key 0, so the first key tile initialises dQ. Several: a query's first key lies in
  // the tile of its document start, so dQ is zeroed first and only accumulated. Accumulating: never initialised.
  const bool dq_zeroed = !docs.single();
  const std::int64_t q_shift = rg.q_row - rg.q_pos, k_shift = rg.k_row - rg.k_pos;  // row of a position
  // Where dQ, dK and dV accumulate: the outputs themselves, or float scratch rounded into them once (bf16): dK and dV
  // per key tile, dQ per head. Rows by position.
  auto dq_rows = [&](std::int64_t b, std::int64_t hd, std::int64_t row0, std::int64_t n) {
    if constexpr (round_dq) {
      (void)b, (void)hd;
      return rows_cols(ws.dq_acc, row0 - rg.q_pos, n, d_qk);
    } else {
      return head_rows(dq, b, hd, row0 + q_shift, n);
    }
  };
  auto dk_rows = [&](std::int64_t b, std::int64_t hd, std::int64_t j0, std::int64_t row0, std::int64_t n) {
    if constexpr (round_dk) {
      (void)b, (void)hd;
      return rows_cols(ws.dk_acc, row0 - j0, n, d_qk);
    } else {
      (void)j0;
      return head_rows(dk, b, hd, row0 + k_shift, n);
    }
  };
  auto dv_rows = [&](std::int64_t b, std::int64_t hd, std::int64_t j0, std::int64_t row0, std::int64_t n) {
    if constexpr (round_dv) {
      (void)b, (void)hd;
      return rows_cols(ws.dv_acc, row0 - j0, n, d_v);
    } else {
      (void)j0;
      return head_rows(dv, b, hd, row0 + k_shift, n);
    }
  };
  for (std::int64_t b = 0; b < n_b; ++b) {
    for (std::int64_t hd = 0; hd < n_h; ++hd) {
      const std::int64_t lse_row = b * n_h + hd;
      if (do_dq && dq_zeroed && !accumulate) {
        if constexpr (round_dq)
          zero_rows(space, ws.dq_acc, rg.n_q);
        else
          zero_head_rows(space, dq, b, hd, rg.q_row, rg.n_q);
      }
      for (std::int64_t jt = 0; jt < rg.n_k; jt += tile_k) {
        const std::int64_t j0 = rg.k_pos + jt;  // position of the key tile's first key
        const std::int64_t nk_tile = std::min(tile_k, rg.n_k - jt);
        // dK_j and dV_j accumulate over the query blocks; the masked blocks reach only part of the key rows.
        if (!accumulate) {
          if constexpr (round_dk) {
            if (do_dk) zero_rows(space, ws.dk_acc, nk_tile);
          } else {
            if (do_dk) zero_head_rows(space, dk, b, hd, j0 + k_shift, nk_tile);
          }
          if constexpr (round_dv) {
            if (do_dv) zero_rows(space, ws.dv_acc, nk_tile);
          } else {
            if (do_dv) zero_head_rows(space, dv, b, hd, j0 + k_shift, nk_tile);
          }
        }
        // Query tiles that see at least one key of this tile: from the one holding j0 to the end of the last key's
        // document (relative to q_pos).
        const std::int64_t i_first = std::max(std::int64_t(0), j0 - rg.q_pos);
        const std::int64_t i_end = std::min(rg.n_q, query_end(docs, j0, nk_tile) - rg.q_pos);
        for (std::int64_t it = i_first / tile_q * tile_q; it < i_end; it += tile_q) {
          flash_progress();
          const std::int64_t i0 = rg.q_pos + it;  // position of the query tile's first query
          for_each_row_block(
              docs, i0, std::min(tile_q, rg.n_q - it), j0, nk_tile,
              flash_diagonal_rows<typename Q::non_const_value_type>,
              [&](std::int64_t a, std::int64_t na, std::int64_t ka, std::int64_t nk) {
                const std::int64_t row0 = i0 + a, jb = j0 + ka;  // positions
                const std::int64_t qr = row0 + q_shift;          // row of the block's first query
                const auto q_a = head_rows(q, b, hd, qr, na);
                const auto do_a = head_rows(d_o, b, hd, qr, na);
                const auto k_j = head_rows(k, b, hd, jb + k_shift, nk);
                const auto p = rows_cols(ws.scores, 0, na, nk);
                gemm_values(space, "N", "T", T(1), q_a, k_j, T(0), p);
                const bool masked = !tile_fully_visible(row0, docs.start_of(row0 + na - 1), jb, nk);
                Kokkos::parallel_for(
                    "mlacp::flash_backward_probabilities", policy(space, 0, na), [=](const std::int64_t r) {
                      const std::int64_t first = masked ? first_visible(docs.start_of(row0 + r), jb, nk) : 0;
                      const std::int64_t last = masked ? last_visible(row0 + r, jb, nk) : nk - 1;
                      rows.probabilities(&p(r, 0), nk, first, last, scale, static_cast<double>(lse(b, hd, qr + r)));
                    });
                // P and dS as the GEMMs that consume them take them: rounded to bf16 (mixed), else themselves.
                auto operand = [&](const auto& tile, const auto& rounded) {
                  if constexpr (mixed) {
                    const auto r = rows_cols(rounded, 0, na, nk);
                    flash_round_tile(space, tile, r, na, nk);
                    return r;
                  } else {
                    (void)rounded;
                    return tile;
                  }
                };
                const auto p_op = operand(p, ws.scores_bf16);
                if (do_dv) gemm_values(space, "T", "N", T(1), p_op, do_a, T(1), dv_rows(b, hd, j0, jb, nk));
                if (!need_ds) return;
                const auto ds = rows_cols(ws.grads, 0, na, nk);
                gemm_values(space, "N", "T", T(1), do_a, head_rows(v, b, hd, jb + k_shift, nk), T(0), ds);
                const std::int64_t d0 = lse_row * n_rows + qr;
                Kokkos::parallel_for("mlacp::flash_backward_ds", policy(space, 0, na), [=](const std::int64_t r) {
                  rows.score_grad(&ds(r, 0), &p(r, 0), nk, scale, row_term(d0 + r));
                });
                const auto ds_op = operand(ds, ws.grads_bf16);
                if (do_dk) gemm_values(space, "T", "N", T(1), ds_op, q_a, T(1), dk_rows(b, hd, j0, jb, nk));
                if (do_dq)
                  gemm_values(space, "N", "N", T(1), ds_op, k_j, !accumulate && !dq_zeroed && j0 == 0 ? T(0) : T(1),
                              dq_rows(b, hd, row0, na));
              });
        }
        if constexpr (round_dk) {
          if (do_dk) flash_round_head_rows(space, ws.dk_acc, dk, b, hd, j0 + k_shift, nk_tile);
        }
        if constexpr (round_dv) {
          if (do_dv) flash_round_head_rows(space, ws.dv_acc, dv, b, hd, j0 + k_shift, nk_tile);
        }
      }
      if constexpr (round_dq) {
        if (do_dq) flash_round_head_rows(space, ws.dq_acc, dq, b, hd, rg.q_row, rg.n_q);
      }
    }
  }
}

}  // namespace mlacp::detail
