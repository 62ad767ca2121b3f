// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// Tests of the naive host reference forward (src/testing): single token, causality, and agreement with the
// library kernels composed by hand; packed documents (cu_seqlens): agreement with the kernels at per-document
// positions and masking, and with the documents run one by one.
#include "kernels/kernel_test_support.hpp"

#include <gtest/gtest.h>
#include <Kokkos_Core.hpp>
#include <mlacp/mla/kernels/rms_norm.hpp>
#include <mlacp/mla/kernels/rope.hpp>
#include <mlacp/mla/kernels/view_utils.hpp>
#include <mlacp/testing/reference_forward.hpp>

#include <cstdint>
#include <vector>

namespace {

using namespace mlacp::test::kernels;

template <class T>
class ReferenceForward : public ::testing::Test {};
TYPED_TEST_SUITE(ReferenceForward, ValueTypes);

// ---- reference forward ----------------------------------------------------------------------------------------------

template <class T>
mlacp::testing::reference::ReferenceWeights<T> random_weights(const mlacp::testing::reference::ReferenceDims& d,
                                                              std::uint32_t seed, bool biases) {
  using W = mlacp::testing::reference::ReferenceWeights<T>;
  const int dqk = d.dn + d.dr;
  auto host_matrix = [&](const char* name, int rows, int cols, std::uint32_t s) {
    typename W::matrix_type m(std::string(name), rows, cols);
    const Vec values = random_vec(m.size(), s, -0.5, 0.5);
    for (std::size_t i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(values[i]);
    return m;
  };
  auto host_vector = [&](const char* name, int n, std::uint32_t s, double lo, double hi) {
    typename W::vector_type v(std::string(name), n);
    const Vec values = random_vec(v.size(), s, lo, hi);
    for (std::size_t i = 0; i < v.size(); ++i) v.data()[i] = static_cast<T>(values[i]);
    return v;
  };
  W w;
  w.w_q = host_matrix("w_q", d.H * dqk, d.D, seed + 1);
  w.w_kva = host_matrix("w_kva", d.R + d.dr, d.D, seed + 2);
  w.g_kv = host_vector("g_kv", d.R, seed + 3, 0.5, 1.5);
  w.w_kvb = host_matrix("w_kvb", d.H * (d.dn + d.dv), d.R, seed + 4);
  w.w_o = host_matrix("w_o", d.D, d.H * d.dv, seed + 5);
  if (biases) {
    w.b_q = host_vector("b_q", d.H * dqk, seed + 6, -0.5, 0.5);
    w.b_kvb = host_vector("b_kvb", d.H * (d.dn + d.dv), seed + 7, -0.5, 0.5);
    w.b_o = host_vector("b_o", d.D, seed + 8, -0.5, 0.5);
  }
  return w;
}

template <class T>
typename mlacp::testing::reference::ReferenceWeights<T>::tensor3_type host_input(
    const mlacp::testing::reference::ReferenceDims& d, std::uint32_t seed) {
  typename mlacp::testing::reference::ReferenceWeights<T>::tensor3_type x("x", d.B, d.S, d.D);
  const Vec values = random_vec(x.size(), seed);
  for (std::size_t i = 0; i < x.size(); ++i) x.data()[i] = static_cast<T>(values[i]);
  return x;
}

TYPED_TEST(ReferenceForward, ReferenceSingleTokenIsTheValuePath) {
  // One token, one head: the softmax is 1, so y = (RMSNorm(x w_kva^T [:R]) w_kvb_v^T + b_kvb_v) w_o^T + b_o,
  // independent of q and of RoPE.
  using T = TypeParam;
  const mlacp::testing::reference::ReferenceDims d{1, 1, 4, 1, 2, 2, 3, 4};
  const auto w = random_weights<T>(d, 100, true);
  const auto x = host_input<T>(d, 101);
  typename mlacp::testing::reference::ReferenceWeights<T>::tensor3_type y("y", d.B, d.S, d.D);
  mlacp::testing::reference::mla_forward(d, w, x, y);
  Vec c(d.R);
  double ss = 0.0;
  for (int j = 0; j < d.R; ++j) {
    for (int i = 0; i < d.D; ++i) c[j] += double(x(0, 0, i)) * double(w.w_kva(j, i));
    ss += c[j] * c[j];
  }
  for (int j = 0; j < d.R; ++j) c[j] *= double(w.g_kv(j)) / std::sqrt(ss / d.R + 1e-6);
  Vec v(d.dv);
  for (int e = 0; e < d.dv; ++e) {
    v[e] = double(w.b_kvb(d.dn + e));
    for (int j = 0; j < d.R; ++j) v[e] += c[j] * double(w.w_kvb(d.dn + e, j));
  }
  Vec expected(d.D), got(d.D);
  for (int i = 0; i < d.D; ++i) {
    expected[i] = double(w.b_o(i));
    for (int e = 0; e < d.dv; ++e) expected[i] += v[e] * double(w.w_o(i, e));
    got[i] = double(y(0, 0, i));
  }
  EXPECT_LT(rel_error(got, expected), tol<T>());
}

TYPED_TEST(ReferenceForward, ReferenceIsCausal) {
  using T = TypeParam;
  const mlacp::testing::reference::ReferenceDims d{2, 5, 6, 2, 3, 4, 3, 5};
  const auto w = random_weights<T>(d, 200, true);
  const auto x = host_input<T>(d, 201);
  typename mlacp::testing::reference::ReferenceWeights<T>::tensor3_type y0("y0", d.B, d.S, d.D),
      y1("y1", d.B, d.S, d.D);
  mlacp::testing::reference::mla_forward(d, w, x, y0);
  for (int b = 0; b < d.B; ++b) {
    for (int i = 0; i < d.D; ++i) x(b, d.S - 1, i) += T(0.25);
  }
  mlacp::testing::reference::mla_forward(d, w, x, y1);
  for (int b = 0; b < d.B; ++b) {
    double last_change = 0.0;
    for (int i = 0; i < d.D; ++i) {
      for (int t = 0; t < d.S - 1; ++t) EXPECT_EQ(y1(b, t, i), y0(b, t, i)) << "b " << b << " t " << t;
      last_change = std::max(last_change, std::abs(double(y1(b, d.S - 1, i)) - double(y0(b, d.S - 1, i))));
    }
    EXPECT_GT(last_change, 1e-3) << "b " << b;
  }
}

// The spec's forward recomputed from the kernels (RMSNorm, RoPE on q_pe and on the rank-3 payload, attention core),
// with the projections done by plain host loops here: an independent check of the reference's layouts. With
// cu_seqlens, the kernels' RoPE at make_rope_positions and the attention core with the DocumentLayout.
template <class T>
void check_reference_against_kernels(const std::vector<std::int64_t>& cu_seqlens) {
  const mlacp::testing::reference::ReferenceDims d{2, 6, 7, 3, 3, 4, 5, 6};
  const int dqk = d.dn + d.dr, n_tok = d.B * d.S;
  const auto w = random_weights<T>(d, 300, true);
  const auto x = host_input<T>(d, 301);
  typename mlacp::testing::reference::ReferenceWeights<T>::tensor3_type y_ref("y_ref", d.B, d.S, d.D);
  mlacp::testing::reference::mla_forward(d, w, x, y_ref, cu_seqlens);
  const mlacp::DocumentLayout documents =
      cu_seqlens.empty() ? mlacp::DocumentLayout() : mlacp::DocumentLayout(cu_seqlens, d.S);

  auto linear = [&](const Vec& in, int n_in, const auto& wm, const auto& bias, int n_out) {
    Vec out(static_cast<std::size_t>(n_tok) * n_out);
    for (int n = 0; n < n_tok; ++n) {
      for (int o = 0; o < n_out; ++o) {
        double acc = bias.size() ? double(bias(o)) : 0.0;
        for (int i = 0; i < n_in; ++i) acc += in[n * n_in + i] * double(wm(o, i));
        out[n * n_out + o] = double(T(acc));  // rounded to T as a T pipeline would store it
      }
    }
    return out;
  };
  const Vec xv(x.data(), x.data() + x.size());
  const typename mlacp::testing::reference::ReferenceWeights<T>::vector_type no_bias;
  ExecSpace space;
  View4<T> q("q", d.B, d.S, d.H, dqk);
  from_vec(q, linear(xv, d.D, w.w_q, w.b_q, d.H * dqk));
  View3<T> payload("payload", d.B, d.S, d.R + d.dr);
  from_vec(payload, linear(xv, d.D, w.w_kva, no_bias, d.R + d.dr));
  View1<T> g("g", d.R), rstd("rstd", n_tok);
  Kokkos::deep_copy(g, w.g_kv);
  mlacp::rms_norm_forward(space, payload, g, payload, rstd);  // in place
  const auto positions = mlacp::make_rope_positions(space, 0, d.S, documents);
  mlacp::rope_forward(space, q, d.dn, d.dr, positions);
  mlacp::rope_forward(space, mlacp::as_rank4(payload), d.R, d.dr, positions);
  space.fence();
  const Vec pay = to_vec(payload);
  Vec c(static_cast<std::size_t>(n_tok) * d.R);
  for (int n = 0; n < n_tok; ++n) {
    for (int j = 0; j < d.R; ++j) c[n * d.R + j] = pay[n * (d.R + d.dr) + j];
  }
  const Vec kv = linear(c, d.R, w.w_kvb, w.b_kvb, d.H * (d.dn + d.dv));
  Vec kh(static_cast<std::size_t>(n_tok) * d.H * dqk), vh(static_cast<std::size_t>(n_tok) * d.H * d.dv);
  for (int n = 0; n < n_tok; ++n) {
    for (int hd = 0; hd < d.H; ++hd) {
      const double* kvh = &kv[(n * d.H + hd) * (d.dn + d.dv)];
      for (int e = 0; e < d.dn; ++e) kh[(n * d.H + hd) * dqk + e] = kvh[e];
      for (int e = 0; e < d.dr; ++e) kh[(n * d.H + hd) * dqk + d.dn + e] = pay[n * (d.R + d.dr) + d.R + e];
      for (int e = 0; e < d.dv; ++e) vh[(n * d.H + hd) * d.dv + e] = kvh[d.dn + e];
    }
  }
  const AttnShape sh{d.B, d.S, d.H, dqk, d.dv};
  AttnRun<T> run(sh, to_vec(q), kh, vh, documents);
  const Vec y = linear(to_vec(run.o), d.H * d.dv, w.w_o, w.b_o, d.D);
  const Vec yr(y_ref.data(), y_ref.data() + y_ref.size());
  EXPECT_LT(rel_error(y, yr), (std::is_same_v<T, double> ? 1e-12 : 1e-5));
}

TYPED_TEST(ReferenceForward, ReferenceMatchesTheKernelsComposed) { check_reference_against_kernels<TypeParam>({}); }

TYPED_TEST(ReferenceForward, PackedReferenceMatchesTheKernelsComposed) {
  check_reference_against_kernels<TypeParam>({0, 2, 3, 6});
  check_reference_against_kernels<TypeParam>({0, 1, 2, 3, 4, 5, 6});
}

/// Packed documents give exactly what each document gives run alone (positions restart, no attention across).
TYPED_TEST(ReferenceForward, PackedReferenceEqualsDocumentsRunAlone) {
  using T = TypeParam;
  using tensor3 = typename mlacp::testing::reference::ReferenceWeights<T>::tensor3_type;
  const std::vector<std::int64_t> cu = {0, 4, 5, 9};
  const mlacp::testing::reference::ReferenceDims d{2, 9, 6, 2, 3, 4, 3, 5};
  const auto w = random_weights<T>(d, 400, true);
  const auto x = host_input<T>(d, 401);
  tensor3 y("y", d.B, d.S, d.D), plain("plain", d.B, d.S, d.D);
  mlacp::testing::reference::mla_forward(d, w, x, y, cu);
  mlacp::testing::reference::mla_forward(d, w, x, plain);
  for (std::size_t doc = 0; doc + 1 < cu.size(); ++doc) {
    const int t0 = static_cast<int>(cu[doc]), n = static_cast<int>(cu[doc + 1] - cu[doc]);
    auto dd = d;
    dd.S = n;
    tensor3 xd("xd", d.B, n, d.D), yd("yd", d.B, n, d.D);
    for (int b = 0; b < d.B; ++b)
      for (int t = 0; t < n; ++t)
        for (int i = 0; i < d.D; ++i) xd(b, t, i) = x(b, t0 + t, i);
    mlacp::testing::reference::mla_forward(dd, w, xd, yd);
    for (int b = 0; b < d.B; ++b)
      for (int t = 0; t < n; ++t)
        for (int i = 0; i < d.D; ++i) EXPECT_EQ(y(b, t0 + t, i), yd(b, t, i)) << "document " << doc << " t " << t;
  }
  // The first document is a prefix: the same as unpacked; the later ones differ.
  EXPECT_EQ(y(1, 3, 2), plain(1, 3, 2));
  EXPECT_NE(y(1, 7, 2), plain(1, 7, 2));
}

TYPED_TEST(ReferenceForward, ReferenceRejectsInvalidCuSeqlens) {
  using T = TypeParam;
  const mlacp::testing::reference::ReferenceDims d{1, 5, 6, 2, 3, 4, 3, 5};
  const auto w = random_weights<T>(d, 500, false);
  const auto x = host_input<T>(d, 501);
  typename mlacp::testing::reference::ReferenceWeights<T>::tensor3_type y("y", d.B, d.S, d.D);
  auto message = [&](const std::vector<std::int64_t>& cu) {
    return invalid_argument_message([&] { mlacp::testing::reference::mla_forward(d, w, x, y, cu); });
  };
  EXPECT_NE(message({0, 3, 4}).find("expected at least 2 from 0 to S = 5"), std::string::npos);
  EXPECT_NE(message({1, 5}).find("expected at least 2 from 0 to S = 5"), std::string::npos);
  EXPECT_NE(message({0, 3, 3, 5}).find("cu_seqlens[2] = 3 <= cu_seqlens[1] = 3"), std::string::npos);
  EXPECT_EQ(message({0, 3, 5}), "");
}

}  // namespace
