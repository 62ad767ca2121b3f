// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// RoPE's frequencies, docs/spec.md step 4: the plain base, and YaRN's scaling (Hugging Face's `rope_scaling` of type
// `yarn`, as DeepSeek-V2 and V3 configure it). One value says both; the RoPE tables (rope.hpp) and the references
// read it, and the configuration (MlaConfig's rope_* rows) produces it through rope_frequencies(config).
//
//   plain:  inv_freq[j] = base^(-2j/dr), j in [0, dr/2)
//   YaRN (factor f > 1, original length L0, beta_fast bf, beta_slow bs):
//     corr(r) = dr * ln(L0 / (2*pi*r)) / (2*ln(base)),  lo = max(floor(corr(bf)), 0),  hi = min(ceil(corr(bs)), dr-1)
//     (hi += 0.001 when lo == hi),  ramp[j] = clamp((j - lo) / (hi - lo), 0, 1),
//     inv_freq[j] = inv_freq[j] / f * ramp[j] + inv_freq[j] * (1 - ramp[j])
//   cos and sin are multiplied by the attention factor (Hugging Face's; 1 for plain RoPE and for DeepSeek's configs).
//
// With f == 1 nothing of YaRN is computed: the plain frequencies, bit for bit.
#pragma once

#include <mlacp/mla/mla_config.hpp>

#include <algorithm>
#include <cmath>

namespace mlacp {

/// What RoPE's angles and amplitudes depend on besides the position and the rotated width.
struct RopeFrequencies {
  double base = 10000.0;             ///< RoPE's base (Hugging Face's rope_theta)
  double factor = 1.0;               ///< YaRN's scaling factor f; 1 is plain RoPE
  double original_max_position = 0;  ///< YaRN's L0 (original_max_position_embeddings); read only when f > 1
  double beta_fast = 32.0;           ///< YaRN's beta_fast; read only when f > 1
  double beta_slow = 1.0;            ///< YaRN's beta_slow; read only when f > 1
  double attention_factor = 1.0;     ///< multiplies cos and sin (yarn_attention_factor)

  RopeFrequencies() = default;
  /// Plain RoPE of this base (so that a base converts where frequencies are expected).
  RopeFrequencies(double plain_base) : base(plain_base) {}  // NOLINT(google-explicit-constructor)

  bool yarn() const { return factor != 1.0; }
  bool operator==(const RopeFrequencies& o) const {
    return base == o.base && factor == o.factor && original_max_position == o.original_max_position &&
           beta_fast == o.beta_fast && beta_slow == o.beta_slow && attention_factor == o.attention_factor;
  }
  bool operator!=(const RopeFrequencies& o) const { return !(*this == o); }
};

/// YaRN's ramp over the frequency index j for a rotated width `width`: [lo, hi] of docs/spec.md step 4.
struct YarnRamp {
  double lo = 0, hi = 1;
};

/// The ramp's bounds of `f` (meaningful when f.yarn()).
inline YarnRamp yarn_ramp(const RopeFrequencies& f, int width) {
  const double pi = 3.14159265358979323846;
  const auto corr = [&](double rotations) {
    return width * std::log(f.original_max_position / (2 * pi * rotations)) / (2 * std::log(f.base));
  };
  YarnRamp ramp;
  ramp.lo = std::max(std::floor(corr(f.beta_fast)), 0.0);
  ramp.hi = std::min(std::ceil(corr(f.beta_slow)), static_cast<double>(width - 1));
  if (ramp.lo == ramp.hi) ramp.hi += 0.001;
  return ramp;
}

/// YaRN's magnitude g(m) = 0.1 * m * ln(f) + 1 (1 when f <= 1).
inline double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

/// The factor on cos and sin: `given` when positive (rope_scaling.attention_factor), else g(mscale) / g(mscale_all_dim)
/// when both are non-zero, else g(1) (Hugging Face's rule).
inline double yarn_attention_factor(double factor, double mscale, double mscale_all_dim, double given) {
  if (given > 0) return given;
  if (mscale != 0 && mscale_all_dim != 0) return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
  return yarn_mscale(factor, 1.0);
}

/// The softmax scale of a YaRN layer: g(mscale_all_dim)^2 / sqrt(dqk) with a non-zero mscale_all_dim, else
/// 1/sqrt(dqk) (what a Hugging Face config's layer uses; MlaConfig::softmax_scale carries it).
inline double yarn_softmax_scale(double factor, double mscale_all_dim, int qk_dim) {
  const double g = mscale_all_dim != 0 ? yarn_mscale(factor, mscale_all_dim) : 1.0;
  return g * g / std::sqrt(static_cast<double>(qk_dim));
}

/// The frequencies a configuration's layer rotates with (its rope_base and rope_* YaRN rows).
inline RopeFrequencies rope_frequencies(const MlaConfig& c) {
  RopeFrequencies f(c.rope_base);
  if (c.rope_factor == 1.0) return f;
  f.factor = c.rope_factor;
  f.original_max_position = c.rope_original_max_position;
  f.beta_fast = c.rope_beta_fast;
  f.beta_slow = c.rope_beta_slow;
  f.attention_factor =
      yarn_attention_factor(c.rope_factor, c.rope_mscale, c.rope_mscale_all_dim, c.rope_attention_factor);
  return f;
}

}  // namespace mlacp
