// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The row kernels of the attention core's BLAS path, one copy per x86-64 instruction set (host_row_kernels.hpp says
// why). Each copy is a wrapper whose `target` attribute names the set and whose `flatten` attribute inlines the
// generic row function of flash_attention_rows.hpp into it, so that the compiler vectorises that function's loops for
// the set. The file is compiled with -O3 (GCC's -O2 vectorises only loops it needs no epilogue for;
// src/CMakeLists.txt); the copies with FMA contract a*b+c as the compiler's default allows (host_row_kernels.hpp).
#include <mlacp/error.hpp>
#include <mlacp/mla/kernels/detail/flash_attention_rows.hpp>
#include <mlacp/mla/kernels/detail/host_row_kernels.hpp>

#include <string>

// Variants where the compiler takes x86 target attributes for host code: GCC and Clang on x86-64, not nvcc or hipcc
// (whose host passes gain nothing here: on those builds the device runs the team path).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && !defined(__HIPCC__)
#define MLACP_HOST_ISA_VARIANTS 1
#else
#define MLACP_HOST_ISA_VARIANTS 0
#endif

namespace mlacp::detail {
namespace {

#define MLACP_HOST_ROW_KERNELS(isa, attributes)                                                                      \
  template <class T>                                                                                                 \
  attributes double online_softmax_##isa(T* s, std::int64_t nk, std::int64_t first, std::int64_t last, double scale, \
                                         bool start, double& m, double& l) {                                         \
    return online_softmax_row(s, nk, first, last, scale, start, m, l);                                               \
  }                                                                                                                  \
  template <class T>                                                                                                 \
  attributes void probabilities_##isa(T* p, std::int64_t nk, std::int64_t first, std::int64_t last, double scale,    \
                                      double lse) {                                                                  \
    probabilities_row(p, nk, first, last, scale, lse);                                                               \
  }                                                                                                                  \
  template <class T>                                                                                                 \
  attributes void score_grad_##isa(T* ds, const T* p, std::int64_t nk, double scale, double d) {                     \
    score_grad_row(ds, p, nk, scale, d);                                                                             \
  }                                                                                                                  \
  template <class T>                                                                                                 \
  attributes void round_bf16_##isa(const T* src, bfloat16* dst, std::int64_t n) {                                    \
    round_bf16_row(src, dst, n);                                                                                     \
  }                                                                                                                  \
  template <class T>                                                                                                 \
  const HostRowKernels<T> kernels_##isa = {&online_softmax_##isa<T>, &probabilities_##isa<T>, &score_grad_##isa<T>,  \
                                           &round_bf16_##isa<T>};

#if MLACP_HOST_ISA_VARIANTS
MLACP_HOST_ROW_KERNELS(baseline, __attribute__((flatten)))
MLACP_HOST_ROW_KERNELS(avx2, __attribute__((flatten, target("avx2,fma"))))
MLACP_HOST_ROW_KERNELS(avx512, __attribute__((flatten, target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma"))))
#else
MLACP_HOST_ROW_KERNELS(baseline, )
#endif

#undef MLACP_HOST_ROW_KERNELS

template <class T>
const HostRowKernels<T>& kernels_for(HostIsa isa) {
  if (!host_isa_supported(isa))
    throw InvalidArgument(std::string("mlacp::detail::host_row_kernels: instruction set ") + host_isa_name(isa) +
                          " requested; expected one this CPU runs (at most " + host_isa_name(host_isa_best()) + ")");
#if MLACP_HOST_ISA_VARIANTS
  switch (isa) {
    case HostIsa::avx512:
      return kernels_avx512<T>;
    case HostIsa::avx2:
      return kernels_avx2<T>;
    case HostIsa::baseline:
      break;
  }
#endif
  return kernels_baseline<T>;
}

}  // namespace

const char* host_isa_name(HostIsa isa) {
  switch (isa) {
    case HostIsa::avx512:
      return "avx512";
    case HostIsa::avx2:
      return "avx2";
    case HostIsa::baseline:
      break;
  }
  return "baseline";
}

bool host_isa_supported(HostIsa isa) {
#if MLACP_HOST_ISA_VARIANTS
  __builtin_cpu_init();  // needed where this runs before the constructors (a static initialiser of a user's)
#endif
  switch (isa) {
    case HostIsa::baseline:
      return true;
#if MLACP_HOST_ISA_VARIANTS
    case HostIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case HostIsa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    default:
      return false;
#endif
  }
  return false;
}

HostIsa host_isa_best() {
  for (const HostIsa isa : {HostIsa::avx512, HostIsa::avx2})
    if (host_isa_supported(isa)) return isa;
  return HostIsa::baseline;
}

template <>
const HostRowKernels<float>& host_row_kernels<float>(HostIsa isa) {
  return kernels_for<float>(isa);
}

template <>
const HostRowKernels<double>& host_row_kernels<double>(HostIsa isa) {
  return kernels_for<double>(isa);
}

}  // namespace mlacp::detail
