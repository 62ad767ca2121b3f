// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// exp() for the softmax of the attention core: branch-free, so that compilers vectorise the loops over a score tile's
// row (a call to the C library's exp keeps them scalar, and on the host it was the larger part of the core's time),
// and device-callable. Arguments are scaled scores minus a row maximum or log-sum-exp, i.e. at most a rounding error
// above zero.
//
// Method: x = n ln2 + r with n = round(x / ln2) (the rounding by the 1.5 * 2^52 / 1.5 * 2^23 shift, ln2 split into a
// high part exact in n * ln2_hi and a low part), e^r by its Taylor polynomial on |r| <= ln2/2 (degree 12 in double:
// truncation below 2e-16 relative; degree 7 in float: below 6e-9), 2^n from the exponent bits. Accuracy is within a
// few ulp of the C library's exp. Where 2^n would not be a normal number (x below about -708 in double, -87 in float)
// the result is 0: a probability that small is zero next to the row's maximum term, which is 1. Valid for x above
// about -2^51 (double) / -2^22 (float) and below the overflow of exp; infinite x gives NaN.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

namespace mlacp::detail {

/// p(r) = c0 * r^n + c1 * r^(n-1) + ... + cn by Horner's rule, the coefficients from the highest degree down.
template <class Real>
KOKKOS_INLINE_FUNCTION Real horner(Real, Real constant) {
  return constant;
}

template <class Real, class... Lower>
KOKKOS_INLINE_FUNCTION Real horner(Real r, Real highest, Real next, Lower... lower) {
  return horner(r, highest * r + next, lower...);
}

/// What softmax_exp needs of each floating-point type: ln2 split for the reduction, the rounding shift (1.5 * 2^m,
/// m the mantissa bits) and its bits, the exponent bias, and e^r's Taylor polynomial of the type's degree.
template <class Real>
struct SoftmaxExpFormat;

template <>
struct SoftmaxExpFormat<double> {
  using Bits = std::uint64_t;
  using SignedBits = std::int64_t;
  static constexpr double log2e = 1.4426950408889634;
  static constexpr double ln2_hi = 6.93147180369123816490e-01;  // 32 significant bits: n * ln2_hi is exact
  static constexpr double ln2_lo = 1.90821492927058770002e-10;
  static constexpr double shift = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer in the low bits
  static constexpr Bits shift_bits = 0x4338000000000000ULL;
  static constexpr int mantissa_bits = 52;
  static constexpr int exponent_bias = 1023;
  // Degree 12: truncation below 2e-16 relative.
  KOKKOS_INLINE_FUNCTION static double taylor(double r) {
    return horner(r, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0,
                  1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0);
  }
};

template <>
struct SoftmaxExpFormat<float> {
  using Bits = std::uint32_t;
  using SignedBits = std::int32_t;
  static constexpr float log2e = 1.44269504f;
  static constexpr float ln2_hi = 0.693359375f;  // 10 significant bits: n * ln2_hi is exact
  static constexpr float ln2_lo = -2.12194440e-4f;
  static constexpr float shift = 12582912.0f;  // 1.5 * 2^23
  static constexpr Bits shift_bits = 0x4B400000U;
  static constexpr int mantissa_bits = 23;
  static constexpr int exponent_bias = 127;
  // Degree 7: truncation below 6e-9 relative.
  KOKKOS_INLINE_FUNCTION static float taylor(float r) {
    return horner(r, 1.0f / 5040.0f, 1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f);
  }
};

/// The method of the file's head for either type.
template <class Real>
KOKKOS_INLINE_FUNCTION Real softmax_exp_of(Real x) {
  using Format = SoftmaxExpFormat<Real>;
  using Bits = typename Format::Bits;
  const Real t = x * Format::log2e + Format::shift;
  const Real n = t - Format::shift;
  const Real r = (x - n * Format::ln2_hi) - n * Format::ln2_lo;
  const Real p = Format::taylor(r);
  // 2^n from the exponent bits, in integer arithmetic only (a floating-point comparison or select keeps compilers
  // from vectorising the loop): the biased exponent, and a mask that zeroes the result where it is not positive (x
  // below about -708 in double, -87 in float, where e^x is below the smallest normal number).
  Bits bits = 0;
  std::memcpy(&bits, &t, sizeof bits);
  const auto biased = static_cast<typename Format::SignedBits>(bits - Format::shift_bits) + Format::exponent_bias;
  const Bits keep = static_cast<Bits>(0) - static_cast<Bits>(biased > 0);
  bits = (static_cast<Bits>(biased) << Format::mantissa_bits) & keep;
  Real scale = 0;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

KOKKOS_INLINE_FUNCTION double softmax_exp(double x) { return softmax_exp_of(x); }

KOKKOS_INLINE_FUNCTION float softmax_exp(float x) { return softmax_exp_of(x); }

}  // namespace mlacp::detail
