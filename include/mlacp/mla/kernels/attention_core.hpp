// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Causal scaled-dot-product attention on head-local data (MLA_SPEC step 6), numerically stable (online softmax) and
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
// Replacing the core: the MLA layer takes the core as a template parameter. A user-supplied core is a type with
//   template <class ExecSpace, class Q, class K, class V, class O, class Lse>
//   void forward(const ExecSpace&, const Q& q, const K& k, const V& v, const O& o, const Lse& lse) const;
//   template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK, class DV>
//   void backward(const ExecSpace&, const Q&, const K&, const V&, const O&, const Lse&, const DO& d_o, const DQ& dq,
//                 const DK& dk, const DV& dv) const;
// with the shapes above: forward reads q, k, v and writes o and the saved state lse `[B, h, S]` (any per-row
// statistic it needs, in that View); backward reads q, k, v, o, lse and d_o and overwrites dq, dk, dv (each of which
// may be an empty View, meaning "not needed"). Both run asynchronously on the given execution-space instance.
// Cores that support packed documents also take a trailing `const DocumentLayout&` in both calls.
// A core that reads settings of its own (tiles, environment variables) also provides
//   template <class ExecSpace> std::string resolve();   // reads and checks them now: "" or the error
//   std::vector<std::pair<std::string, std::int64_t>> settings() const;  // what it resolved, by name
// The MLA layer calls resolve() once in its constructor, before its agreement, and agrees the settings across the
// ranks: a bad or differing setting is one error on every rank at construction, never one raised inside a schedule
// (where ranks that hold no head would not see it). FlashAttentionCore does; a core without them keeps working.
//
// Ring attention (issue 21) computes attention in blocks: the queries of one ring chunk against the keys of another.
// A core that can (FlashAttentionCore on both paths, bf16 on the BLAS path only; CausalAttentionCore) also provides
//   template <class ExecSpace, class Q, class K, class V, class OAcc, class LseAcc>
//   void forward_block(const ExecSpace&, const Q& q, const K& k, const V& v, const OAcc& o_acc, const LseAcc& lse_acc,
//                      const TokenSegments& q_rows, const TokenSegments& k_rows, const DocumentLayout& documents,
//                      std::int64_t seq, bool first) const;
//   template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK, class DV>
//   void backward_block(const ExecSpace&, const Q&, const K&, const V&, const O& o, const Lse& lse, const DO& d_o,
//                       const DQ& dq_acc, const DK& dk_acc, const DV& dv_acc, const TokenSegments& q_rows,
//                       const TokenSegments& k_rows, const DocumentLayout& documents, std::int64_t seq) const;
//   template <class ExecSpace> bool computes_blocks() const;   // optional: false where the block calls refuse to run
// q [B, nq, h, dqk] holds the queries at the global positions q_rows (token_segments.hpp: at most two ascending
// segments), k [B, nk, h, dqk] and v [B, nk, h, dv] the keys at k_rows; `documents` packs the global sequence of `seq`
// tokens (empty: one document). A key is visible to a query when key position <= query position and both are in the
// same document. forward_block: o_acc [B, nq, h, dv] in the accumulation type (compat::accumulation_t of the stored
// type: float for bf16) and lse_acc [B, h, nq] (float for bf16 and float, double for double); first: overwritten with
// this block's attention (a row that sees no key of the block: o 0, lse -inf), else merged with what they hold by
// log-sum-exp (-inf on either side: the other side). backward_block: o and lse are the final forward of the queries
// over every key, d_o [B, nq, h, dv]; dq_acc [B, nq, h, dqk], dk_acc [B, nk, h, dqk], dv_acc [B, nk, h, dv] in the
// accumulation type are accumulated (+=) with this block's contribution; any may be empty (not needed). The ring
// driver calls forward_block for a query chunk over every key chunk (first = true once), then backward_block over
// every (query chunk, key chunk) pair. detail::core_computes_blocks<Core, ExecSpace>(core) says whether a core can.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>
#include <mlacp/mla/document_layout.hpp>
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

/// Whether Core resolves its settings up front (resolve<ExecSpace>() and settings(), see the top of this file).
template <class Core, class ExecSpace, class = void>
struct core_resolves_settings : std::false_type {};
template <class Core, class ExecSpace>
struct core_resolves_settings<
    Core, ExecSpace,
    std::enable_if_t<
        std::is_convertible_v<decltype(std::declval<Core&>().template resolve<ExecSpace>()), std::string> &&
        std::is_convertible_v<decltype(std::declval<const Core&>().settings()),
                              std::vector<std::pair<std::string, std::int64_t>>>>> : std::true_type {};
template <class Core, class ExecSpace>
inline constexpr bool core_resolves_settings_v = core_resolves_settings<Core, ExecSpace>::value;

/// Whether Core has forward_block (the block interface at the top of this file).
template <class Core, class ExecSpace, class = void>
struct core_has_blocks : std::false_type {};
template <class Core, class ExecSpace>
struct core_has_blocks<Core, ExecSpace,
                       std::void_t<decltype(&Core::template forward_block<
                                            ExecSpace, Kokkos::View<double****, typename ExecSpace::memory_space>,
                                            Kokkos::View<double****, typename ExecSpace::memory_space>,
                                            Kokkos::View<double****, typename ExecSpace::memory_space>,
                                            Kokkos::View<double****, typename ExecSpace::memory_space>,
                                            Kokkos::View<double***, typename ExecSpace::memory_space>>)>>
    : std::true_type {};
template <class Core, class ExecSpace, class = void>
struct core_reports_blocks : std::false_type {};
template <class Core, class ExecSpace>
struct core_reports_blocks<Core, ExecSpace,
                           std::void_t<decltype(std::declval<const Core&>().template computes_blocks<ExecSpace>())>>
    : std::true_type {};

/// Whether `core` computes ring attention's blocks on ExecSpace: false for a core without forward_block, else its
/// computes_blocks<ExecSpace>() where it has one, else true.
template <class Core, class ExecSpace>
bool core_computes_blocks(const Core& core) {
  if constexpr (!core_has_blocks<Core, ExecSpace>::value) {
    (void)core;
    return false;
  } else if constexpr (core_reports_blocks<Core, ExecSpace>::value) {
    return core.template computes_blocks<ExecSpace>();
  } else {
    (void)core;
    return true;
  }
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

/// The gradient checks of backward_block (the outputs not needed are not checked).
template <class QView, class KView, class VView, class DoView, class DqView, class DkView, class DvView>
void block_gradient_check(const char* who, const QView& q, const KView& k, const VView& v, const DoView& d_o,
                          const DqView& dq, const DkView& dk, const DvView& dv, bool do_dq, bool do_dk, bool do_dv) {
  const std::size_t n_b = q.extent(0), nq = q.extent(1), n_h = q.extent(2), d_qk = q.extent(3), d_v = v.extent(3);
  const std::size_t nk = k.extent(1);
  check_extents<DoView, 4>(who, "d_o", d_o, {n_b, nq, n_h, d_v});
  if (do_dq) check_extents<DqView, 4>(who, "dq_acc", dq, {n_b, nq, n_h, d_qk});
  if (do_dk) check_extents<DkView, 4>(who, "dk_acc", dk, {n_b, nk, n_h, d_qk});
  if (do_dv) check_extents<DvView, 4>(who, "dv_acc", dv, {n_b, nk, n_h, d_v});
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

/// Causal attention forward: writes o `[B, S, h, dv]` and the row log-sum-exp lse `[B, h, S]` from q, k `[B, S, h,
/// dqk]` and v `[B, S, h, dv]`. One thread per (b, query, head); online softmax. Asynchronous on `space`. With
/// `documents` (covering S tokens), causal within each document.
template <class ExecSpace, class QView, class KView, class VView, class OView, class LseView>
void attention_forward(const ExecSpace& space, const QView& q, const KView& k, const VView& v, const OView& o,
                       const LseView& lse, const DocumentLayout& documents = DocumentLayout()) {
  static_assert(compat::view_rank_v<QView> == 4, "mlacp::attention_forward: q must be rank-4 [B, S, h, dqk]");
  static_assert(compat::view_rank_v<VView> == 4, "mlacp::attention_forward: v must be rank-4 [B, S, h, dv]");
  static_assert_accessible<ExecSpace, QView>();
  static_assert_accessible<ExecSpace, KView>();
  static_assert_accessible<ExecSpace, VView>();
  static_assert_accessible<ExecSpace, OView>();
  static_assert_accessible<ExecSpace, LseView>();
  detail::attention_check("attention_forward", q, k, v, o, lse);
  const auto docs = documents.offsets_for<ExecSpace>(static_cast<std::int64_t>(q.extent(1)), "attention_forward");
  using acc_type = typename QView::non_const_value_type;
  using o_type = typename OView::non_const_value_type;
  using lse_type = typename LseView::non_const_value_type;
  const std::int64_t n_b = static_cast<std::int64_t>(q.extent(0));
  const std::int64_t n_s = static_cast<std::int64_t>(q.extent(1));
  const std::int64_t n_h = static_cast<std::int64_t>(q.extent(2));
  const int d_qk = static_cast<int>(q.extent(3));
  const int d_v = static_cast<int>(v.extent(3));
  const double scale = 1.0 / compat::math::sqrt(static_cast<double>(d_qk));
  const std::int64_t rows = n_b * n_s * n_h;
  if (rows == 0) return;
  Kokkos::parallel_for(
      "mlacp::attention_forward", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t idx) {
        const std::int64_t hd = idx % n_h;
        const std::int64_t i = (idx / n_h) % n_s;
        const std::int64_t b = idx / (n_h * n_s);
        double m = 0.0;  // running max of the scores
        double l = 0.0;  // running sum of exp(score - m)
        const std::int64_t j_first = docs.start_of(i);
        for (std::int64_t j = j_first; j <= i; ++j) {
          acc_type dot = 0;
          for (int c = 0; c < d_qk; ++c) dot += q(b, i, hd, c) * k(b, j, hd, c);
          const double score = static_cast<double>(dot) * scale;
          if (j == j_first) {
            m = score;
            l = 1.0;
            for (int c = 0; c < d_v; ++c) o(b, i, hd, c) = static_cast<o_type>(v(b, j, hd, c));
            continue;
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
        }
        const o_type inv_l = static_cast<o_type>(1.0 / l);
        for (int c = 0; c < d_v; ++c) o(b, i, hd, c) *= inv_l;
        lse(b, hd, i) = static_cast<lse_type>(m + compat::math::log(l));
      });
}

/// Causal attention backward, recomputing P from lse (no S x S storage), with D_i = sum_c dO_ic O_ic and
/// dS_ij = P_ij (dO_i.v_j - D_i):
///   dq_i = scale * sum_{j <= i} dS_ij k_j,  dk_j = scale * sum_{i >= j} dS_ij q_i,  dv_j = sum_{i >= j} P_ij dO_i
/// (with `documents`: j from start_of(i), i below end_of(j)).
/// dq, dk, dv are overwritten; any of them may be an empty View ("not needed"), whose work is then skipped.
/// One thread per (b, query, head) for dq and per (b, key, head) for dk and dv: no atomics, no temporary allocation
/// (D_i is recomputed where needed). Asynchronous on `space`.
template <class ExecSpace, class QView, class KView, class VView, class OView, class LseView, class DoView,
          class DqView, class DkView, class DvView>
void attention_backward(const ExecSpace& space, const QView& q, const KView& k, const VView& v, const OView& o,
                        const LseView& lse, const DoView& d_o, const DqView& dq, const DkView& dk, const DvView& dv,
                        const DocumentLayout& documents = DocumentLayout()) {
  static_assert(compat::view_rank_v<QView> == 4, "mlacp::attention_backward: q must be rank-4 [B, S, h, dqk]");
  static_assert(compat::view_rank_v<VView> == 4, "mlacp::attention_backward: v must be rank-4 [B, S, h, dv]");
  static_assert_accessible<ExecSpace, QView>();
  static_assert_accessible<ExecSpace, KView>();
  static_assert_accessible<ExecSpace, VView>();
  static_assert_accessible<ExecSpace, OView>();
  static_assert_accessible<ExecSpace, LseView>();
  static_assert_accessible<ExecSpace, DoView>();
  static_assert_accessible<ExecSpace, DqView>();
  static_assert_accessible<ExecSpace, DkView>();
  static_assert_accessible<ExecSpace, DvView>();
  const char* who = "attention_backward";
  detail::attention_check(who, q, k, v, o, lse);
  const std::size_t nb = q.extent(0), ns = q.extent(1), nh = q.extent(2), nqk = q.extent(3), nv = v.extent(3);
  detail::check_extents<DoView, 4>(who, "d_o", d_o, {nb, ns, nh, nv});
  const bool do_dq = !view_is_empty(dq);
  const bool do_dk = !view_is_empty(dk);
  const bool do_dv = !view_is_empty(dv);
  if (do_dq) detail::check_extents<DqView, 4>(who, "dq", dq, {nb, ns, nh, nqk});
  if (do_dk) detail::check_extents<DkView, 4>(who, "dk", dk, {nb, ns, nh, nqk});
  if (do_dv) detail::check_extents<DvView, 4>(who, "dv", dv, {nb, ns, nh, nv});
  const auto docs = documents.offsets_for<ExecSpace>(static_cast<std::int64_t>(ns), who);
  const std::int64_t rows = static_cast<std::int64_t>(nb * ns * nh);
  if (rows == 0 || !(do_dq || do_dk || do_dv)) return;

  using acc_type = typename QView::non_const_value_type;
  using dq_type = typename DqView::non_const_value_type;
  using dk_type = typename DkView::non_const_value_type;
  using dv_type = typename DvView::non_const_value_type;
  const std::int64_t n_s = static_cast<std::int64_t>(ns);
  const std::int64_t n_h = static_cast<std::int64_t>(nh);
  const int d_qk = static_cast<int>(nqk);
  const int d_v = static_cast<int>(nv);
  const double scale = 1.0 / compat::math::sqrt(static_cast<double>(d_qk));
  using policy_type = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;

  if (do_dq) {
    Kokkos::parallel_for(
        "mlacp::attention_backward_dq", policy_type(space, 0, rows), KOKKOS_LAMBDA(const std::int64_t idx) {
          const std::int64_t hd = idx % n_h;
          const std::int64_t i = (idx / n_h) % n_s;
          const std::int64_t b = idx / (n_h * n_s);
          const double lse_i = static_cast<double>(lse(b, hd, i));
          double d_i = 0.0;  // D_i = dO_i . O_i
          for (int c = 0; c < d_v; ++c)
            d_i += static_cast<double>(d_o(b, i, hd, c)) * static_cast<double>(o(b, i, hd, c));
          for (int c = 0; c < d_qk; ++c) dq(b, i, hd, c) = dq_type(0);
          for (std::int64_t j = docs.start_of(i); j <= i; ++j) {
            acc_type dot = 0;
            for (int c = 0; c < d_qk; ++c) dot += q(b, i, hd, c) * k(b, j, hd, c);
            const double p = compat::math::exp(static_cast<double>(dot) * scale - lse_i);
            acc_type dp = 0;
            for (int c = 0; c < d_v; ++c) dp += d_o(b, i, hd, c) * v(b, j, hd, c);
            const dq_type coef = static_cast<dq_type>(scale * p * (static_cast<double>(dp) - d_i));
            for (int c = 0; c < d_qk; ++c) dq(b, i, hd, c) += coef * static_cast<dq_type>(k(b, j, hd, c));
          }
        });
  }

  if (do_dk || do_dv) {
    Kokkos::parallel_for(
        "mlacp::attention_backward_dkdv", policy_type(space, 0, rows), KOKKOS_LAMBDA(const std::int64_t idx) {
          const std::int64_t hd = idx % n_h;
          const std::int64_t j = (idx / n_h) % n_s;
          const std::int64_t b = idx / (n_h * n_s);
          if (do_dk) {
            for (int c = 0; c < d_qk; ++c) dk(b, j, hd, c) = dk_type(0);
          }
          if (do_dv) {
            for (int c = 0; c < d_v; ++c) dv(b, j, hd, c) = dv_type(0);
          }
          const std::int64_t i_end = docs.end_of(j);
          for (std::int64_t i = j; i < i_end; ++i) {
            acc_type dot = 0;
            for (int c = 0; c < d_qk; ++c) dot += q(b, i, hd, c) * k(b, j, hd, c);
            const double p = compat::math::exp(static_cast<double>(dot) * scale - static_cast<double>(lse(b, hd, i)));
            if (do_dv) {
              const dv_type p_v = static_cast<dv_type>(p);
              for (int c = 0; c < d_v; ++c) dv(b, j, hd, c) += p_v * static_cast<dv_type>(d_o(b, i, hd, c));
            }
            if (do_dk) {
              acc_type dp = 0;
              for (int c = 0; c < d_v; ++c) dp += d_o(b, i, hd, c) * v(b, j, hd, c);
              double d_i = 0.0;  // D_i = dO_i . O_i, recomputed here rather than kept in a temporary
              for (int c = 0; c < d_v; ++c) {
                d_i += static_cast<double>(d_o(b, i, hd, c)) * static_cast<double>(o(b, i, hd, c));
              }
              const dk_type coef = static_cast<dk_type>(scale * p * (static_cast<double>(dp) - d_i));
              for (int c = 0; c < d_qk; ++c) dk(b, j, hd, c) += coef * static_cast<dk_type>(q(b, i, hd, c));
            }
          }
        });
  }
}

/// The forward of a block of ring attention (the block interface at the top of this file), one thread per (b, query,
/// head): the log-sum-exp of the block's visible scores in a first pass over its keys, then o accumulated with the
/// probabilities against the merged log-sum-exp in a second. Simple and portable: the reference of the tests.
template <class ExecSpace, class QView, class KView, class VView, class OView, class LseView>
void attention_forward_block(const ExecSpace& space, const QView& q, const KView& k, const VView& v, const OView& o,
                             const LseView& lse, const TokenSegments& q_rows, const TokenSegments& k_rows,
                             const DocumentLayout& documents, std::int64_t seq, bool first) {
  static_assert_accessible<ExecSpace, QView>();
  static_assert_accessible<ExecSpace, KView>();
  static_assert_accessible<ExecSpace, VView>();
  static_assert_accessible<ExecSpace, OView>();
  static_assert_accessible<ExecSpace, LseView>();
  const char* who = "attention_forward_block";
  detail::block_check(who, q, k, v, o, lse, q_rows, k_rows, seq);
  const auto docs = documents.offsets_for<ExecSpace>(seq, who);
  using acc_type = compat::accumulation_t<typename QView::non_const_value_type>;
  using o_type = typename OView::non_const_value_type;
  using lse_type = typename LseView::non_const_value_type;
  const std::int64_t n_q = q_rows.rows(), n_k = k_rows.rows();
  const std::int64_t n_h = static_cast<std::int64_t>(q.extent(2));
  const int d_qk = static_cast<int>(q.extent(3)), d_v = static_cast<int>(v.extent(3));
  const double scale = 1.0 / compat::math::sqrt(static_cast<double>(d_qk));
  const double neg_inf = -std::numeric_limits<double>::infinity();
  const std::int64_t rows = static_cast<std::int64_t>(q.extent(0)) * n_q * n_h;
  if (rows == 0) return;
  Kokkos::parallel_for(
      "mlacp::attention_forward_block", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t idx) {
        const std::int64_t hd = idx % n_h, i = (idx / n_h) % n_q, b = idx / (n_h * n_q);
        const std::int64_t pos = q_rows.position(i), start = docs.start_of(pos);
        auto score = [&](std::int64_t j) {
          acc_type dot = 0;
          for (int c = 0; c < d_qk; ++c)
            dot += static_cast<acc_type>(q(b, i, hd, c)) * static_cast<acc_type>(k(b, j, hd, c));
          return static_cast<double>(dot) * scale;
        };
        double m = neg_inf, l = 0.0;  // max and sum of exp(score - m) over the block's visible keys
        for (std::int64_t j = 0; j < n_k; ++j) {
          const std::int64_t kp = k_rows.position(j);
          if (kp < start || kp > pos) continue;
          const double sc = score(j);
          if (sc > m) {
            l = l * compat::math::exp(m - sc) + 1.0;
            m = sc;
          } else {
            l += compat::math::exp(sc - m);
          }
        }
        const double lse_old = first ? neg_inf : static_cast<double>(lse(b, hd, i));
        if (l == 0.0) {  // no key visible: no attention, or the earlier result as it is
          if (first) {
            for (int c = 0; c < d_v; ++c) o(b, i, hd, c) = o_type(0);
            lse(b, hd, i) = static_cast<lse_type>(neg_inf);
          }
          return;
        }
        const double lse_block = m + compat::math::log(l);
        double lse_all = lse_block;
        if (lse_old != neg_inf) {
          const double hi = lse_old > lse_block ? lse_old : lse_block;
          lse_all = hi + compat::math::log(compat::math::exp(lse_old - hi) + compat::math::exp(lse_block - hi));
        }
        const double w_old = lse_old == neg_inf ? 0.0 : compat::math::exp(lse_old - lse_all);
        for (int c = 0; c < d_v; ++c) o(b, i, hd, c) = static_cast<o_type>(w_old * static_cast<double>(o(b, i, hd, c)));
        for (std::int64_t j = 0; j < n_k; ++j) {
          const std::int64_t kp = k_rows.position(j);
          if (kp < start || kp > pos) continue;
          const double p = compat::math::exp(score(j) - lse_all);
          for (int c = 0; c < d_v; ++c) o(b, i, hd, c) += static_cast<o_type>(p * static_cast<double>(v(b, j, hd, c)));
        }
        lse(b, hd, i) = static_cast<lse_type>(lse_all);
      });
}

/// The backward of a block of ring attention, one thread per (b, query, head) for dq and per (b, key, head) for dk
/// and dv, accumulated (+=) into them; any may be empty (not needed). D_i = dO_i . O_i is recomputed where needed.
template <class ExecSpace, class QView, class KView, class VView, class OView, class LseView, class DoView,
          class DqView, class DkView, class DvView>
void attention_backward_block(const ExecSpace& space, const QView& q, const KView& k, const VView& v, const OView& o,
                              const LseView& lse, const DoView& d_o, const DqView& dq, const DkView& dk,
                              const DvView& dv, const TokenSegments& q_rows, const TokenSegments& k_rows,
                              const DocumentLayout& documents, std::int64_t seq) {
  static_assert_accessible<ExecSpace, QView>();
  static_assert_accessible<ExecSpace, KView>();
  static_assert_accessible<ExecSpace, VView>();
  static_assert_accessible<ExecSpace, OView>();
  static_assert_accessible<ExecSpace, LseView>();
  static_assert_accessible<ExecSpace, DoView>();
  static_assert_accessible<ExecSpace, DqView>();
  static_assert_accessible<ExecSpace, DkView>();
  static_assert_accessible<ExecSpace, DvView>();
  const char* who = "attention_backward_block";
  detail::block_check(who, q, k, v, o, lse, q_rows, k_rows, seq);
  const bool do_dq = !view_is_empty(dq), do_dk = !view_is_empty(dk), do_dv = !view_is_empty(dv);
  detail::block_gradient_check(who, q, k, v, d_o, dq, dk, dv, do_dq, do_dk, do_dv);
  const auto docs = documents.offsets_for<ExecSpace>(seq, who);
  using acc_type = compat::accumulation_t<typename QView::non_const_value_type>;
  using dq_type = typename DqView::non_const_value_type;
  using dk_type = typename DkView::non_const_value_type;
  using dv_type = typename DvView::non_const_value_type;
  const std::int64_t n_q = q_rows.rows(), n_k = k_rows.rows();
  const std::int64_t n_b = static_cast<std::int64_t>(q.extent(0)), n_h = static_cast<std::int64_t>(q.extent(2));
  const int d_qk = static_cast<int>(q.extent(3)), d_v = static_cast<int>(v.extent(3));
  const double scale = 1.0 / compat::math::sqrt(static_cast<double>(d_qk));
  using policy_type = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  if (n_b * n_h * n_q * n_k == 0) return;
  // dS_ij / scale and P_ij of query row i and key row j of batch b, head hd.
  auto grads = KOKKOS_LAMBDA(std::int64_t b, std::int64_t i, std::int64_t j, std::int64_t hd, double& p, double& ds) {
    acc_type dot = 0, dp = 0;
    for (int c = 0; c < d_qk; ++c) dot += static_cast<acc_type>(q(b, i, hd, c)) * static_cast<acc_type>(k(b, j, hd, c));
    for (int c = 0; c < d_v; ++c) dp += static_cast<acc_type>(d_o(b, i, hd, c)) * static_cast<acc_type>(v(b, j, hd, c));
    double d_i = 0.0;
    for (int c = 0; c < d_v; ++c) d_i += static_cast<double>(d_o(b, i, hd, c)) * static_cast<double>(o(b, i, hd, c));
    p = compat::math::exp(static_cast<double>(dot) * scale - static_cast<double>(lse(b, hd, i)));
    ds = p * (static_cast<double>(dp) - d_i);
  };
  if (do_dq) {
    Kokkos::parallel_for(
        "mlacp::attention_backward_block_dq", policy_type(space, 0, n_b * n_q * n_h),
        KOKKOS_LAMBDA(const std::int64_t idx) {
          const std::int64_t hd = idx % n_h, i = (idx / n_h) % n_q, b = idx / (n_h * n_q);
          const std::int64_t pos = q_rows.position(i), start = docs.start_of(pos);
          for (std::int64_t j = 0; j < n_k; ++j) {
            const std::int64_t kp = k_rows.position(j);
            if (kp < start || kp > pos) continue;
            double p = 0, ds = 0;
            grads(b, i, j, hd, p, ds);
            for (int c = 0; c < d_qk; ++c)
              dq(b, i, hd, c) += static_cast<dq_type>(scale * ds * static_cast<double>(k(b, j, hd, c)));
          }
        });
  }
  if (do_dk || do_dv) {
    Kokkos::parallel_for(
        "mlacp::attention_backward_block_dkdv", policy_type(space, 0, n_b * n_k * n_h),
        KOKKOS_LAMBDA(const std::int64_t idx) {
          const std::int64_t hd = idx % n_h, j = (idx / n_h) % n_k, b = idx / (n_h * n_k);
          const std::int64_t kp = k_rows.position(j), end = docs.end_of(kp);
          for (std::int64_t i = 0; i < n_q; ++i) {
            const std::int64_t pos = q_rows.position(i);
            if (pos < kp || pos >= end) continue;
            double p = 0, ds = 0;
            grads(b, i, j, hd, p, ds);
            if (do_dv)
              for (int c = 0; c < d_v; ++c)
                dv(b, j, hd, c) += static_cast<dv_type>(p * static_cast<double>(d_o(b, i, hd, c)));
            if (do_dk)
              for (int c = 0; c < d_qk; ++c)
                dk(b, j, hd, c) += static_cast<dk_type>(scale * ds * static_cast<double>(q(b, i, hd, c)));
          }
        });
  }
}

/// The default attention core of the MLA layer: attention_forward / attention_backward as members, so that the layer
/// can take the core as a template parameter and users can substitute their own (see the top of this file).
struct CausalAttentionCore {
  template <class ExecSpace, class QView, class KView, class VView, class OView, class LseView>
  void forward(const ExecSpace& space, const QView& q, const KView& k, const VView& v, const OView& o,
               const LseView& lse, const DocumentLayout& documents = DocumentLayout()) const {
    attention_forward(space, q, k, v, o, lse, documents);
  }

  template <class ExecSpace, class QView, class KView, class VView, class OView, class LseView, class DoView,
            class DqView, class DkView, class DvView>
  void backward(const ExecSpace& space, const QView& q, const KView& k, const VView& v, const OView& o,
                const LseView& lse, const DoView& d_o, const DqView& dq, const DkView& dk, const DvView& dv,
                const DocumentLayout& documents = DocumentLayout()) const {
    attention_backward(space, q, k, v, o, lse, d_o, dq, dk, dv, documents);
  }

  /// The block interface (top of this file): attention_forward_block / attention_backward_block.
  template <class ExecSpace, class Q, class K, class V, class OAcc, class LseAcc>
  void forward_block(const ExecSpace& space, const Q& q, const K& k, const V& v, const OAcc& o_acc,
                     const LseAcc& lse_acc, const TokenSegments& q_rows, const TokenSegments& k_rows,
                     const DocumentLayout& documents, std::int64_t seq, bool first) const {
    attention_forward_block(space, q, k, v, o_acc, lse_acc, q_rows, k_rows, documents, seq, first);
  }

  template <class ExecSpace, class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK, class DV>
  void backward_block(const ExecSpace& space, const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
                      const DO& d_o, const DQ& dq_acc, const DK& dk_acc, const DV& dv_acc, const TokenSegments& q_rows,
                      const TokenSegments& k_rows, const DocumentLayout& documents, std::int64_t seq) const {
    attention_backward_block(space, q, k, v, o, lse, d_o, dq_acc, dk_acc, dv_acc, q_rows, k_rows, documents, seq);
  }
};

}  // namespace mlacp
