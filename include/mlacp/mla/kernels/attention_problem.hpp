// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The attention core's contract (docs/spec.md step 6): one problem struct, one capabilities description, two calls.
//
// The problem (AttentionProblem, in the spirit of FlashAttention's params struct) says everything a call computes:
//   q [B, nq, h, dqk], k [B, nk, h, dqk], v [B, nk, h, dv]   the queries and keys;
//   o [B, nq, h, dv], lse [B, h, nq]                          the output and its row log-sum-exp;
//   d_o [B, nq, h, dv], dq [B, nq, h, dqk], dk [B, nk, h, dqk], dv [B, nk, h, dv]   the backward's (dq, dk, dv: each
//                                                              may be an empty View, "not needed");
//   q_rows, k_rows                                             the global token positions of the rows of q and of k, v
//                                                              (token_segments.hpp: at most two ascending segments);
//   documents()                                                the packed documents of the global sequence
//                                                              (document_layout.hpp; empty: one document);
//   seq                                                        the length of the global sequence;
//   first                                                      overwrite (true) or merge / accumulate (false).
// A key is visible to a query when key position <= query position and both lie in the same document; the scores are
// scale * q_i.k_j with scale = 1/sqrt(dqk), P_ij = exp(score_ij - lse_i), o_i = sum_j P_ij v_j, lse_i = log sum_j
// exp(score_ij) over the visible keys j.
//
// The square problem (attention_problem(q, k, v, o, lse[, documents])) is q_rows = k_rows = [0, S), seq = S, first:
// plain (or packed) causal attention over the whole sequence. A positioned problem (.positioned(q_rows, k_rows, seq,
// first)) is one block of ring attention: the queries of one chunk against the keys of another.
//
// forward(space, problem) reads q, k, v and writes o and lse. first: both are overwritten with this problem's attention
// (a query that sees no key: o 0, lse -inf); else they hold an earlier partial result over other keys (o normalised,
// lse its log-sum-exp, -inf: none) and are merged with this one by log-sum-exp (a query that sees no key keeps it).
// o is in q's value type or its accumulation type (compat::accumulation_t: float for bf16), lse in the accumulation
// type; merging needs o in the accumulation type.
// backward(space, problem) reads q, k, v, o, lse (the final forward of the queries over every key) and d_o, and
// writes the gradients that are needed: first: overwritten with this problem's contribution, else accumulated (+=)
// into them (in the accumulation type).
// Both run asynchronously on the given execution-space instance.
//
// A user core implements this one interface:
//   struct MyCore {
//     static constexpr mlacp::AttentionCoreCapabilities capabilities = ...;   // optional (defaults below)
//     template <class ExecSpace, class Problem> void forward(const ExecSpace&, const Problem&) const;
//     template <class ExecSpace, class Problem> void backward(const ExecSpace&, const Problem&) const;
//   };
// and says what it can in its capabilities (AttentionCoreCapabilities):
//   blocks            it computes positioned problems and first = false (ring attention needs them); without it, it
//                     is only given square problems with first = true;
//   documents         it honours documents(); without it, the MLA layer refuses packed documents (and its problems
//                     hold one document);
//   reports_bf16      it has `template <class ExecSpace> bool computes_bf16() const`: whether it computes on bf16
//                     Views itself on ExecSpace; without it (or when it says false) a bf16 layer gives it float copies;
//   resolves_settings it has `template <class ExecSpace> std::string resolve()` (reads and checks its own settings
//                     now: "" or the error) and `std::vector<std::pair<std::string, std::int64_t>> settings() const`
//                     (what it resolved, by name): the MLA layer calls resolve() once in its constructor and agrees the
//                     settings across its ranks, so that a bad or differing setting is one error on every rank;
//   reports_blocks    it has `template <class ExecSpace> bool computes_blocks() const`: false where its blocks refuse
//                     to run (with blocks and without this, it computes them everywhere).
// A core without a `capabilities` member gets the defaults: all false (square problems, one document, float copies
// for bf16, no settings). Before issue 32 a core took positional arguments (forward(space, q, k, v, o, lse[,
// documents]), forward_block(...)) and the library detected each optional part by its signature: such a core now
// takes the problem instead (the arguments are its fields) and states its capabilities.
//
// The library's cores: FlashAttentionCore (flash_attention.hpp: every capability) and the reference
// CausalAttentionCore (attention_core.hpp: blocks and documents). unit_tests/mla/kernels/test_user_core.cpp holds a
// plain-loop user core run by the MLA layer.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/mla/document_layout.hpp>
#include <mlacp/mla/kernels/token_segments.hpp>
#include <mlacp/mla/kernels/view_utils.hpp>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace mlacp {

/// What an attention core can do beyond square problems in float and double (the top of this file).
struct AttentionCoreCapabilities {
  bool blocks = false;             ///< positioned problems and first = false (ring attention)
  bool documents = false;          ///< packed documents
  bool reports_bf16 = false;       ///< has computes_bf16<ExecSpace>()
  bool resolves_settings = false;  ///< has resolve<ExecSpace>() and settings()
  bool reports_blocks = false;     ///< has computes_blocks<ExecSpace>()
};

/// One call of an attention core (the top of this file). Q .. DV are Kokkos Views; a forward problem's gradient Views
/// are empty. The documents are referred to, not copied: the layout must outlive the call.
template <class Q, class K, class V, class O, class Lse, class DO = O, class DQ = O, class DK = O, class DV = O>
struct AttentionProblem {
  Q q;
  K k;
  V v;
  O o;
  Lse lse;
  DO d_o;
  DQ dq;
  DK dk;
  DV dv;
  TokenSegments q_rows, k_rows;
  const DocumentLayout* layout = nullptr;  ///< null: one document
  std::int64_t seq = 0;
  bool first = true;

  /// The packed documents of the global sequence (empty: one document).
  const DocumentLayout& documents() const {
    static const DocumentLayout one_document;
    return layout != nullptr ? *layout : one_document;
  }
  bool needs_dq() const { return !view_is_empty(dq); }
  bool needs_dk() const { return !view_is_empty(dk); }
  bool needs_dv() const { return !view_is_empty(dv); }
  /// Whether the queries and the keys are both the whole range [0, n) (the square problem).
  bool square() const {
    if (q_rows.segments() == 0 && k_rows.segments() == 0) return true;
    return q_rows.segments() == 1 && k_rows.segments() == 1 && q_rows.begin(0) == 0 && k_rows.begin(0) == 0 &&
           q_rows.count(0) == k_rows.count(0);
  }

  /// This problem as a block of ring attention: the rows of q at the global positions q_rows, those of k and v at
  /// k_rows, in a sequence of `seq_` tokens; first_: overwrite (true) or merge / accumulate (false).
  AttentionProblem positioned(const TokenSegments& q_rows_, const TokenSegments& k_rows_, std::int64_t seq_,
                              bool first_) const {
    AttentionProblem p = *this;
    p.q_rows = q_rows_;
    p.k_rows = k_rows_;
    p.seq = seq_;
    p.first = first_;
    return p;
  }
  /// This problem with the backward's Views: d_o the output's gradient, dq, dk, dv the gradients to compute (each may
  /// be empty: not needed).
  template <class DO2, class DQ2, class DK2, class DV2>
  AttentionProblem<Q, K, V, O, Lse, DO2, DQ2, DK2, DV2> with_gradients(const DO2& d_o_, const DQ2& dq_, const DK2& dk_,
                                                                       const DV2& dv_) const {
    AttentionProblem<Q, K, V, O, Lse, DO2, DQ2, DK2, DV2> p;
    p.q = q;
    p.k = k;
    p.v = v;
    p.o = o;
    p.lse = lse;
    p.d_o = d_o_;
    p.dq = dq_;
    p.dk = dk_;
    p.dv = dv_;
    p.q_rows = q_rows;
    p.k_rows = k_rows;
    p.layout = layout;
    p.seq = seq;
    p.first = first;
    return p;
  }
};

/// The square forward problem: every query of q [B, S, h, dqk] against the keys of k, v at the same positions,
/// overwriting o and lse; `documents` (null or omitted: one document) must outlive the call.
template <class Q, class K, class V, class O, class Lse>
AttentionProblem<Q, K, V, O, Lse> attention_problem(const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
                                                    const DocumentLayout* documents = nullptr) {
  const auto n = static_cast<std::int64_t>(q.extent(1));
  AttentionProblem<Q, K, V, O, Lse> p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.o = o;
  p.lse = lse;
  p.q_rows = TokenSegments::contiguous(0, n);
  p.k_rows = TokenSegments::contiguous(0, static_cast<std::int64_t>(k.extent(1)));
  p.layout = documents;
  p.seq = n;
  return p;
}
template <class Q, class K, class V, class O, class Lse>
AttentionProblem<Q, K, V, O, Lse> attention_problem(const Q& q, const K& k, const V& v, const O& o, const Lse& lse,
                                                    const DocumentLayout& documents) {
  return attention_problem(q, k, v, o, lse, &documents);
}
/// The square backward problem (overwriting dq, dk, dv).
template <class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK, class DV>
AttentionProblem<Q, K, V, O, Lse, DO, DQ, DK, DV> attention_problem(const Q& q, const K& k, const V& v, const O& o,
                                                                    const Lse& lse, const DO& d_o, const DQ& dq,
                                                                    const DK& dk, const DV& dv,
                                                                    const DocumentLayout* documents = nullptr) {
  return attention_problem(q, k, v, o, lse, documents).with_gradients(d_o, dq, dk, dv);
}
template <class Q, class K, class V, class O, class Lse, class DO, class DQ, class DK, class DV>
AttentionProblem<Q, K, V, O, Lse, DO, DQ, DK, DV> attention_problem(const Q& q, const K& k, const V& v, const O& o,
                                                                    const Lse& lse, const DO& d_o, const DQ& dq,
                                                                    const DK& dk, const DV& dv,
                                                                    const DocumentLayout& documents) {
  return attention_problem(q, k, v, o, lse, d_o, dq, dk, dv, &documents);
}

/// The forward problem of the query rows [first, first + count) of q [B, S, h, dqk] against the keys of their causal
/// prefix [0, first + count) of k, v, overwriting those rows of o [B, S, h, dv] and lse [B, h, S]: a positioned
/// problem on subviews (the rows that one Ulysses rank owns, computed on their own so that they can leave before the
/// rest; MlaAttention's flat forward). Its attention equals that of the same rows in the square problem.
template <class Q, class K, class V, class O, class Lse>
auto attention_rows_problem(const Q& q, const K& k, const V& v, const O& o, const Lse& lse, std::int64_t first,
                            std::int64_t count, const DocumentLayout* documents = nullptr) {
  const auto rows = std::make_pair(first, first + count), prefix = std::make_pair(std::int64_t(0), first + count);
  const auto all = Kokkos::ALL();
  return attention_problem(Kokkos::subview(q, all, rows, all, all), Kokkos::subview(k, all, prefix, all, all),
                           Kokkos::subview(v, all, prefix, all, all), Kokkos::subview(o, all, rows, all, all),
                           Kokkos::subview(lse, all, all, rows), documents)
      .positioned(TokenSegments::contiguous(first, count), TokenSegments::contiguous(0, first + count),
                  static_cast<std::int64_t>(q.extent(1)), true);
}

namespace detail {

template <class Core, class = void>
struct declared_capabilities {
  static constexpr AttentionCoreCapabilities value{};
};
template <class Core>
struct declared_capabilities<Core, std::void_t<decltype(Core::capabilities)>> {
  static constexpr AttentionCoreCapabilities value = Core::capabilities;
};

}  // namespace detail

/// Core's capabilities: its `capabilities` member, else the defaults (all false).
template <class Core>
inline constexpr AttentionCoreCapabilities core_capabilities_v =
    detail::declared_capabilities<std::remove_cv_t<Core>>::value;

namespace detail {

/// Whether `core` computes positioned blocks on ExecSpace: its capabilities' blocks, and its computes_blocks() where
/// it reports them.
template <class Core, class ExecSpace>
bool core_computes_blocks(const Core& core) {
  constexpr auto caps = core_capabilities_v<Core>;
  if constexpr (!caps.blocks) {
    (void)core;
    return false;
  } else if constexpr (caps.reports_blocks) {
    return core.template computes_blocks<ExecSpace>();
  } else {
    (void)core;
    return true;
  }
}

/// Whether `core` computes on bf16 Views itself on ExecSpace (reports_bf16 and its computes_bf16() says so).
template <class Core, class ExecSpace>
bool core_computes_bf16(const Core& core) {
  if constexpr (core_capabilities_v<Core>.reports_bf16) {
    return core.template computes_bf16<ExecSpace>();
  } else {
    (void)core;
    return false;
  }
}

}  // namespace detail
}  // namespace mlacp
