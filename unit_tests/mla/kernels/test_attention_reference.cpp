// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of the reference attention core (CausalAttentionCore, docs/spec.md step 6) against a naive S x S softmax and
// finite differences: the core the tiled one (test_attention_core.cpp) is compared with.
#include "kernel_test_support.hpp"

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

namespace {

using namespace mlacp::test::kernels;

template <class T>
class ReferenceAttention : public ::testing::Test {};
TYPED_TEST_SUITE(ReferenceAttention, ValueTypes);

// ---- attention ------------------------------------------------------------------------------------------------------

/// The first token of i's document in cu_seqlens `cu` (0 when cu is empty), by a linear scan: independent of
/// DocumentLayout's binary search.
int document_start(const std::vector<std::int64_t>& cu, int i) {
  int start = 0;
  for (std::size_t d = 0; d + 1 < cu.size(); ++d)
    if (cu[d] <= i) start = static_cast<int>(cu[d]);
  return start;
}

/// Naive causal softmax attention, materialising each S x S score matrix: o [B, S, h, dv] and lse [B, h, S]. With
/// cu_seqlens `cu`, the scores of keys outside the query's document are masked (j < document start).
void attention_host(const AttnShape& sh, const Vec& q, const Vec& k, const Vec& v, Vec& o, Vec& lse,
                    const std::vector<std::int64_t>& cu = {}) {
  o.assign(sh.v_size(), 0.0);
  lse.assign(static_cast<std::size_t>(sh.n_b) * sh.n_h * sh.n_s, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(sh.d_qk));
  for (int b = 0; b < sh.n_b; ++b) {
    for (int hd = 0; hd < sh.n_h; ++hd) {
      std::vector<Vec> scores(sh.n_s, Vec(sh.n_s, 0.0));
      for (int i = 0; i < sh.n_s; ++i) {
        for (int j = 0; j < sh.n_s; ++j) {
          for (int c = 0; c < sh.d_qk; ++c) {
            scores[i][j] += q[sh.at(b, i, hd, c, sh.d_qk)] * k[sh.at(b, j, hd, c, sh.d_qk)] * scale;
          }
        }
      }
      for (int i = 0; i < sh.n_s; ++i) {
        const int j0 = document_start(cu, i);
        double mx = -HUGE_VAL;
        for (int j = j0; j <= i; ++j) mx = std::max(mx, scores[i][j]);
        double sum = 0.0;
        for (int j = j0; j <= i; ++j) sum += std::exp(scores[i][j] - mx);
        lse[(static_cast<std::size_t>(b) * sh.n_h + hd) * sh.n_s + i] = mx + std::log(sum);
        for (int j = j0; j <= i; ++j) {
          const double p = std::exp(scores[i][j] - mx) / sum;
          for (int c = 0; c < sh.d_v; ++c) o[sh.at(b, i, hd, c, sh.d_v)] += p * v[sh.at(b, j, hd, c, sh.d_v)];
        }
      }
    }
  }
}

TYPED_TEST(ReferenceAttention, AttentionForwardMatchesNaiveSoftmax) {
  using T = TypeParam;
  // Magnitude 40 with integer entries: scores of thousands (exp overflows double without the running max), computed
  // exactly in float too.
  for (const double magnitude : {1.0, 6.0, 40.0}) {
    const bool integers = magnitude > 10.0;
    auto input = [&](std::size_t n, std::uint32_t seed) {
      Vec values = random_vec(n, seed, -magnitude, magnitude);
      if (integers) {
        for (auto& x : values) x = std::round(x);
      }
      return rounded<T>(values);
    };
    const AttnShape sh{2, 13, 3, 5, 3};
    const Vec q0 = input(sh.qk_size(), 11);
    const Vec k0 = input(sh.qk_size(), 12);
    const Vec v0 = rounded<T>(random_vec(sh.v_size(), 13));
    AttnRun<T> run(sh, q0, k0, v0);
    Vec o_ref, lse_ref;
    attention_host(sh, q0, k0, v0, o_ref, lse_ref);
    EXPECT_LT(rel_error(to_vec(run.o), o_ref), tol<T>()) << "magnitude " << magnitude;
    EXPECT_LT(rel_error(to_vec(run.lse), lse_ref), tol<T>()) << "magnitude " << magnitude;
  }
}

struct AttnGrads {
  Vec dq, dk, dv;
};

template <class U>
AttnGrads attention_grads(const AttnShape& sh, const Vec& q0, const Vec& k0, const Vec& v0, const Vec& do0,
                          bool want_dq = true, bool want_dk = true, bool want_dv = true,
                          const mlacp::DocumentLayout& documents = mlacp::DocumentLayout()) {
  AttnRun<U> run(sh, q0, k0, v0, documents);
  View4<U> d_o("d_o", sh.n_b, sh.n_s, sh.n_h, sh.d_v);
  from_vec(d_o, do0);
  View4<U> dq, dk, dv;
  if (want_dq) dq = View4<U>("dq", sh.n_b, sh.n_s, sh.n_h, sh.d_qk);
  if (want_dk) dk = View4<U>("dk", sh.n_b, sh.n_s, sh.n_h, sh.d_qk);
  if (want_dv) dv = View4<U>("dv", sh.n_b, sh.n_s, sh.n_h, sh.d_v);
  // garbage first: the gradients are overwritten, not accumulated
  for (auto* g : {&dq, &dk, &dv}) {
    if (g->size() != 0) Kokkos::deep_copy(*g, U(42));
  }
  ExecSpace space;
  mlacp::CausalAttentionCore{}.backward(
      space, mlacp::attention_problem(run.q, run.k, run.v, run.o, run.lse, d_o, dq, dk, dv, documents));
  space.fence();
  return {want_dq ? to_vec(dq) : Vec(), want_dk ? to_vec(dk) : Vec(), want_dv ? to_vec(dv) : Vec()};
}

TYPED_TEST(ReferenceAttention, AttentionBackwardMatchesFiniteDifferences) {
  using T = TypeParam;
  const AttnShape sh{2, 7, 2, 5, 3};
  const Vec q0 = rounded<T>(random_vec(sh.qk_size(), 21, -2.0, 2.0));
  const Vec k0 = rounded<T>(random_vec(sh.qk_size(), 22, -2.0, 2.0));
  const Vec v0 = rounded<T>(random_vec(sh.v_size(), 23));
  const Vec do0 = rounded<T>(random_vec(sh.v_size(), 24));
  auto loss = [&](const Vec& q, const Vec& k, const Vec& v) {
    AttnRun<double> run(sh, q, k, v);
    return dot(to_vec(run.o), do0);
  };
  const Vec fd_q = finite_difference(q0, [&](const Vec& q) { return loss(q, k0, v0); });
  const Vec fd_k = finite_difference(k0, [&](const Vec& k) { return loss(q0, k, v0); });
  const Vec fd_v = finite_difference(v0, [&](const Vec& v) { return loss(q0, k0, v); });
  const AttnGrads in_double = attention_grads<double>(sh, q0, k0, v0, do0);
  EXPECT_LT(rel_error(in_double.dq, fd_q), 1e-6);
  EXPECT_LT(rel_error(in_double.dk, fd_k), 1e-6);
  EXPECT_LT(rel_error(in_double.dv, fd_v), 1e-6);
  const AttnGrads in_t = attention_grads<T>(sh, q0, k0, v0, do0);
  EXPECT_LT(rel_error(in_t.dq, in_double.dq), tol<T>());
  EXPECT_LT(rel_error(in_t.dk, in_double.dk), tol<T>());
  EXPECT_LT(rel_error(in_t.dv, in_double.dv), tol<T>());
}

/// Packed documents: the core against the naive softmax masked per document (documents of length 1, at the start and
/// the end, and longer ones; the one-document layout is plain causal attention).
TYPED_TEST(ReferenceAttention, PackedForwardMatchesPerDocumentMaskedSoftmax) {
  using T = TypeParam;
  const AttnShape sh{2, 13, 3, 5, 3};
  const Vec q0 = rounded<T>(random_vec(sh.qk_size(), 31, -3.0, 3.0));
  const Vec k0 = rounded<T>(random_vec(sh.qk_size(), 32, -3.0, 3.0));
  const Vec v0 = rounded<T>(random_vec(sh.v_size(), 33));
  const std::vector<std::vector<std::int64_t>> packings = {{0, 13},          {0, 1, 13},       {0, 12, 13},
                                                           {0, 1, 2, 3, 13}, {0, 4, 5, 9, 13}, {0, 6, 13}};
  for (const auto& cu : packings) {
    AttnRun<T> run(sh, q0, k0, v0, mlacp::DocumentLayout(cu, sh.n_s));
    Vec o_ref, lse_ref;
    attention_host(sh, q0, k0, v0, o_ref, lse_ref, cu);
    EXPECT_LT(rel_error(to_vec(run.o), o_ref), tol<T>()) << "cu_seqlens[1] = " << cu[1];
    EXPECT_LT(rel_error(to_vec(run.lse), lse_ref), tol<T>()) << "cu_seqlens[1] = " << cu[1];
  }
  // Masking is visible: the packed result differs from the unpacked one.
  AttnRun<T> packed(sh, q0, k0, v0, mlacp::DocumentLayout({0, 6, 13}, sh.n_s));
  AttnRun<T> plain(sh, q0, k0, v0);
  EXPECT_GT(rel_error(to_vec(packed.o), to_vec(plain.o)), 1e-3);
}

/// Packed documents' gradients against finite differences of the packed forward.
TYPED_TEST(ReferenceAttention, PackedBackwardMatchesFiniteDifferences) {
  using T = TypeParam;
  const AttnShape sh{2, 7, 2, 5, 3};
  const mlacp::DocumentLayout documents({0, 1, 4, 7}, sh.n_s);
  const Vec q0 = rounded<T>(random_vec(sh.qk_size(), 41, -2.0, 2.0));
  const Vec k0 = rounded<T>(random_vec(sh.qk_size(), 42, -2.0, 2.0));
  const Vec v0 = rounded<T>(random_vec(sh.v_size(), 43));
  const Vec do0 = rounded<T>(random_vec(sh.v_size(), 44));
  auto loss = [&](const Vec& q, const Vec& k, const Vec& v) {
    AttnRun<double> run(sh, q, k, v, documents);
    return dot(to_vec(run.o), do0);
  };
  const Vec fd_q = finite_difference(q0, [&](const Vec& q) { return loss(q, k0, v0); });
  const Vec fd_k = finite_difference(k0, [&](const Vec& k) { return loss(q0, k, v0); });
  const Vec fd_v = finite_difference(v0, [&](const Vec& v) { return loss(q0, k0, v); });
  const AttnGrads in_double = attention_grads<double>(sh, q0, k0, v0, do0, true, true, true, documents);
  EXPECT_LT(rel_error(in_double.dq, fd_q), 1e-6);
  EXPECT_LT(rel_error(in_double.dk, fd_k), 1e-6);
  EXPECT_LT(rel_error(in_double.dv, fd_v), 1e-6);
  const AttnGrads in_t = attention_grads<T>(sh, q0, k0, v0, do0, true, true, true, documents);
  EXPECT_LT(rel_error(in_t.dq, in_double.dq), tol<T>());
  EXPECT_LT(rel_error(in_t.dk, in_double.dk), tol<T>());
  EXPECT_LT(rel_error(in_t.dv, in_double.dv), tol<T>());
}

TYPED_TEST(ReferenceAttention, AttentionBackwardSkipsEmptyGradients) {
  using T = TypeParam;
  const AttnShape sh{1, 6, 2, 4, 5};
  const Vec q0 = rounded<T>(random_vec(sh.qk_size(), 31));
  const Vec k0 = rounded<T>(random_vec(sh.qk_size(), 32));
  const Vec v0 = rounded<T>(random_vec(sh.v_size(), 33));
  const Vec do0 = rounded<T>(random_vec(sh.v_size(), 34));
  const AttnGrads all = attention_grads<T>(sh, q0, k0, v0, do0);
  const AttnGrads no_q = attention_grads<T>(sh, q0, k0, v0, do0, false, true, true);
  EXPECT_EQ(no_q.dk, all.dk);
  EXPECT_EQ(no_q.dv, all.dv);
  const AttnGrads only_dv = attention_grads<T>(sh, q0, k0, v0, do0, false, false, true);
  EXPECT_EQ(only_dv.dv, all.dv);
  const AttnGrads only_dk = attention_grads<T>(sh, q0, k0, v0, do0, false, true, false);
  EXPECT_EQ(only_dk.dk, all.dk);
  const AttnGrads only_dq = attention_grads<T>(sh, q0, k0, v0, do0, true, false, false);
  EXPECT_EQ(only_dq.dq, all.dq);
  const AttnGrads none = attention_grads<T>(sh, q0, k0, v0, do0, false, false, false);
  EXPECT_TRUE(none.dq.empty() && none.dk.empty() && none.dv.empty());
}

TYPED_TEST(ReferenceAttention, AttentionRejectsMismatchedShapes) {
  using T = TypeParam;
  ExecSpace space;
  View4<T> q("q", 1, 4, 2, 3), k("k", 1, 4, 2, 3), v("v", 1, 4, 2, 5), o("o", 1, 4, 2, 4);
  View3<T> lse("lse", 1, 2, 4);
  const std::string msg = invalid_argument_message([&] { mlacp::attention_forward(space, q, k, v, o, lse); });
  EXPECT_NE(msg.find("o is [1, 4, 2, 4], expected [1, 4, 2, 5]"), std::string::npos) << msg;
}

}  // namespace
