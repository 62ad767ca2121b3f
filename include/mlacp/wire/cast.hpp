// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The one conversion between the value types mlacp computes and moves: float, double and bf16 (round-to-nearest-even
// into bf16; exact out of it), as one value in device code (cast_value) and as a kernel over the contiguous spans of
// two Views (cast_span). The wire codecs, the bf16 GEMM's staging, the ring's chunks and the layer's mixed-precision
// copies all convert through it, so that every rounding in the library is the same rounding.
#pragma once

#include <mlacp/compat.hpp>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

namespace mlacp::detail {

/// `x` converted to D: the same type is copied; into bf16 rounds to nearest even (through float); out of bf16 is exact
/// (Kokkos' native bhalf_t, and mlacp::bf16 on CUDA, convert to float only explicitly); between float and double as
/// C++ does. (A function of its own: nvcc refuses a device lambda whose captures are first used inside an
/// `if constexpr`.)
template <class D, class S>
KOKKOS_INLINE_FUNCTION D cast_value(const S& x) {
  if constexpr (std::is_same_v<D, S>)
    return x;
  else if constexpr (std::is_same_v<D, bf16>)
    return compat::to_bf16(static_cast<float>(x));
  else if constexpr (std::is_same_v<S, bf16>)
    return static_cast<D>(compat::to_float(x));
  else
    return static_cast<D>(x);
}

/// dst[i] = cast_value(src[i]) over the contiguous spans of two Views (or pointers) of `n` values, on `space`.
template <class ExecSpace, class S, class D>
void cast_span(const ExecSpace& space, const char* label, const S* src, D* dst, std::int64_t n) {
  if (n <= 0) return;
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(space, 0, n),
      KOKKOS_LAMBDA(const std::int64_t i) { dst[i] = cast_value<D>(src[i]); });
}

/// dst = src converted, element by element over their contiguous spans (two Views of the same size), on `space`.
template <class ExecSpace, class Src, class Dst>
void cast_span(const ExecSpace& space, const char* label, const Src& src, const Dst& dst) {
  cast_span(space, label, src.data(), dst.data(), static_cast<std::int64_t>(src.size()));
}

}  // namespace mlacp::detail
