// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The bf16 GEMM's backends by name (bf16_gemm.hpp runs them; backend.hpp says which an execution space has), and
// the environment variable that forces one. A light header: Backend<ExecSpace> and the settings table read it.
#pragma once

#include <string>

namespace mlacp {

enum class Bf16GemmBackend { automatic, onednn, float_blas, kokkos_kernels, cublas };

/// The environment variable that forces a backend.
inline constexpr const char* bf16_gemm_env_var = "MLACP_BF16_GEMM";

/// "auto", "onednn", "float_blas", "kokkos_kernels", "cublas".
const char* bf16_gemm_backend_name(Bf16GemmBackend backend);
/// The backend named `value`; throws mlacp::InvalidArgument naming the value and the expected names otherwise.
Bf16GemmBackend parse_bf16_gemm_backend(const std::string& value);
/// MLACP_BF16_GEMM's backend (automatic where unset or empty); throws like parse_bf16_gemm_backend.
Bf16GemmBackend bf16_gemm_backend_from_env();

namespace detail {
/// Whether Kokkos Kernels' gemm takes bf16 A and B with a float C. No Kokkos Kernels checked does: host builds' bf16
/// (mlacp::bfloat16) has no ArithTraits there, and on CUDA (Kokkos' native bhalf_t) Kokkos Kernels 4.6.02's generic
/// gemm and gemv kernels convert A's values to C's type implicitly, which bhalf_t's explicit conversions refuse (a CUDA
/// build of KokkosBlas::gemm on bhalf_t A, B and a float C does not compile).
inline constexpr bool kokkos_kernels_gemm_takes_bf16 = false;
}  // namespace detail

}  // namespace mlacp
