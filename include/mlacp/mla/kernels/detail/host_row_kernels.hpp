// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The per-row work of the attention core's BLAS path (host execution spaces only), compiled for each x86-64 vector
// instruction set the library knows and chosen once at run time from what the CPU has (src/host_row_kernels.cpp): a
// library built for the generic x86-64 target, as distributions build it, still runs the softmax, the probabilities
// and dS of a score tile 8 (AVX2) or 16 (AVX-512) floats at a time. Measured before: at the generic target these loops
// stayed scalar and took as long as the tile GEMMs themselves (issue 36).
//
// Each variant is flash_attention_rows.hpp's function compiled for that instruction set: the same operations in the
// same order, except that the AVX2 and AVX-512 copies contract a*b+c into fused multiply-adds where the compiler does
// (the exp polynomial's Horner steps; measured: without them the forward's rows cost 15% more at dqk = dv = 32). So a
// result may differ from the baseline copy's in its last bits, never by more than rounding
// (unit_tests/mla/kernels/test_host_row_kernels.cpp bounds it), and ranks on different CPUs need not agree on the
// choice: the row kernels' results are each rank's own, inside the tolerances of docs/spec.md.
#pragma once

#include <cstdint>
#include <string>

namespace mlacp {
class bfloat16;
}

namespace mlacp::detail {

/// The instruction sets the row kernels are compiled for, narrowest first.
enum class HostIsa { baseline, avx2, avx512 };

/// "baseline", "avx2" (AVX2 + FMA) or "avx512" (AVX-512 F, VL, DQ, BW).
const char* host_isa_name(HostIsa isa);

/// Whether this CPU runs `isa` (baseline: always; on other architectures than x86-64, only baseline).
bool host_isa_supported(HostIsa isa);

/// The widest instruction set this CPU runs: the one host_row_kernels<T>() uses.
HostIsa host_isa_best();

/// The row operations of flash_attention_rows.hpp for T = float or double, as function pointers of one instruction set.
template <class T>
struct HostRowKernels {
  /// online_softmax_row: the forward's online-softmax update of one score row; returns the accumulator's factor.
  double (*online_softmax)(T* s, std::int64_t nk, std::int64_t first, std::int64_t last, double scale, bool start,
                           double& m, double& l);
  /// probabilities_row: the backward's P = exp(scale * s - lse) of one row, zero outside [first, last].
  void (*probabilities)(T* p, std::int64_t nk, std::int64_t first, std::int64_t last, double scale, double lse);
  /// score_grad_row: dS = scale * P o (dP - D) of one row, dP in ds on entry.
  void (*score_grad)(T* ds, const T* p, std::int64_t nk, double scale, double d);
  /// round_bf16_row: dst = src rounded to bf16 (mlacp::bfloat16's rounding, bit for bit), n values.
  void (*round_bf16)(const T* src, bfloat16* dst, std::int64_t n);
};

/// The kernels compiled for `isa` (which the CPU must run: host_isa_supported; InvalidArgument otherwise). Defined
/// for float and double.
template <class T>
const HostRowKernels<T>& host_row_kernels(HostIsa isa);
template <>
const HostRowKernels<float>& host_row_kernels<float>(HostIsa isa);
template <>
const HostRowKernels<double>& host_row_kernels<double>(HostIsa isa);

/// The kernels of host_isa_best(), chosen on the first call.
template <class T>
const HostRowKernels<T>& host_row_kernels() {
  static const HostRowKernels<T>& best = host_row_kernels<T>(host_isa_best());
  return best;
}

}  // namespace mlacp::detail
