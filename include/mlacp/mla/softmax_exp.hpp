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

KOKKOS_INLINE_FUNCTION double softmax_exp(double x) {
  constexpr double log2e = 1.4426950408889634;
  constexpr double ln2_hi = 6.93147180369123816490e-01;  // 32 significant bits: n * ln2_hi is exact
  constexpr double ln2_lo = 1.90821492927058770002e-10;
  constexpr double shift = 6755399441055744.0;  // 1.5 * 2^52: adding it rounds to an integer in the low bits
  constexpr std::uint64_t shift_bits = 0x4338000000000000ULL;
  const double t = x * log2e + shift;
  const double n = t - shift;
  const double r = (x - n * ln2_hi) - n * ln2_lo;
  double p = 1.0 / 479001600.0;  // 1/12!
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^n from the exponent bits, in integer arithmetic only (a floating-point comparison or select keeps compilers
  // from vectorising the loop): the biased exponent n + 1023, and a mask that zeroes the result where it is not
  // positive (x below about -708, where e^x is below the smallest normal double).
  std::uint64_t bits = 0;
  std::memcpy(&bits, &t, sizeof bits);
  const auto biased = static_cast<std::int64_t>(bits - shift_bits) + 1023;
  const std::uint64_t keep = static_cast<std::uint64_t>(0) - static_cast<std::uint64_t>(biased > 0);
  bits = (static_cast<std::uint64_t>(biased) << 52) & keep;
  double scale = 0;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

KOKKOS_INLINE_FUNCTION float softmax_exp(float x) {
  constexpr float log2e = 1.44269504f;
  constexpr float ln2_hi = 0.693359375f;  // 10 significant bits: n * ln2_hi is exact
  constexpr float ln2_lo = -2.12194440e-4f;
  constexpr float shift = 12582912.0f;  // 1.5 * 2^23
  constexpr std::uint32_t shift_bits = 0x4B400000U;
  const float t = x * log2e + shift;
  const float n = t - shift;
  const float r = (x - n * ln2_hi) - n * ln2_lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &t, sizeof bits);
  const auto biased = static_cast<std::int32_t>(bits - shift_bits) + 127;
  const std::uint32_t keep = static_cast<std::uint32_t>(0) - static_cast<std::uint32_t>(biased > 0);
  bits = (static_cast<std::uint32_t>(biased) << 23) & keep;
  float scale = 0;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace mlacp::detail
