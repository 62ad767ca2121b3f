// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Test support (not installed). A REFERENCE implementation of the MLA forward pass (docs/spec.md steps 1-7) on the full
// sequence in one process (P = 1), for tests and the check tool. It is deliberately naive and host-only: plain loops
// over host Views, double accumulation, an O(S^2) softmax that materialises every score row, no Kokkos kernels. It is
// NOT a fast path and shares no code with the library's kernels, so that it can check them.
#pragma once

#include <Kokkos_Core.hpp>
#include <mlacp/compat.hpp>
#include <mlacp/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace mlacp::testing::reference {

/// The dimensions of docs/spec.md (see its table of names); P = 1, so S is the whole sequence.
struct ReferenceDims {
  int B = 0;                 ///< batch
  int S = 0;                 ///< sequence length
  int D = 0;                 ///< hidden size
  int H = 0;                 ///< query heads
  int dn = 0;                ///< qk_nope_head_dim
  int dr = 0;                ///< qk_rope_head_dim (even)
  int dv = 0;                ///< v_head_dim
  int R = 0;                 ///< kv_lora_rank
  int Rq = 0;                ///< q_lora_rank (0: dense w_q)
  double softmax_scale = 0;  ///< 0: 1/sqrt(dqk)
  /// RoPE's base and YaRN's rows as the configuration gives them (MlaConfig's rope_base and rope_*), applied by this
  /// reference's own loop of docs/spec.md step 4 (no library code).
  struct Rope {
    double base = 10000.0;
    double factor = 1.0;  ///< 1: plain RoPE
    int original_max_position = 0;
    double beta_fast = 32.0, beta_slow = 1.0;
    double mscale = 0, mscale_all_dim = 0, attention_factor = 0;  ///< 0: absent
  } rope{};
};

/// The MLA weights in docs/spec.md's shapes, as host Views (nn.Linear form, W is [out, in]). The biases b_q, b_kvb and
/// b_o may be empty Views (no bias).
template <class T>
struct ReferenceWeights {
  using vector_type = Kokkos::View<T*, Kokkos::LayoutRight, Kokkos::HostSpace>;
  using matrix_type = Kokkos::View<T**, Kokkos::LayoutRight, Kokkos::HostSpace>;
  using tensor3_type = Kokkos::View<T***, Kokkos::LayoutRight, Kokkos::HostSpace>;

  matrix_type w_q;    ///< [H*dqk, D] (Rq == 0)
  matrix_type w_qa;   ///< [Rq, D] (Rq > 0)
  vector_type g_q;    ///< [Rq] (Rq > 0)
  matrix_type w_qb;   ///< [H*dqk, Rq] (Rq > 0)
  vector_type b_q;    ///< [H*dqk] or empty
  matrix_type w_kva;  ///< [R + dr, D]
  vector_type g_kv;   ///< [R]
  matrix_type w_kvb;  ///< [H*(dn+dv), R]
  vector_type b_kvb;  ///< [H*(dn+dv)] or empty
  matrix_type w_o;    ///< [D, H*dv]
  vector_type b_o;    ///< [D] or empty
};

namespace detail {

inline void require(bool ok, const std::string& what) {
  if (!ok) throw mlacp::InvalidArgument("mlacp::testing::reference::mla_forward: " + what);
}

template <class V>
void require_extents(const char* name, const V& v, std::size_t e0, std::size_t e1 = 0, std::size_t e2 = 0) {
  const std::size_t expected[3] = {e0, e1, e2};
  for (std::size_t i = 0; i < static_cast<std::size_t>(compat::view_rank_v<V>); ++i) {
    require(v.extent(i) == expected[i], std::string(name) + ".extent(" + std::to_string(i) + ") = " +
                                            std::to_string(v.extent(i)) + ", expected " + std::to_string(expected[i]));
  }
}

template <class V>
void require_optional(const char* name, const V& v, std::size_t e0) {
  if (v.size() != 0) require_extents(name, v, e0);
}

/// out[n][o] = sum_i in[n][i] * w(o, i) + (b empty ? 0 : b(o)), for n in [0, rows).
template <class W, class Bias>
std::vector<double> linear(const std::vector<double>& in, std::size_t rows, std::size_t n_in, const W& w,
                           const Bias& b) {
  const std::size_t n_out = w.extent(0);
  std::vector<double> out(rows * n_out);
  for (std::size_t n = 0; n < rows; ++n) {
    for (std::size_t o = 0; o < n_out; ++o) {
      double acc = b.size() != 0 ? static_cast<double>(b(o)) : 0.0;
      for (std::size_t i = 0; i < n_in; ++i) acc += in[n * n_in + i] * static_cast<double>(w(o, i));
      out[n * n_out + o] = acc;
    }
  }
  return out;
}

/// docs/spec.md step 4's frequencies inv_freq[j], j in [0, dr/2), and the factor on cos and sin, written out from the
/// spec's formulas: plain RoPE of the base, or YaRN's ramp between the interpolated and extrapolated frequencies.
struct RopeAngles {
  std::vector<double> inv_freq;
  double amplitude = 1.0;
};

inline RopeAngles rope_angles(const ReferenceDims::Rope& r, int dr) {
  RopeAngles out;
  const int half = dr / 2;
  for (int j = 0; j < half; ++j) out.inv_freq.push_back(std::pow(r.base, -2.0 * j / dr));
  if (r.factor == 1.0) return out;
  const double pi = std::acos(-1.0);
  const double corr_fast = dr * std::log(r.original_max_position / (2 * pi * r.beta_fast)) / (2 * std::log(r.base));
  const double corr_slow = dr * std::log(r.original_max_position / (2 * pi * r.beta_slow)) / (2 * std::log(r.base));
  const double lo = std::max(std::floor(corr_fast), 0.0);
  double hi = std::min(std::ceil(corr_slow), dr - 1.0);
  if (lo == hi) hi += 0.001;
  for (int j = 0; j < half; ++j) {
    const double ramp = std::min(std::max((j - lo) / (hi - lo), 0.0), 1.0);
    out.inv_freq[j] = out.inv_freq[j] / r.factor * ramp + out.inv_freq[j] * (1 - ramp);
  }
  const auto g = [&](double m) { return r.factor <= 1 ? 1.0 : 0.1 * m * std::log(r.factor) + 1.0; };
  if (r.attention_factor > 0)
    out.amplitude = r.attention_factor;
  else if (r.mscale != 0 && r.mscale_all_dim != 0)
    out.amplitude = g(r.mscale) / g(r.mscale_all_dim);
  else
    out.amplitude = g(1.0);
  return out;
}

/// In-place rotate-half RoPE of v[0, dr) at position p with the angles `a`, docs/spec.md step 4.
inline void rope(double* v, int dr, double p, const RopeAngles& a) {
  const int half = dr / 2;
  for (int j = 0; j < half; ++j) {
    const double c = a.amplitude * std::cos(p * a.inv_freq[j]), s = a.amplitude * std::sin(p * a.inv_freq[j]);
    const double x1 = v[j], x2 = v[j + half];
    v[j] = x1 * c - x2 * s;
    v[j + half] = x2 * c + x1 * s;
  }
}

/// The first token of each token's document under cu_seqlens (all 0 when cu_seqlens is empty: one document), checked
/// here with the reference's own loop (no library code): c[0] = 0, strictly increasing, c[n] = S.
inline std::vector<int> document_starts(const std::vector<std::int64_t>& cu, int S) {
  std::vector<int> start(static_cast<std::size_t>(S), 0);
  if (cu.empty()) return start;
  require(cu.size() >= 2 && cu.front() == 0 && cu.back() == S,
          "cu_seqlens has " + std::to_string(cu.size()) + " entries from " + std::to_string(cu.front()) + " to " +
              std::to_string(cu.back()) + ", expected at least 2 from 0 to S = " + std::to_string(S));
  for (std::size_t d = 0; d + 1 < cu.size(); ++d) {
    require(cu[d] < cu[d + 1], "cu_seqlens[" + std::to_string(d + 1) + "] = " + std::to_string(cu[d + 1]) +
                                   " <= cu_seqlens[" + std::to_string(d) + "] = " + std::to_string(cu[d]) +
                                   ", expected strictly increasing offsets");
    for (std::int64_t t = cu[d]; t < cu[d + 1]; ++t) start[static_cast<std::size_t>(t)] = static_cast<int>(cu[d]);
  }
  return start;
}

}  // namespace detail

/// y = MLA(x) per docs/spec.md steps 1-7 on the full sequence: x, y `[B, S, D]` host Views. Throws
/// mlacp::InvalidArgument when a shape disagrees with dims. With `cu_seqlens` (packed documents: c[0] = 0 < c[1] < ...
/// < c[n] = S, the same for every batch row), step 4's positions restart at 0 at each document's start and step 6's
/// attention is causal within each document (query i sees keys [start of i's document, i]); empty: one document.
template <class T>
void mla_forward(const ReferenceDims& dims, const ReferenceWeights<T>& w,
                 const typename ReferenceWeights<T>::tensor3_type& x,
                 const typename ReferenceWeights<T>::tensor3_type& y,
                 const std::vector<std::int64_t>& cu_seqlens = {}) {
  using detail::require;
  using detail::require_extents;
  const int B = dims.B, S = dims.S, D = dims.D, H = dims.H, dn = dims.dn, dr = dims.dr, dv = dims.dv, R = dims.R;
  require(B >= 0 && S >= 0 && D > 0 && H > 0 && dn >= 0 && dv > 0 && R > 0, "a dimension is not positive");
  require(dr > 0 && dr % 2 == 0, "dr = " + std::to_string(dr) + ", expected an even number > 0");
  const int dqk = dn + dr;
  const int Rq = dims.Rq;
  require(Rq >= 0 && dims.softmax_scale >= 0, "Rq and softmax_scale must not be negative");
  if (Rq == 0) {
    require_extents("w_q", w.w_q, H * dqk, D);
  } else {
    require_extents("w_qa", w.w_qa, Rq, D);
    require_extents("g_q", w.g_q, Rq);
    require_extents("w_qb", w.w_qb, H * dqk, Rq);
  }
  detail::require_optional("b_q", w.b_q, H * dqk);
  require_extents("w_kva", w.w_kva, R + dr, D);
  require_extents("g_kv", w.g_kv, R);
  require_extents("w_kvb", w.w_kvb, H * (dn + dv), R);
  detail::require_optional("b_kvb", w.b_kvb, H * (dn + dv));
  require_extents("w_o", w.w_o, D, H * dv);
  detail::require_optional("b_o", w.b_o, D);
  require_extents("x", x, B, S, D);
  require_extents("y", y, B, S, D);
  const typename ReferenceWeights<T>::vector_type no_bias;
  const std::vector<int> doc_start = detail::document_starts(cu_seqlens, S);

  const std::size_t n_tok = static_cast<std::size_t>(S);
  for (int b = 0; b < B; ++b) {
    std::vector<double> xb(n_tok * D);
    for (int t = 0; t < S; ++t) {
      for (int i = 0; i < D; ++i) xb[t * D + i] = static_cast<double>(x(b, t, i));
    }
    // 1-2. projections
    std::vector<double> q;  // [S, H*dqk]
    if (Rq == 0) {
      q = detail::linear(xb, n_tok, D, w.w_q, w.b_q);
    } else {
      // q-LoRA: cq = RMSNorm(x w_qa^T) * g_q, q = cq w_qb^T + b_q
      std::vector<double> cq = detail::linear(xb, n_tok, D, w.w_qa, no_bias);  // [S, Rq]
      for (int t = 0; t < S; ++t) {
        double ss = 0.0;
        for (int j = 0; j < Rq; ++j) ss += cq[t * Rq + j] * cq[t * Rq + j];
        const double rstd = 1.0 / std::sqrt(ss / Rq + 1e-6);
        for (int j = 0; j < Rq; ++j) cq[t * Rq + j] *= rstd * static_cast<double>(w.g_q(j));
      }
      q = detail::linear(cq, n_tok, Rq, w.w_qb, w.b_q);
    }
    std::vector<double> a = detail::linear(xb, n_tok, D, w.w_kva, no_bias);  // [S, R+dr]
    // 3. RMSNorm of the latent c = a[:, :R]
    std::vector<double> c(n_tok * R);
    for (int t = 0; t < S; ++t) {
      double ss = 0.0;
      for (int j = 0; j < R; ++j) ss += a[t * (R + dr) + j] * a[t * (R + dr) + j];
      const double rstd = 1.0 / std::sqrt(ss / R + 1e-6);
      for (int j = 0; j < R; ++j) c[t * R + j] = a[t * (R + dr) + j] * rstd * static_cast<double>(w.g_kv(j));
    }
    // 4. RoPE of q_pe (per head) and of the shared k_pe = a[:, R:], at position t (within its document)
    const detail::RopeAngles angles = detail::rope_angles(dims.rope, dr);
    for (int t = 0; t < S; ++t) {
      const int position = t - doc_start[t];
      for (int hd = 0; hd < H; ++hd) detail::rope(&q[t * H * dqk + hd * dqk + dn], dr, position, angles);
      detail::rope(&a[t * (R + dr) + R], dr, position, angles);
    }
    // 5. per-head keys and values
    std::vector<double> kv = detail::linear(c, n_tok, R, w.w_kvb, w.b_kvb);  // [S, H*(dn+dv)]
    // 6. causal attention per head (within each document), naive softmax
    std::vector<double> o(n_tok * H * dv, 0.0);
    const double scale = dims.softmax_scale > 0 ? dims.softmax_scale : 1.0 / std::sqrt(static_cast<double>(dqk));
    std::vector<double> scores(n_tok);
    for (int hd = 0; hd < H; ++hd) {
      for (int i = 0; i < S; ++i) {
        const double* qi = &q[i * H * dqk + hd * dqk];
        double max_score = -HUGE_VAL;
        const int j0 = doc_start[i];
        for (int j = j0; j <= i; ++j) {
          const double* kvj = &kv[j * H * (dn + dv) + hd * (dn + dv)];
          const double* kpe = &a[j * (R + dr) + R];
          double dot = 0.0;
          for (int e = 0; e < dn; ++e) dot += qi[e] * kvj[e];
          for (int e = 0; e < dr; ++e) dot += qi[dn + e] * kpe[e];
          scores[j] = dot * scale;
          max_score = std::max(max_score, scores[j]);
        }
        double sum = 0.0;
        for (int j = j0; j <= i; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          sum += scores[j];
        }
        double* oi = &o[i * H * dv + hd * dv];
        for (int j = j0; j <= i; ++j) {
          const double* vj = &kv[j * H * (dn + dv) + hd * (dn + dv) + dn];
          for (int e = 0; e < dv; ++e) oi[e] += scores[j] / sum * vj[e];
        }
      }
    }
    // 7. output projection
    std::vector<double> yb = detail::linear(o, n_tok, static_cast<std::size_t>(H) * dv, w.w_o, w.b_o);  // [S, D]
    for (int t = 0; t < S; ++t) {
      for (int i = 0; i < D; ++i) y(b, t, i) = static_cast<T>(yb[t * D + i]);
    }
  }
}

}  // namespace mlacp::testing::reference
