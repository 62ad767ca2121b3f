// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// fp8 E4M3 on the wire with one float scale per row (MlaConfig::wire_dtype fp8): a row (the innermost dimension of
// the View, e.g. one head's d values of one token) travels as its `width` E4M3 codes followed by the 4 bytes of its
// scale, width + 4 bytes instead of 4 * width (0.27x float at d = 128, 0.52x bf16). Each row is scaled so that its
// largest magnitude maps onto E4M3's largest finite value, 448: scale = amax / 448 (1 for a row of zeros or one whose
// amax is not finite), code = E4M3(x / scale) rounded to nearest even, saturating; decoded value = code * scale. The
// error is relative to the row's own range: at most 2^-4 of each value's binade, |x| / 16 (3 mantissa bits), down to
// amax * 2^-15 below which E4M3's subnormals and zero take over. docs/wire.md measures it on the layer.
//
// Where it holds (mla/wire_policy.hpp): activations, whose rows are of one scale; the layer uses it on the forward's
// exchanges. A reduce-scatter cannot move it (partial sums cannot be added in a scaled 8-bit format without widening
// on every hop; `sums` false: the collectives refuse it), and a collective that splits or concatenates the innermost
// dimension would cut rows from their scales (refused). The layer's backward exchanges use bf16 (see wire_policy.hpp).
#pragma once

#include <mlacp/float8.hpp>
#include <mlacp/wire/cast.hpp>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mlacp::detail {

struct Fp8E4M3Codec {
  static constexpr const char* name = "fp8_e4m3";
  template <class T>
  static constexpr bool carries = std::is_same_v<T, float>;
  template <class T>
  using wire_t = std::uint8_t;
  static constexpr bool sums = false;
  static constexpr bool row_scaled = true;
  /// A row's bytes on the wire: its codes, then its float scale (little-endian bytes, unaligned).
  static constexpr std::int64_t scale_bytes = 4;
  static constexpr std::int64_t wire_width(std::int64_t width) { return width + scale_bytes; }

  /// The scale of a row whose largest magnitude is `amax`.
  KOKKOS_INLINE_FUNCTION static float scale_of(float amax) {
    return amax > 0.0f && amax <= 3.402823466e+38f ? amax / float8_e4m3::max_finite : 1.0f;
  }

  /// Row `in` [width] into `out` [width + 4] by the threads of `team`.
  template <class Team, class T>
  KOKKOS_INLINE_FUNCTION static void encode_row(const Team& team, const T* in, std::uint8_t* out, std::int64_t width) {
    float amax = 0.0f;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, width),
        [&](const std::int64_t k, float& m) {
          const float x = cast_value<float>(in[k]);
          const float a = x < 0.0f ? -x : x;
          if (a > m) m = a;  // a NaN is not larger: it stays a NaN code, the scale stays finite
        },
        Kokkos::Max<float>(amax));
    const float scale = scale_of(amax);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, width),
                         [&](const std::int64_t k) { out[k] = float8_e4m3(cast_value<float>(in[k]) / scale).bits(); });
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      std::uint32_t bits = 0;
      std::memcpy(&bits, &scale, sizeof bits);
      for (int b = 0; b < 4; ++b) out[width + b] = static_cast<std::uint8_t>(bits >> (8 * b));
    });
  }

  /// Row `in` [width + 4] into `out` [width] by the threads of `team`.
  template <class Team, class T>
  KOKKOS_INLINE_FUNCTION static void decode_row(const Team& team, const std::uint8_t* in, T* out, std::int64_t width) {
    std::uint32_t bits = 0;
    for (int b = 0; b < 4; ++b) bits |= static_cast<std::uint32_t>(in[width + b]) << (8 * b);
    float scale = 0.0f;
    std::memcpy(&scale, &bits, sizeof scale);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, width), [&](const std::int64_t k) {
      out[k] = cast_value<T>(static_cast<float>(float8_e4m3::from_bits(in[k])) * scale);
    });
  }
};

}  // namespace mlacp::detail
