// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// bfloat16 as mlacp stores, moves and converts it: really two bytes everywhere. The value type is mlacp::bf16 (include
// <mlacp/compat.hpp>), an alias chosen in the compat layer: Kokkos::Experimental::bhalf_t where Kokkos makes it a
// native 2-byte type (CUDA, HIP, SYCL builds of Kokkos 4.x), and mlacp's own mlacp::bfloat16 elsewhere (host builds,
// where Kokkos' bhalf_t is a plain 4-byte float, and Kokkos 3.4, which has no bhalf_t).
//
// mlacp::bfloat16: the upper half of an IEEE binary32. From float (and from double and int, rounded once, not through
// float): round to nearest, ties to even; a NaN stays a NaN (quiet, sign kept; its payload's top bits kept where they
// are nonzero); +-Inf and +-0 stay what they are; a finite value that rounds past the largest bf16 becomes Inf (as
// IEEE rounding does). To float: exact. Arithmetic happens in float: the type converts implicitly both ways, so
// `float acc = 0; acc += a * b;` is float arithmetic, and a compound assignment on a bf16 rounds once, at the store.
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mlacp {

class bfloat16 {
 public:
  bfloat16() = default;
  KOKKOS_INLINE_FUNCTION bfloat16(float f) : bits_(round_to_bits(f)) {}   // NOLINT: implicit, like float's own types
  KOKKOS_INLINE_FUNCTION bfloat16(double d) : bits_(round_to_bits(d)) {}  // NOLINT
  KOKKOS_INLINE_FUNCTION bfloat16(int i) : bits_(round_to_bits(static_cast<double>(i))) {}  // NOLINT: exact
  KOKKOS_INLINE_FUNCTION operator float() const { return widen(bits_); }                    // NOLINT: exact

  /// The stored bits (sign, 8 exponent bits, 7 mantissa bits) and the value with given bits.
  KOKKOS_INLINE_FUNCTION std::uint16_t bits() const { return bits_; }
  KOKKOS_INLINE_FUNCTION static bfloat16 from_bits(std::uint16_t b) {
    bfloat16 v;
    v.bits_ = b;
    return v;
  }

  KOKKOS_INLINE_FUNCTION bfloat16& operator+=(float rhs) { return *this = bfloat16(float(*this) + rhs); }
  KOKKOS_INLINE_FUNCTION bfloat16& operator-=(float rhs) { return *this = bfloat16(float(*this) - rhs); }
  KOKKOS_INLINE_FUNCTION bfloat16& operator*=(float rhs) { return *this = bfloat16(float(*this) * rhs); }
  KOKKOS_INLINE_FUNCTION bfloat16& operator/=(float rhs) { return *this = bfloat16(float(*this) / rhs); }

  /// Round to nearest, ties to even; NaN kept quiet.
  KOKKOS_INLINE_FUNCTION static std::uint16_t round_to_bits(float f) {
    std::uint32_t u = 0;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)  // NaN: quiet it, keep sign and top payload
      return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
    const std::uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;  // carries into the exponent where it must (up to Inf)
    return static_cast<std::uint16_t>(u >> 16);
  }
  /// From double, rounded once: through float, except where rounding to float moved the value onto a bf16 tie (the
  /// low half 0x8000) it was not on; then the tie is broken the way the double lies (float keeps 16 more bits than
  /// bf16 everywhere, subnormals included, so a tie is the only place where rounding twice can differ).
  KOKKOS_INLINE_FUNCTION static std::uint16_t round_to_bits(double d) {
    const float f = static_cast<float>(d);
    std::uint32_t u = 0;
    std::memcpy(&u, &f, sizeof u);
    const bool finite = (u & 0x7f800000u) != 0x7f800000u;
    if (finite && (u & 0xffffu) == 0x8000u && static_cast<double>(f) != d) {
      const bool above = d > 0 ? d > static_cast<double>(f) : d < static_cast<double>(f);  // in magnitude
      return static_cast<std::uint16_t>((u >> 16) + (above ? 1u : 0u));  // sign-magnitude: +1 is away from zero
    }
    return round_to_bits(f);
  }
  KOKKOS_INLINE_FUNCTION static float widen(std::uint16_t b) {
    const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
    float f = 0;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }

 private:
  std::uint16_t bits_;
};

static_assert(sizeof(bfloat16) == 2, "mlacp::bfloat16 is two bytes");
static_assert(std::is_trivially_copyable_v<bfloat16>, "mlacp::bfloat16 is moved as bytes");

}  // namespace mlacp
