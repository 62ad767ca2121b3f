// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// fp8 E4M3 as the OCP 8-bit floating point specification defines it (the "FN" variant that CUDA's __nv_fp8_e4m3,
// PyTorch's float8_e4m3fn and DeepSeek-V3's fp8 weights use): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits;
// no infinities; S.1111.111 is NaN; the largest finite value is 448 (S.1111.110), the smallest normal 2^-6 and the
// smallest subnormal 2^-9. One byte everywhere, on the host and in device code alike.
//
// From float: round to nearest, ties to even; a finite value beyond +-448 and +-Inf saturate to +-448 (what CUDA's
// __NV_SATFINITE conversion does, and what a scaled wire wants: its scale maps each row's largest magnitude onto 448);
// a NaN stays a NaN (sign kept); -0 stays -0. To float: exact. This is the value type of a future fp8 wire codec
// (issue 33), which scales each row before the rounding; it is not an arithmetic type (no operators).
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

namespace mlacp {

class float8_e4m3 {
 public:
  float8_e4m3() = default;
  KOKKOS_INLINE_FUNCTION explicit float8_e4m3(float f) : bits_(round_to_bits(f)) {}
  KOKKOS_INLINE_FUNCTION explicit operator float() const { return widen(bits_); }

  /// The stored bits and the value with given bits.
  KOKKOS_INLINE_FUNCTION std::uint8_t bits() const { return bits_; }
  KOKKOS_INLINE_FUNCTION static float8_e4m3 from_bits(std::uint8_t b) {
    float8_e4m3 v;
    v.bits_ = b;
    return v;
  }

  /// The largest finite magnitude, 448: a per-row scale maps the row's largest magnitude onto it.
  static constexpr float max_finite = 448.0f;

  /// Round to nearest, ties to even; saturating beyond +-448 (and +-Inf); NaN kept (as S.1111.111).
  KOKKOS_INLINE_FUNCTION static std::uint8_t round_to_bits(float f) {
    std::uint32_t u = 0;
    std::memcpy(&u, &f, sizeof u);
    const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<std::uint8_t>(sign | 0x7fu);   // NaN
    if (a >= 0x43e00000u) return static_cast<std::uint8_t>(sign | 0x7eu);  // >= 448 (Inf included): saturate
    if (a < 0x3c800000u) {
      // Below the smallest normal 2^-6: a multiple m of 2^-9, m in [0, 8] (m = 8 is the smallest normal, whose code
      // is 8 too). |f| * 512 is exact (a power of two, no overflow) and below 8: round it to an integer, ties to even.
      float scaled = 0.0f;
      std::memcpy(&scaled, &a, sizeof scaled);
      scaled *= 512.0f;
      auto m = static_cast<std::uint32_t>(scaled);  // truncation: scaled >= 0
      const float rest = scaled - static_cast<float>(m);
      if (rest > 0.5f || (rest == 0.5f && (m & 1u) != 0)) ++m;
      return static_cast<std::uint8_t>(sign | m);
    }
    // A normal result: keep 3 of float's 23 mantissa bits, ties to even (the carry may step into the exponent, at
    // most up to 448: everything that would round past it was saturated above), and rebias the exponent (127 -> 7).
    const std::uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;  // exponent (8 bits) and 3 mantissa bits
    return static_cast<std::uint8_t>(sign | (r - ((127u - 7u) << 3)));
  }

  /// Exact: every E4M3 value is a float.
  KOKKOS_INLINE_FUNCTION static float widen(std::uint8_t b) {
    const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
    const std::uint32_t e = (b >> 3) & 0xfu, m = b & 0x7u;
    std::uint32_t u = 0;
    if (e == 0xfu && m == 0x7u) {
      u = sign | 0x7fc00000u;  // NaN
    } else if (e == 0) {
      float v = static_cast<float>(m) * 0.001953125f;  // m * 2^-9, exact
      std::memcpy(&u, &v, sizeof u);
      u |= sign;
    } else {
      u = sign | ((e + 127u - 7u) << 23) | (m << 20);
    }
    float f = 0.0f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }

 private:
  std::uint8_t bits_ = 0;
};

static_assert(sizeof(float8_e4m3) == 1, "mlacp::float8_e4m3 is one byte");

}  // namespace mlacp
