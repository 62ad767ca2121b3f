// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// bf16 on the wire for float Views (MlaConfig::wire_dtype bf16 and bf16_all): each value rounded to nearest even into
// bf16 before the launch, widened exactly into float after the wait; half the bytes of float. A reduce-scatter may
// move it: its partial sums travel as bf16 and are summed in float (the pairwise algorithm and NCCL; MPI's own cannot
// sum bf16, which the layer refuses before launching).
#pragma once

#include <mlacp/wire/cast.hpp>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

namespace mlacp::detail {

struct Bf16Codec {
  static constexpr const char* name = "bf16";
  template <class T>
  static constexpr bool carries = std::is_same_v<T, float>;
  template <class T>
  using wire_t = bf16;
  static constexpr bool sums = true;
  static constexpr bool row_scaled = false;
  static constexpr std::int64_t wire_width(std::int64_t width) { return width; }
  template <class T>
  KOKKOS_INLINE_FUNCTION static bf16 encode_value(const T& x) {
    return cast_value<bf16>(x);
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION static T decode_value(const bf16& x) {
    return cast_value<T>(x);
  }
};

}  // namespace mlacp::detail
