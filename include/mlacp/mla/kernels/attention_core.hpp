// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Causal scaled-dot-product attention on head-local data (docs/spec.md step 6), numerically stable (online softmax) and
// never materialising the S x S score matrix:
//   q, k `[B, S, h, dqk]`, v `[B, S, h, dv]`, o `[B, S, h, dv]`, lse `[B, h, S]`;
//   o_i = sum_{j <= i} P_ij v_j,  P_ij = exp(scale * q_i.k_j - lse_i),  lse_i = log sum_{j <= i} exp(scale * q_i.k_j),
//   scale = 1/sqrt(dqk); the position of a token is its index along S (the global token index).
// With a DocumentLayout (packed documents, `cu_seqlens`, document_layout.hpp; the same for every batch row) the sums
// run over the keys of the query's document only: j in [start_of(i), i].
//
// The kernels are simple and portable, one thread per (b, row, head) with loops over keys and channels; they are the
// reference-quality default, not a tuned flash-attention kernel. Dot products accumulate in the value type; the
// softmax scalars (running max, running sum, probabilities) are double.
//
// The contract of a core (the problem it is given, its capabilities, the two calls) is in attention_problem.hpp.
// CausalAttentionCore below is the reference core: one kernel per call for every problem, square or positioned (ring
// attention's blocks), with the square problem computed exactly as the square kernels of old computed it.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/document_layout.hpp>
#include <mlacp/mla/kernels/attention_problem.hpp>
#include <mlacp/mla/kernels/token_segments.hpp>
#include <mlacp/mla/kernels/view_utils.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mlacp {
namespace detail {

template <std::size_t N>
std::string extents_string(const std::array<std::size_t, N>& e) {
  std::string s = "[";
  for (std::size_t i = 0; i < N; ++i) s += (i ? ", " : "") + std::to_string(e[i]);
  return s + "]";
}

template <class ViewType, std::size_t N>
void check_extents(const char* who, const char* name, const ViewType& v, const std::array<std::size_t, N>& expected) {
  static_assert(compat::view_rank_v<ViewType> == static_cast<int>(N), "mlacp: a View argument has the wrong rank");
  std::array<std::size_t, N> got{};
  for (std::size_t i = 0; i < N; ++i) got[i] = v.extent(i);
  if (got != expected) {
    throw mlacp::InvalidArgument(std::string("mlacp::") + who + ": " + name + " is " + extents_string(got) +
                                 ", expected " + extents_string(expected));
  }
}

template <class QView, class KView, class VView, class OView, class LseView>
void attention_check(const char* who, const QView& q, const KView& k, const VView& v, const OView& o,
                     const LseView& lse) {
  const std::size_t n_b = q.extent(0), n_s = q.extent(1), n_h = q.extent(2), d_qk = q.extent(3);
  const std::size_t d_v = v.extent(3);
  if (d_qk == 0) throw mlacp::InvalidArgument(std::string("mlacp::") + who + ": q.extent(3) = 0, expected dqk > 0");
  check_extents<KView, 4>(who, "k", k, {n_b, n_s, n_h, d_qk});
  check_extents<VView, 4>(who, "v", v, {n_b, n_s, n_h, d_v});
  check_extents<OView, 4>(who, "o", o, {n_b, n_s, n_h, d_v});
  check_extents<LseView, 3>(who, "lse", lse, {n_b, n_h, n_s});
}

/// The checks of a block call: q [B, nq, h, dqk] with nq = q_rows.rows(), k [B, nk, h, dqk] and v [B, nk, h, dv] with
/// nk = k_rows.rows(), o [B, nq, h, dv], lse [B, h, nq], every position below seq.
template <class QView, class KView, class VView, class OView, class LseView>
void block_check(const char* who, const QView& q, const KView& k, const VView& v, const OView& o, const LseView& lse,
                 const TokenSegments& q_rows, const TokenSegments& k_rows, std::int64_t seq) {
  static_assert(compat::view_rank_v<QView> == 4, "mlacp: q must be rank-4 [B, nq, h, dqk]");
  static_assert(compat::view_rank_v<VView> == 4, "mlacp: v must be rank-4 [B, nk, h, dv]");
  const std::size_t n_b = q.extent(0), n_h = q.extent(2), d_qk = q.extent(3), d_v = v.extent(3);
  const auto nq = static_cast<std::size_t>(q_rows.rows()), nk = static_cast<std::size_t>(k_rows.rows());
  if (d_qk == 0) throw mlacp::InvalidArgument(std::string("mlacp::") + who + ": q.extent(3) = 0, expected dqk > 0");
  if (q_rows.last_end() > seq || k_rows.last_end() > seq)
    throw mlacp::InvalidArgument(std::string("mlacp::") + who + ": token positions up to " +
                                 std::to_string(std::max(q_rows.last_end(), k_rows.last_end())) +
                                 ", expected them inside the sequence of seq = " + std::to_string(seq) + " tokens");
  check_extents<QView, 4>(who, "q (rows: q_rows.rows())", q, {n_b, nq, n_h, d_qk});
  check_extents<KView, 4>(who, "k (rows: k_rows.rows())", k, {n_b, nk, n_h, d_qk});
  check_extents<VView, 4>(who, "v (rows: k_rows.rows())", v, {n_b, nk, n_h, d_v});
  check_extents<OView, 4>(who, "o", o, {n_b, nq, n_h, d_v});
  check_extents<LseView, 3>(who, "lse", lse, {n_b, n_h, nq});
}

/// The gradient checks of a backward (the outputs not needed are not checked).
template <class QView, class KView, class VView, class DoView, class DqView, class DkView, class DvView>
void block_gradient_check(const char* who, const QView& q, const KView& k, const VView& v, const DoView& d_o,
                          const DqView& dq, const DkView& dk, const DvView& dv, bool do_dq, bool do_dk, bool do_dv) {
  const std::size_t n_b = q.extent(0), nq = q.extent(1), n_h = q.extent(2), d_qk = q.extent(3), d_v = v.extent(3);
  const std::size_t nk = k.extent(1);
  check_extents<DoView, 4>(who, "d_o", d_o, {n_b, nq, n_h, d_v});
  if (do_dq) check_extents<DqView, 4>(who, "dq", dq, {n_b, nq, n_h, d_qk});
  if (do_dk) check_extents<DkView, 4>(who, "dk", dk, {n_b, nk, n_h, d_qk});
  if (do_dv) check_extents<DvView, 4>(who, "dv", dv, {n_b, nk, n_h, d_v});
}

/// The checks of a problem (attention_problem.hpp): the square problem's (q, k, v, o, lse of one sequence), else a
/// block's (rows by q_rows and k_rows, positions inside seq).
template <class QView, class KView, class VView, class OView, class LseView, class Problem>
void problem_check(const char* who, const QView& q, const KView& k, const VView& v, const OView& o, const LseView& lse,
                   const Problem& pb) {
  static_assert(compat::view_rank_v<QView> == 4, "mlacp: q must be rank-4 [B, nq, h, dqk]");
  static_assert(compat::view_rank_v<VView> == 4, "mlacp: v must be rank-4 [B, nk, h, dv]");
  if (pb.square() && pb.seq == static_cast<std::int64_t>(q.extent(1)) &&
      pb.q_rows.rows() == static_cast<std::int64_t>(q.extent(1)))
    attention_check(who, q, k, v, o, lse);
  else
    block_check(who, q, k, v, o, lse, pb.q_rows, pb.k_rows, pb.seq);
}

/// Sets every element of a rank-4 View to zero on `space`.
template <class ExecSpace, class View4>
void zero_view(const ExecSpace& space, const View4& t) {
  using value_type = typename View4::non_const_value_type;
  if (t.size() == 0) return;
  const auto n1 = static_cast<std::int64_t>(t.extent(1)), n2 = static_cast<std::int64_t>(t.extent(2));
  const auto n3 = static_cast<std::int64_t>(t.extent(3));
  const std::int64_t rows = static_cast<std::int64_t>(t.extent(0)) * n1 * n2;
  Kokkos::parallel_for(
      "mlacp::zero_view", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t idx) {
        const std::int64_t c2 = idx % n2, c1 = (idx / n2) % n1, c0 = idx / (n2 * n1);
        for (std::int64_t c = 0; c < n3; ++c) t(c0, c1, c2, c) = value_type(0);
      });
}

/// Rows [row0, row0 + n) of a block that see no key: o 0, lse -inf.
template <class ExecSpace, class OView, class LseView>
void block_no_attention(const ExecSpace& space, const OView& o, const LseView& lse, std::int64_t row0, std::int64_t n) {
  using o_type = typename OView::non_const_value_type;
  using lse_type = typename LseView::non_const_value_type;
  const auto n_h = static_cast<std::int64_t>(o.extent(2)), d_v = static_cast<std::int64_t>(o.extent(3));
  const std::int64_t rows = static_cast<std::int64_t>(o.extent(0)) * n * n_h;
  const auto neg_inf = static_cast<lse_type>(-std::numeric_limits<double>::infinity());
  if (rows == 0) return;
  Kokkos::parallel_for(
      "mlacp::block_no_attention", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t idx) {
        const std::int64_t hd = idx % n_h, i = row0 + (idx / n_h) % n, b = idx / (n_h * n);
        for (std::int64_t c = 0; c < d_v; ++c) o(b, i, hd, c) = o_type(0);
        lse(b, hd, i) = neg_inf;
      });
}

}  // namespace detail

namespace detail {

/// Calls fn(row, position) for the rows of `rows` (TokenSegments) whose positions lie in [lo, hi), in ascending
/// position order.
template <class Fn>
KOKKOS_INLINE_FUNCTION void for_rows_in(const TokenSegments& rows, std::int64_t lo, std::int64_t hi, Fn&& fn) {
  for (int t = 0; t < rows.segments(); ++t) {
    const std::int64_t first = lo > rows.begin(t) ? lo : rows.begin(t), end = hi < rows.end(t) ? hi : rows.end(t);
    const std::int64_t shift = rows.row_of_segment(t) - rows.begin(t);
    for (std::int64_t pos = first; pos < end; ++pos) fn(pos + shift, pos);
  }
}

}  // namespace detail

/// The reference forward of a problem (attention_problem.hpp), one thread per (b, query, head): an online softmax
/// over the keys the query sees, in ascending position order. first: o and lse are overwritten (a query that sees no
/// key: o 0, lse -inf); else the state starts from what they hold (max lse, sum 1, accumulator o: a normalised result
/// is its own online-softmax state) and the keys are merged into it. Simple and portable: the reference of the tests.
/// Dot products accumulate in the accumulation type of q; the softmax scalars are double.
template <class ExecSpace, class Problem>
void attention_forward(const ExecSpace& space, const Problem& pb) {
  using QView = std::decay_t<decltype(pb.q)>;
  using OView = std::decay_t<decltype(pb.o)>;
  using LseView = std::decay_t<decltype(pb.lse)>;
  static_assert_accessible<ExecSpace, QView>();
  static_assert_accessible<ExecSpace, std::decay_t<decltype(pb.k)>>();
  static_assert_accessible<ExecSpace, std::decay_t<decltype(pb.v)>>();
  static_assert_accessible<ExecSpace, OView>();
  static_assert_accessible<ExecSpace, LseView>();
  const char* who = "attention_forward";
  const auto q = pb.q;
  const auto k = pb.k;
  const auto v = pb.v;
  const auto o = pb.o;
  const auto lse = pb.lse;
  detail::problem_check(who, q, k, v, o, lse, pb);
  const auto docs = pb.documents().template offsets_for<ExecSpace>(pb.seq, who);
  using acc_type = compat::accumulation_t<typename QView::non_const_value_type>;
  using o_type = typename OView::non_const_value_type;
  using lse_type = typename LseView::non_const_value_type;
  const TokenSegments q_rows = pb.q_rows, k_rows = pb.k_rows;
  const bool first = pb.first;
  const std::int64_t n_q = q_rows.rows(), n_h = static_cast<std::int64_t>(q.extent(2));
  const int d_qk = static_cast<int>(q.extent(3)), d_v = static_cast<int>(v.extent(3));
  const double scale = 1.0 / compat::math::sqrt(static_cast<double>(d_qk));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const std::int64_t rows = static_cast<std::int64_t>(q.extent(0)) * n_q * n_h;
  if (rows == 0) return;
  Kokkos::parallel_for(
      "mlacp::attention_forward", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t idx) {
        const std::int64_t hd = idx % n_h, i = (idx / n_h) % n_q, b = idx / (n_h * n_q);
        const std::int64_t pos = q_rows.position(i);
        double m = 0.0;  // running max of the scores
        double l = 0.0;  // running sum of exp(score - m)
        const double lse_old = first ? neg_inf : static_cast<double>(lse(b, hd, i));
        bool started = lse_old != neg_inf;  // an earlier result: its state is (lse, 1, o)
        if (started) {
          m = lse_old;
          l = 1.0;
        }
        detail::for_rows_in(k_rows, docs.start_of(pos), pos + 1, [&](std::int64_t j, std::int64_t) {
          acc_type dot = 0;
          for (int c = 0; c < d_qk; ++c)
            dot += static_cast<acc_type>(q(b, i, hd, c)) * static_cast<acc_type>(k(b, j, hd, c));
          const double score = static_cast<double>(dot) * scale;
          if (!started) {
            started = true;
            m = score;
            l = 1.0;
            for (int c = 0; c < d_v; ++c) o(b, i, hd, c) = static_cast<o_type>(v(b, j, hd, c));
            return;
          }
          if (score > m) {
            const double alpha = compat::math::exp(m - score);
            const o_type alpha_o = static_cast<o_type>(alpha);
            l *= alpha;
            for (int c = 0; c < d_v; ++c) o(b, i, hd, c) *= alpha_o;
            m = score;
          }
          const double p = compat::math::exp(score - m);
          const o_type p_o = static_cast<o_type>(p);
          l += p;
          for (int c = 0; c < d_v; ++c) o(b, i, hd, c) += p_o * static_cast<o_type>(v(b, j, hd, c));
        });
        if (!started) {  // no key seen and no earlier result: no attention (merging: the -inf row stays)
          if (first) {
            for (int c = 0; c < d_v; ++c) o(b, i, hd, c) = o_type(0);
            lse(b, hd, i) = static_cast<lse_type>(neg_inf);
          }
          return;
        }
        const o_type inv_l = static_cast<o_type>(1.0 / l);
        for (int c = 0; c < d_v; ++c) o(b, i, hd, c) *= inv_l;
        lse(b, hd, i) = static_cast<lse_type>(m + compat::math::log(l));
      });
}

/// The reference backward of a problem, recomputing P from lse (no S x S storage), with D_i = sum_c dO_ic O_ic and
/// dS_ij = P_ij (dO_i.v_j - D_i):
///   dq_i = scale * sum_j dS_ij k_j,  dk_j = scale * sum_i dS_ij q_i,  dv_j = sum_i P_ij dO_i
/// over the visible pairs. first: dq, dk, dv are overwritten, else accumulated (+=); any may be empty (not needed). One
/// thread per (b, query, head) for dq and per (b, key, head) for dk and dv: no atomics, no temporary allocation (D_i
/// is recomputed where needed). Asynchronous on `space`.
template <class ExecSpace, class Problem>
void attention_backward(const ExecSpace& space, const Problem& pb) {
  using QView = std::decay_t<decltype(pb.q)>;
  using DqView = std::decay_t<decltype(pb.dq)>;
  using DkView = std::decay_t<decltype(pb.dk)>;
  using DvView = std::decay_t<decltype(pb.dv)>;
  static_assert_accessible<ExecSpace, QView>();
  static_assert_accessible<ExecSpace, std::decay_t<decltype(pb.k)>>();
  static_assert_accessible<ExecSpace, std::decay_t<decltype(pb.v)>>();
  static_assert_accessible<ExecSpace, std::decay_t<decltype(pb.o)>>();
  static_assert_accessible<ExecSpace, std::decay_t<decltype(pb.lse)>>();
  static_assert_accessible<ExecSpace, std::decay_t<decltype(pb.d_o)>>();
  static_assert_accessible<ExecSpace, DqView>();
  static_assert_accessible<ExecSpace, DkView>();
  static_assert_accessible<ExecSpace, DvView>();
  const char* who = "attention_backward";
  const auto q = pb.q;
  const auto k = pb.k;
  const auto v = pb.v;
  const auto o = pb.o;
  const auto lse = pb.lse;
  const auto d_o = pb.d_o;
  const auto dq = pb.dq;
  const auto dk = pb.dk;
  const auto dv = pb.dv;
  detail::problem_check(who, q, k, v, o, lse, pb);
  const bool do_dq = pb.needs_dq(), do_dk = pb.needs_dk(), do_dv = pb.needs_dv();
  detail::block_gradient_check(who, q, k, v, d_o, dq, dk, dv, do_dq, do_dk, do_dv);
  const auto docs = pb.documents().template offsets_for<ExecSpace>(pb.seq, who);
  using acc_type = compat::accumulation_t<typename QView::non_const_value_type>;
  using dq_type = typename DqView::non_const_value_type;
  using dk_type = typename DkView::non_const_value_type;
  using dv_type = typename DvView::non_const_value_type;
  const TokenSegments q_rows = pb.q_rows, k_rows = pb.k_rows;
  const bool first = pb.first;
  const std::int64_t n_q = q_rows.rows(), n_k = k_rows.rows();
  const std::int64_t n_b = static_cast<std::int64_t>(q.extent(0)), n_h = static_cast<std::int64_t>(q.extent(2));
  const int d_qk = static_cast<int>(q.extent(3)), d_v = static_cast<int>(v.extent(3));
  const double scale = 1.0 / compat::math::sqrt(static_cast<double>(d_qk));
  using policy_type = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  if (n_b * n_h == 0 || !(do_dq || do_dk || do_dv)) return;
  // The score of query row i and key row j and dP_ij = dO_i . v_j; D_i = dO_i . O_i.
  auto dot_qk = KOKKOS_LAMBDA(std::int64_t b, std::int64_t i, std::int64_t j, std::int64_t hd) {
    acc_type dot = 0;
    for (int c = 0; c < d_qk; ++c) dot += static_cast<acc_type>(q(b, i, hd, c)) * static_cast<acc_type>(k(b, j, hd, c));
    return dot;
  };
  auto dot_dov = KOKKOS_LAMBDA(std::int64_t b, std::int64_t i, std::int64_t j, std::int64_t hd) {
    acc_type dp = 0;
    for (int c = 0; c < d_v; ++c) dp += static_cast<acc_type>(d_o(b, i, hd, c)) * static_cast<acc_type>(v(b, j, hd, c));
    return dp;
  };
  auto row_term = KOKKOS_LAMBDA(std::int64_t b, std::int64_t i, std::int64_t hd) {
    double d_i = 0.0;
    for (int c = 0; c < d_v; ++c) d_i += static_cast<double>(d_o(b, i, hd, c)) * static_cast<double>(o(b, i, hd, c));
    return d_i;
  };
  if (do_dq && n_q > 0) {
    Kokkos::parallel_for(
        "mlacp::attention_backward_dq", policy_type(space, 0, n_b * n_q * n_h), KOKKOS_LAMBDA(const std::int64_t idx) {
          const std::int64_t hd = idx % n_h, i = (idx / n_h) % n_q, b = idx / (n_h * n_q);
          const std::int64_t pos = q_rows.position(i);
          const double lse_i = static_cast<double>(lse(b, hd, i));
          const double d_i = row_term(b, i, hd);
          if (first)
            for (int c = 0; c < d_qk; ++c) dq(b, i, hd, c) = dq_type(0);
          detail::for_rows_in(k_rows, docs.start_of(pos), pos + 1, [&](std::int64_t j, std::int64_t) {
            const double p = compat::math::exp(static_cast<double>(dot_qk(b, i, j, hd)) * scale - lse_i);
            const acc_type dp = dot_dov(b, i, j, hd);
            const dq_type coef = static_cast<dq_type>(scale * p * (static_cast<double>(dp) - d_i));
            for (int c = 0; c < d_qk; ++c) dq(b, i, hd, c) += coef * static_cast<dq_type>(k(b, j, hd, c));
          });
        });
  }
  if ((do_dk || do_dv) && n_k > 0) {
    Kokkos::parallel_for(
        "mlacp::attention_backward_dkdv", policy_type(space, 0, n_b * n_k * n_h),
        KOKKOS_LAMBDA(const std::int64_t idx) {
          const std::int64_t hd = idx % n_h, j = (idx / n_h) % n_k, b = idx / (n_h * n_k);
          const std::int64_t kp = k_rows.position(j);
          if (first && do_dk)
            for (int c = 0; c < d_qk; ++c) dk(b, j, hd, c) = dk_type(0);
          if (first && do_dv)
            for (int c = 0; c < d_v; ++c) dv(b, j, hd, c) = dv_type(0);
          detail::for_rows_in(q_rows, kp, docs.end_of(kp), [&](std::int64_t i, std::int64_t) {
            const double p = compat::math::exp(static_cast<double>(dot_qk(b, i, j, hd)) * scale -
                                               static_cast<double>(lse(b, hd, i)));
            if (do_dv) {
              const dv_type p_v = static_cast<dv_type>(p);
              for (int c = 0; c < d_v; ++c) dv(b, j, hd, c) += p_v * static_cast<dv_type>(d_o(b, i, hd, c));
            }
            if (do_dk) {
              const acc_type dp = dot_dov(b, i, j, hd);
              const double d_i = row_term(b, i, hd);
              const dk_type coef = static_cast<dk_type>(scale * p * (static_cast<double>(dp) - d_i));
              for (int c = 0; c < d_qk; ++c) dk(b, j, hd, c) += coef * static_cast<dk_type>(q(b, i, hd, c));
            }
          });
        });
  }
}

/// The square reference forward: o [B, S, h, dv] and lse [B, h, S] from q, k [B, S, h, dqk] and v [B, S, h, dv], causal
/// (with `documents`, covering S tokens: within each document). The problem attention_problem(q, k, v, o, lse).
template <class ExecSpace, class QView, class KView, class VView, class OView, class LseView>
void attention_forward(const ExecSpace& space, const QView& q, const KView& k, const VView& v, const OView& o,
                       const LseView& lse, const DocumentLayout& documents = DocumentLayout()) {
  attention_forward(space, attention_problem(q, k, v, o, lse, documents));
}

/// The square reference backward: dq, dk, dv (overwritten; any may be empty) of the square forward.
template <class ExecSpace, class QView, class KView, class VView, class OView, class LseView, class DoView,
          class DqView, class DkView, class DvView>
void attention_backward(const ExecSpace& space, const QView& q, const KView& k, const VView& v, const OView& o,
                        const LseView& lse, const DoView& d_o, const DqView& dq, const DkView& dk, const DvView& dv,
                        const DocumentLayout& documents = DocumentLayout()) {
  attention_backward(space, attention_problem(q, k, v, o, lse, d_o, dq, dk, dv, documents));
}

/// The reference attention core of the tests: attention_forward / attention_backward of a problem as members (square
/// and positioned problems, packed documents; the interface of attention_problem.hpp).
struct CausalAttentionCore {
  static constexpr AttentionCoreCapabilities capabilities{true, true, false, false, false};

  template <class ExecSpace, class Problem>
  void forward(const ExecSpace& space, const Problem& problem) const {
    attention_forward(space, problem);
  }
  template <class ExecSpace, class Problem>
  void backward(const ExecSpace& space, const Problem& problem) const {
    attention_backward(space, problem);
  }
};

}  // namespace mlacp
