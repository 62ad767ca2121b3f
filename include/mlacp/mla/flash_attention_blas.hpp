// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The host path of the tiled causal attention core: for each (batch, head) the score tiles are GEMMs of Kokkos Kernels
// (the BLAS TPL on host builds) on tiles of q, k, v read in place (a head's rows of a [B, S, h, d] View are a
// row-major matrix with leading dimension h*d), and the softmax, masking and row statistics are Kokkos kernels on the
// tile. Memory is O(tile) per call plus the row term D of the backward, never S x S.
//
// Forward, per query tile Q_i and key tiles K_j, V_j up to the diagonal (online softmax, statistics in double):
//   S = Q_i K_j^T;  m' = max(m, rowmax(scale*S));  P = exp(scale*S - m');  l = l*exp(m - m') + rowsum(P);
//   O_i = O_i*exp(m - m') + P V_j;   at the end O_i /= l, lse_i = m + log(l).
// Backward, per key tile j and the query tiles i at or below the diagonal (P recomputed from lse):
//   P = exp(scale*Q_i K_j^T - lse_i);  dV_j += P^T dO_i;  dS = scale * P o (dO_i V_j^T - D_i);
//   dK_j += dS^T Q_i;  dQ_i += dS K_j;   D_i = rowsum(dO_i o O_i) computed once.
// Entries with key > query are zero in P (the diagonal tiles are masked; tiles entirely above it are skipped).
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/mla/flash_attention_rows.hpp>
#include <mlacp/mla/flash_attention_scratch.hpp>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace mlacp::detail {

/// Rows [row0, row0 + n) of head `hd` of batch `b` of a LayoutRight [B, S, h, d] View, as a row-major [n, d] matrix
/// whose leading dimension is the token stride (h*d): a LayoutRight subview that the BLAS TPL takes as it is.
template <class View4>
auto head_rows(const View4& t, std::int64_t b, std::int64_t hd, std::int64_t row0, std::int64_t n) {
  using value_type = typename View4::value_type;
  using full_type = Kokkos::View<value_type**, Kokkos::LayoutRight, typename View4::memory_space,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const auto ld = static_cast<std::int64_t>(t.stride(1));
  const auto col0 = static_cast<std::size_t>(hd * static_cast<std::int64_t>(t.stride(2)));
  const full_type full(t.data() + b * static_cast<std::int64_t>(t.stride(0)) + row0 * ld, static_cast<std::size_t>(n),
                       static_cast<std::size_t>(ld));
  auto tile = Kokkos::subview(full, Kokkos::ALL(), std::make_pair(col0, col0 + t.extent(3)));
  static_assert(std::is_same_v<typename decltype(tile)::array_layout, Kokkos::LayoutRight>,
                "mlacp: a head's rows must stay a LayoutRight matrix for the BLAS TPL");
  return tile;
}

template <class Mat>
auto top_left(const Mat& m, std::int64_t rows, std::int64_t cols) {
  return Kokkos::subview(m, std::make_pair<std::size_t, std::size_t>(0, static_cast<std::size_t>(rows)),
                         std::make_pair<std::size_t, std::size_t>(0, static_cast<std::size_t>(cols)));
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class T, class Mem>
void flash_forward_blas(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
                        std::int64_t tile_q, std::int64_t tile_k, FlashScratch<T, Mem>& ws) {
  const auto n_b = static_cast<std::int64_t>(q.extent(0)), n_s = static_cast<std::int64_t>(q.extent(1));
  const auto n_h = static_cast<std::int64_t>(q.extent(2)), d_v = static_cast<std::int64_t>(v.extent(3));
  const double scale = 1.0 / compat::math::sqrt(static_cast<double>(q.extent(3)));
  tile_q = std::min(tile_q, n_s);
  tile_k = std::min(tile_k, n_s);
  ws.reserve(tile_q, tile_k, 0);
  using policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  using lse_type = typename Lse::non_const_value_type;
  using o_type = typename O::non_const_value_type;
  const auto m = ws.row_max, l = ws.row_sum;
  for (std::int64_t b = 0; b < n_b; ++b) {
    for (std::int64_t hd = 0; hd < n_h; ++hd) {
      for (std::int64_t i0 = 0; i0 < n_s; i0 += tile_q) {
        const std::int64_t nq = std::min(tile_q, n_s - i0);
        const auto q_i = head_rows(q, b, hd, i0, nq);
        const auto o_i = head_rows(o, b, hd, i0, nq);
        // Key tiles up to the last query of the tile; keys past it are never needed.
        for (std::int64_t j0 = 0; j0 < i0 + nq; j0 += tile_k) {
          const std::int64_t nk = std::min(tile_k, i0 + nq - j0);
          const auto s = top_left(ws.scores, nq, nk);
          compat::gemm(space, "N", "T", T(1), q_i, head_rows(k, b, hd, j0, nk), T(0), s);
          const bool first = j0 == 0;
          const bool masked = j0 + nk - 1 > i0;  // some key of the tile lies after some query
          Kokkos::parallel_for(
              "mlacp::flash_forward_softmax", policy(space, 0, nq), KOKKOS_LAMBDA(const std::int64_t r) {
                const std::int64_t last = masked ? last_visible(i0 + r, j0, nk) : nk - 1;
                const double alpha = online_softmax_row(&s(r, 0), nk, last, scale, first, m(r), l(r));
                if (!first && alpha != 1.0) {
                  const auto a = static_cast<o_type>(alpha);
                  o_type* out = &o_i(r, 0);
                  for (std::int64_t c = 0; c < d_v; ++c) out[c] *= a;
                }
              });
          compat::gemm(space, "N", "N", T(1), s, head_rows(v, b, hd, j0, nk), first ? T(0) : T(1), o_i);
        }
        Kokkos::parallel_for(
            "mlacp::flash_forward_finish", policy(space, 0, nq), KOKKOS_LAMBDA(const std::int64_t r) {
              const auto inv = static_cast<o_type>(1.0 / l(r));
              for (std::int64_t c = 0; c < d_v; ++c) o_i(r, c) *= inv;
              lse(b, hd, i0 + r) = static_cast<lse_type>(m(r) + compat::math::log(l(r)));
            });
      }
    }
  }
}

template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK, class DV,
          class T, class Mem>
void flash_backward_blas(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
                         const DO& d_o, const DQ& dq, const DK& dk, const DV& dv, bool do_dq, bool do_dk, bool do_dv,
                         std::int64_t tile_q, std::int64_t tile_k, FlashScratch<T, Mem>& ws) {
  const auto n_b = static_cast<std::int64_t>(q.extent(0)), n_s = static_cast<std::int64_t>(q.extent(1));
  const auto n_h = static_cast<std::int64_t>(q.extent(2));
  const double scale = 1.0 / compat::math::sqrt(static_cast<double>(q.extent(3)));
  tile_q = std::min(tile_q, n_s);
  tile_k = std::min(tile_k, n_s);
  const bool need_ds = do_dq || do_dk;
  ws.reserve(tile_q, tile_k, need_ds ? n_b * n_h * n_s : 0);
  using policy = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  const auto row_term = ws.row_term;
  if (need_ds) flash_row_term(space, o, d_o, row_term);
  for (std::int64_t b = 0; b < n_b; ++b) {
    for (std::int64_t hd = 0; hd < n_h; ++hd) {
      const std::int64_t lse_row = b * n_h + hd;
      for (std::int64_t j0 = 0; j0 < n_s; j0 += tile_k) {
        const std::int64_t nk = std::min(tile_k, n_s - j0);
        const auto k_j = head_rows(k, b, hd, j0, nk);
        const auto v_j = head_rows(v, b, hd, j0, nk);
        bool first_i = true;
        // Query tiles that see at least one key of this tile: those ending after j0.
        for (std::int64_t i0 = (j0 / tile_q) * tile_q; i0 < n_s; i0 += tile_q) {
          const std::int64_t nq = std::min(tile_q, n_s - i0);
          const auto q_i = head_rows(q, b, hd, i0, nq);
          const auto do_i = head_rows(d_o, b, hd, i0, nq);
          const auto p = top_left(ws.scores, nq, nk);
          compat::gemm(space, "N", "T", T(1), q_i, k_j, T(0), p);
          const bool masked = j0 + nk - 1 > i0;
          Kokkos::parallel_for(
              "mlacp::flash_backward_probabilities", policy(space, 0, nq), KOKKOS_LAMBDA(const std::int64_t r) {
                const std::int64_t last = masked ? last_visible(i0 + r, j0, nk) : nk - 1;
                probabilities_row(&p(r, 0), nk, last, scale, static_cast<double>(lse(b, hd, i0 + r)));
              });
          if (do_dv) compat::gemm(space, "T", "N", T(1), p, do_i, first_i ? T(0) : T(1), head_rows(dv, b, hd, j0, nk));
          if (need_ds) {
            const auto ds = top_left(ws.grads, nq, nk);
            compat::gemm(space, "N", "T", T(1), do_i, v_j, T(0), ds);
            const std::int64_t d0 = lse_row * n_s + i0;
            Kokkos::parallel_for(
                "mlacp::flash_backward_ds", policy(space, 0, nq), KOKKOS_LAMBDA(const std::int64_t r) {
                  score_grad_row(&ds(r, 0), &p(r, 0), nk, scale, row_term(d0 + r));
                });
            if (do_dk)
              compat::gemm(space, "T", "N", T(1), ds, q_i, first_i ? T(0) : T(1), head_rows(dk, b, hd, j0, nk));
            // Every query sees key 0: the first key tile initialises dQ.
            if (do_dq)
              compat::gemm(space, "N", "N", T(1), ds, k_j, j0 == 0 ? T(0) : T(1), head_rows(dq, b, hd, i0, nq));
          }
          first_i = false;
        }
      }
    }
  }
}

}  // namespace mlacp::detail
