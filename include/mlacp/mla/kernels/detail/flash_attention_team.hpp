// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The portable path of the tiled causal attention core (any execution space: Serial, OpenMP, CUDA, HIP): one team per
// (batch, head, tile), the tile products as KokkosBatched team GEMMs reading q, k, v, dO in place, the score tile and
// the accumulators in team scratch memory (level 0 where they fit, else level 1). The mathematics is that of
// flash_attention_blas.hpp:
//   forward, one team per query tile: online softmax over the key tiles from its first document start up to the
//   diagonal;
//   backward, two kernels without atomics: one team per key tile accumulates dK and dV over the query tiles at or
//   below the diagonal up to the end of its last key's document, one team per query tile accumulates dQ over the key
//   tiles it sees (P recomputed from lse).
// Like the BLAS path, the kernels take a FlashRange (positioned queries and keys, flash_attention_blas.hpp): the square
// core is the range q_pos = k_pos = 0, n_q = n_k = S; ring attention's blocks are ranges merged into (forward) or
// accumulated into (backward) their outputs.
#pragma once

#include <KokkosBatched_Gemm_Decl.hpp>
#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/mla/kernels/detail/flash_attention_blas.hpp>
#include <mlacp/mla/kernels/detail/flash_attention_rows.hpp>
#include <mlacp/mla/kernels/detail/flash_attention_scratch.hpp>
#include <mlacp/view_types.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

namespace mlacp::detail {

template <class ExecSpace>
struct FlashTeam {
  using policy = Kokkos::TeamPolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  using member = typename policy::member_type;
  template <class T>
  using matrix = detail::Matrix<T, typename ExecSpace::scratch_memory_space, detail::Unmanaged>;
  template <class T>
  using vector = detail::Vector<T, typename ExecSpace::scratch_memory_space, detail::Unmanaged>;
  using NT = KokkosBatched::Trans::NoTranspose;
  using TR = KokkosBatched::Trans::Transpose;
  using Algo = KokkosBatched::Algo::Gemm::Unblocked;

  /// The scratch level of `bytes` per team: 0 (fast, small) where it fits, else 1.
  static int level(std::size_t bytes) { return bytes <= static_cast<std::size_t>(policy::scratch_size_max(0)) ? 0 : 1; }
  /// A team policy over `league` teams with `bytes` of scratch per team at level(bytes).
  static policy make(const ExecSpace& space, std::int64_t league, std::size_t bytes) {
    policy p(space, league, Kokkos::AUTO);
    return p.set_scratch_size(level(bytes), Kokkos::PerTeam(bytes));
  }
};

/// Rows [row0, row0 + n) of head `hd` of batch `b` of a [B, S, h, d] View as an [n, d] subview (any layout).
template <class View4>
KOKKOS_INLINE_FUNCTION auto head_block(const View4& t, std::int64_t b, std::int64_t hd, std::int64_t row0,
                                       std::int64_t n) {
  return Kokkos::subview(t, b, Kokkos::make_pair(row0, row0 + n), hd, Kokkos::ALL());
}

/// The forward of the queries of `rg` against its keys (flash_forward_blas_range says what merge does and how rows
/// that see no key are handled): m starts at -inf, l at 0, and l = 0 marks a row that has seen no key yet.
template <class ExecSpace, class Q, class K, class V, class O, class Lse, class Docs>
void flash_forward_team_range(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
                              const Docs& docs, const FlashRange& rg, bool merge, std::int64_t tile_q,
                              std::int64_t tile_k) {
  using T = typename O::non_const_value_type;
  using team = FlashTeam<ExecSpace>;
  using mat = typename team::template matrix<T>;
  using vec = typename team::template vector<double>;
  using lse_type = typename Lse::non_const_value_type;
  const auto n_b = static_cast<std::int64_t>(q.extent(0));
  const auto n_h = static_cast<std::int64_t>(q.extent(2)), d_v = static_cast<std::int64_t>(v.extent(3));
  const double scale = 1.0 / compat::math::sqrt(static_cast<double>(q.extent(3)));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const std::int64_t n_tiles = (rg.n_q + tile_q - 1) / tile_q;
  if (n_b * n_h * n_tiles == 0) return;
  const std::size_t bytes =
      mat::shmem_size(tile_q, tile_k) + mat::shmem_size(tile_q, d_v) + 2 * vec::shmem_size(tile_q);
  const int level = team::level(bytes);
  Kokkos::parallel_for(
      "mlacp::flash_forward_team", team::make(space, n_b * n_h * n_tiles, bytes),
      KOKKOS_LAMBDA(const typename team::member& t) {
        const std::int64_t tile = t.league_rank() % n_tiles, hd = (t.league_rank() / n_tiles) % n_h;
        const std::int64_t b = t.league_rank() / (n_tiles * n_h);
        const std::int64_t it = tile * tile_q, nq = imin(tile_q, rg.n_q - it);
        const std::int64_t i0 = rg.q_pos + it, r0 = rg.q_row + it;  // position and row of the tile's first query
        mat s_all(t.team_scratch(level), tile_q, tile_k), acc_all(t.team_scratch(level), tile_q, d_v);
        vec m(t.team_scratch(level), tile_q), l(t.team_scratch(level), tile_q);
        const auto acc = Kokkos::subview(acc_all, Kokkos::make_pair<std::int64_t>(0, nq), Kokkos::ALL());
        const auto q_i = head_block(q, b, hd, r0, nq);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, nq), [&](const std::int64_t r) {
          m(r) = neg_inf;
          l(r) = 0.0;
        });
        t.team_barrier();
        // Key tiles (relative to k_pos) from the one holding the first query's document start to the last query.
        const std::int64_t k_first = imax(std::int64_t(0), docs.start_of(i0) - rg.k_pos);
        const std::int64_t k_end = imin(rg.n_k, i0 + nq - rg.k_pos);
        const std::int64_t j_begin = k_end > k_first ? k_first / tile_k * tile_k : k_end;
        const std::int64_t last_start = docs.start_of(i0 + nq - 1);
        for (std::int64_t jt = j_begin; jt < k_end; jt += tile_k) {
          const std::int64_t nk = imin(tile_k, k_end - jt), j0 = rg.k_pos + jt;
          const bool tile_first = jt == j_begin, masked = !tile_fully_visible(i0, last_start, j0, nk);
          const auto s =
              Kokkos::subview(s_all, Kokkos::make_pair<std::int64_t>(0, nq), Kokkos::make_pair<std::int64_t>(0, nk));
          KokkosBatched::TeamGemm<typename team::member, typename team::NT, typename team::TR,
                                  typename team::Algo>::invoke(t, T(1), q_i, head_block(k, b, hd, rg.k_row + jt, nk),
                                                               T(0), s);
          t.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, nq), [&](const std::int64_t r) {
            const std::int64_t start = docs.start_of(i0 + r);
            // No earlier key tile held a key of this row: its statistics and accumulator start here.
            const bool row_first = l(r) == 0.0;
            const std::int64_t first = masked ? first_visible(start, j0, nk) : 0;
            const std::int64_t last = masked ? last_visible(i0 + r, j0, nk) : nk - 1;
            const double alpha = online_softmax_row(&s(r, 0), nk, first, last, scale, row_first, m(r), l(r));
            if (row_first) {
              if (!tile_first)
                for (std::int64_t c = 0; c < d_v; ++c) acc(r, c) = T(0);
            } else if (alpha != 1.0) {
              for (std::int64_t c = 0; c < d_v; ++c) acc(r, c) *= static_cast<T>(alpha);
            }
          });
          t.team_barrier();
          KokkosBatched::TeamGemm<typename team::member, typename team::NT, typename team::NT,
                                  typename team::Algo>::invoke(t, T(1), s, head_block(v, b, hd, rg.k_row + jt, nk),
                                                               tile_first ? T(0) : T(1), acc);
          t.team_barrier();
        }
        Kokkos::parallel_for(Kokkos::TeamThreadRange(t, nq), [&](const std::int64_t r) {
          if (!merge) {
            if (l(r) == 0.0) {  // no key seen: no attention
              for (std::int64_t c = 0; c < d_v; ++c) o(b, r0 + r, hd, c) = T(0);
              lse(b, hd, r0 + r) = static_cast<lse_type>(neg_inf);
              return;
            }
            const T inv = static_cast<T>(1.0 / l(r));
            for (std::int64_t c = 0; c < d_v; ++c) o(b, r0 + r, hd, c) = acc(r, c) * inv;
            lse(b, hd, r0 + r) = static_cast<lse_type>(m(r) + compat::math::log(l(r)));
            return;
          }
          if (l(r) == 0.0) return;  // no key seen: the earlier result stands
          const LseMerge mg = lse_merge(static_cast<double>(lse(b, hd, r0 + r)), m(r), l(r));
          for (std::int64_t c = 0; c < d_v; ++c)
            o(b, r0 + r, hd, c) = static_cast<T>(mg.w_old * static_cast<double>(o(b, r0 + r, hd, c)) +
                                                 mg.w_new * static_cast<double>(acc(r, c)));
          lse(b, hd, r0 + r) = static_cast<lse_type>(mg.lse);
        });
      });
}

/// In scratch `p` [nq, nk]: P = exp(scale * Q_i K_j^T - lse_i) for the queries at positions [i0, i0 + nq) (rows
/// i0 + q_shift of q, lse, d_o) and the keys at [j0, j0 + nk) (rows j0 + k_shift of k, v), zero where a key is not
/// visible; then, when `want_ds`, dS = scale * P o (dO_i V_j^T - D_i), D read from row_term[(b * h + hd) * n_rows +
/// row]. Used by both backward kernels of the team path.
template <class Team, class T, class Q, class K, class V, class Lse, class DO, class RowTerm, class Docs, class Mat>
KOKKOS_INLINE_FUNCTION void flash_team_probabilities(const typename Team::member& t, const Q& q, const K& k, const V& v,
                                                     const Lse& lse, const DO& d_o, const RowTerm& row_term,
                                                     const Docs& docs, std::int64_t b, std::int64_t hd,
                                                     std::int64_t n_h, std::int64_t n_rows, std::int64_t i0,
                                                     std::int64_t q_shift, std::int64_t nq, std::int64_t j0,
                                                     std::int64_t k_shift, std::int64_t nk, double scale, const Mat& p,
                                                     const Mat& ds, bool want_ds) {
  const std::int64_t qr = i0 + q_shift, kr = j0 + k_shift;
  KokkosBatched::TeamGemm<typename Team::member, typename Team::NT, typename Team::TR, typename Team::Algo>::invoke(
      t, T(1), head_block(q, b, hd, qr, nq), head_block(k, b, hd, kr, nk), T(0), p);
  if (want_ds)
    KokkosBatched::TeamGemm<typename Team::member, typename Team::NT, typename Team::TR, typename Team::Algo>::invoke(
        t, T(1), head_block(d_o, b, hd, qr, nq), head_block(v, b, hd, kr, nk), T(0), ds);
  t.team_barrier();
  const bool masked = !tile_fully_visible(i0, docs.start_of(i0 + nq - 1), j0, nk);
  Kokkos::parallel_for(Kokkos::TeamThreadRange(t, nq), [&](const std::int64_t r) {
    const std::int64_t first = masked ? first_visible(docs.start_of(i0 + r), j0, nk) : 0;
    const std::int64_t last = masked ? last_visible(i0 + r, j0, nk) : nk - 1;
    probabilities_row(&p(r, 0), nk, first, last, scale, static_cast<double>(lse(b, hd, qr + r)));
    if (want_ds) score_grad_row(&ds(r, 0), &p(r, 0), nk, scale, row_term((b * n_h + hd) * n_rows + qr + r));
  });
  t.team_barrier();
}

/// The backward of the queries of `rg` against its keys (row_term: D of the q View's rows, flash_row_term).
/// accumulate == false: dq, dk, dv of the range's rows are overwritten; true: the range's contribution is added.
template <class ExecSpace, class Q, class K, class V, class Lse, class DO, class DQ, class DK, class DV, class Docs>
void flash_backward_team_range(const ExecSpace& space, const Q& q, const K& k, const V& v, const Lse& lse,
                               const DO& d_o, const DQ& dq, const DK& dk, const DV& dv, bool do_dq, bool do_dk,
                               bool do_dv, const Docs& docs, const FlashRange& rg, bool accumulate, std::int64_t tile_q,
                               std::int64_t tile_k,
                               const detail::Vector<double, typename ExecSpace::memory_space>& row_term) {
  using T = typename DO::non_const_value_type;
  using team = FlashTeam<ExecSpace>;
  using mat = typename team::template matrix<T>;
  const auto n_b = static_cast<std::int64_t>(q.extent(0)), n_rows = static_cast<std::int64_t>(q.extent(1));
  const auto n_h = static_cast<std::int64_t>(q.extent(2)), d_qk = static_cast<std::int64_t>(q.extent(3));
  const auto d_v = static_cast<std::int64_t>(v.extent(3));
  const double scale = 1.0 / compat::math::sqrt(static_cast<double>(d_qk));
  const std::int64_t q_shift = rg.q_row - rg.q_pos, k_shift = rg.k_row - rg.k_pos;  // row of a position
  using NT = typename team::NT;
  using TR = typename team::TR;
  using Algo = typename team::Algo;
  using member = typename team::member;

  if ((do_dk || do_dv) && n_b * n_h * rg.n_k > 0) {
    const std::int64_t n_tiles = (rg.n_k + tile_k - 1) / tile_k;
    const std::size_t bytes =
        2 * mat::shmem_size(tile_q, tile_k) + mat::shmem_size(tile_k, d_qk) + mat::shmem_size(tile_k, d_v);
    const int level = team::level(bytes);
    Kokkos::parallel_for(
        "mlacp::flash_backward_dkdv_team", team::make(space, n_b * n_h * n_tiles, bytes),
        KOKKOS_LAMBDA(const member& t) {
          const std::int64_t tile = t.league_rank() % n_tiles, hd = (t.league_rank() / n_tiles) % n_h;
          const std::int64_t b = t.league_rank() / (n_tiles * n_h);
          const std::int64_t jt = tile * tile_k, nk = imin(tile_k, rg.n_k - jt), j0 = rg.k_pos + jt;
          mat p_all(t.team_scratch(level), tile_q, tile_k), ds_all(t.team_scratch(level), tile_q, tile_k);
          mat dk_all(t.team_scratch(level), tile_k, d_qk), dv_all(t.team_scratch(level), tile_k, d_v);
          const auto keys = Kokkos::make_pair<std::int64_t>(0, nk);
          const auto dk_acc = Kokkos::subview(dk_all, keys, Kokkos::ALL());
          const auto dv_acc = Kokkos::subview(dv_all, keys, Kokkos::ALL());
          bool first = true;
          // Query tiles (relative to q_pos) from the one holding j0 to the end of the last key's document.
          const std::int64_t i_first = imax(std::int64_t(0), j0 - rg.q_pos);
          const std::int64_t i_end = imin(rg.n_q, query_end(docs, j0, nk) - rg.q_pos);
          for (std::int64_t it = i_first / tile_q * tile_q; it < i_end; it += tile_q) {
            const std::int64_t nq = imin(tile_q, rg.n_q - it), i0 = rg.q_pos + it;
            const auto rows = Kokkos::make_pair<std::int64_t>(0, nq);
            const auto p = Kokkos::subview(p_all, rows, keys), ds = Kokkos::subview(ds_all, rows, keys);
            flash_team_probabilities<team, T>(t, q, k, v, lse, d_o, row_term, docs, b, hd, n_h, n_rows, i0, q_shift, nq,
                                              j0, k_shift, nk, scale, p, ds, do_dk);
            if (do_dv)
              KokkosBatched::TeamGemm<member, TR, NT, Algo>::invoke(
                  t, T(1), p, head_block(d_o, b, hd, i0 + q_shift, nq), first ? T(0) : T(1), dv_acc);
            if (do_dk)
              KokkosBatched::TeamGemm<member, TR, NT, Algo>::invoke(t, T(1), ds, head_block(q, b, hd, i0 + q_shift, nq),
                                                                    first ? T(0) : T(1), dk_acc);
            t.team_barrier();
            first = false;
          }
          if (first && accumulate) return;  // no query sees these keys: nothing to add
          const std::int64_t kr = j0 + k_shift;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, nk), [&](const std::int64_t r) {
            if (do_dk)
              for (std::int64_t c = 0; c < d_qk; ++c)
                dk(b, kr + r, hd, c) = first ? T(0) : accumulate ? dk(b, kr + r, hd, c) + dk_acc(r, c) : dk_acc(r, c);
            if (do_dv)
              for (std::int64_t c = 0; c < d_v; ++c)
                dv(b, kr + r, hd, c) = first ? T(0) : accumulate ? dv(b, kr + r, hd, c) + dv_acc(r, c) : dv_acc(r, c);
          });
        });
  }

  if (do_dq && n_b * n_h * rg.n_q > 0) {
    const std::int64_t n_tiles = (rg.n_q + tile_q - 1) / tile_q;
    const std::size_t bytes = 2 * mat::shmem_size(tile_q, tile_k) + mat::shmem_size(tile_q, d_qk);
    const int level = team::level(bytes);
    Kokkos::parallel_for(
        "mlacp::flash_backward_dq_team", team::make(space, n_b * n_h * n_tiles, bytes), KOKKOS_LAMBDA(const member& t) {
          const std::int64_t tile = t.league_rank() % n_tiles, hd = (t.league_rank() / n_tiles) % n_h;
          const std::int64_t b = t.league_rank() / (n_tiles * n_h);
          const std::int64_t it = tile * tile_q, nq = imin(tile_q, rg.n_q - it), i0 = rg.q_pos + it;
          mat p_all(t.team_scratch(level), tile_q, tile_k), ds_all(t.team_scratch(level), tile_q, tile_k);
          mat dq_all(t.team_scratch(level), tile_q, d_qk);
          const auto rows = Kokkos::make_pair<std::int64_t>(0, nq);
          const auto dq_acc = Kokkos::subview(dq_all, rows, Kokkos::ALL());
          // Key tiles (relative to k_pos) from the one holding the first query's document start to the last query.
          const std::int64_t k_first = imax(std::int64_t(0), docs.start_of(i0) - rg.k_pos);
          const std::int64_t k_end = imin(rg.n_k, i0 + nq - rg.k_pos);
          const std::int64_t j_begin = k_end > k_first ? k_first / tile_k * tile_k : k_end;
          for (std::int64_t jt = j_begin; jt < k_end; jt += tile_k) {
            const std::int64_t nk = imin(tile_k, k_end - jt), j0 = rg.k_pos + jt;
            const auto keys = Kokkos::make_pair<std::int64_t>(0, nk);
            const auto p = Kokkos::subview(p_all, rows, keys), ds = Kokkos::subview(ds_all, rows, keys);
            flash_team_probabilities<team, T>(t, q, k, v, lse, d_o, row_term, docs, b, hd, n_h, n_rows, i0, q_shift, nq,
                                              j0, k_shift, nk, scale, p, ds, true);
            KokkosBatched::TeamGemm<member, NT, NT, Algo>::invoke(t, T(1), ds, head_block(k, b, hd, j0 + k_shift, nk),
                                                                  jt == j_begin ? T(0) : T(1), dq_acc);
            t.team_barrier();
          }
          const bool none = j_begin >= k_end;  // no key of the range visible to the tile
          if (none && accumulate) return;
          const std::int64_t qr = i0 + q_shift;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, nq), [&](const std::int64_t r) {
            for (std::int64_t c = 0; c < d_qk; ++c)
              dq(b, qr + r, hd, c) = none ? T(0) : accumulate ? dq(b, qr + r, hd, c) + dq_acc(r, c) : dq_acc(r, c);
          });
        });
  }
}

}  // namespace mlacp::detail
