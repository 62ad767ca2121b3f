// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The identity codec: a collective moves its Views' own values (MlaConfig::wire_dtype same; every double layer).
// Collectives given it launch as they would without a codec: nothing is staged, rounded or widened.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>

namespace mlacp::detail {

struct SameCodec {
  static constexpr const char* name = "same";
  /// Value types it carries, and what travels for them: the values themselves.
  template <class T>
  static constexpr bool carries = true;
  template <class T>
  using wire_t = T;
  /// A reduce-scatter may move it (the transport sums the values as it always does).
  static constexpr bool sums = true;
  /// Element by element (no per-row state): a row of `width` values is `width` values on the wire.
  static constexpr bool row_scaled = false;
  static constexpr std::int64_t wire_width(std::int64_t width) { return width; }
  template <class T>
  KOKKOS_INLINE_FUNCTION static T encode_value(const T& x) {
    return x;
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION static T decode_value(const T& x) {
    return x;
  }
};

}  // namespace mlacp::detail
