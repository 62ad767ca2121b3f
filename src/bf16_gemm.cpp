// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The bf16 GEMM's backend names and its environment override (MLACP_BF16_GEMM); the oneDNN part is in
// bf16_gemm_onednn.cpp (built only with oneDNN).
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/settings.hpp>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace mlacp {

const char* bf16_gemm_backend_name(Bf16GemmBackend backend) {
  switch (backend) {
    case Bf16GemmBackend::automatic:
      return "auto";
    case Bf16GemmBackend::onednn:
      return "onednn";
    case Bf16GemmBackend::float_blas:
      return "float_blas";
    case Bf16GemmBackend::kokkos_kernels:
      return "kokkos_kernels";
    case Bf16GemmBackend::cublas:
      return "cublas";
  }
  return "?";
}

Bf16GemmBackend parse_bf16_gemm_backend(const std::string& value) {
  for (const auto b : {Bf16GemmBackend::automatic, Bf16GemmBackend::onednn, Bf16GemmBackend::float_blas,
                       Bf16GemmBackend::kokkos_kernels, Bf16GemmBackend::cublas})
    if (value == bf16_gemm_backend_name(b)) return b;
  throw mlacp::InvalidArgument(
      "mlacp: " + std::string(bf16_gemm_env_var) + "='" + value +
      "' is not a bf16 GEMM backend; expected one of auto, onednn, float_blas, kokkos_kernels, cublas");
}

Bf16GemmBackend bf16_gemm_backend_from_env() {
  const std::string value = Settings::from_environment().bf16_gemm();
  if (value.empty()) return Bf16GemmBackend::automatic;
  return parse_bf16_gemm_backend(value);
}

#if !MLACP_HAVE_ONEDNN
std::string onednn_cpu_isa() { return "none (built without oneDNN)"; }
bool onednn_has_amx() { return false; }
#endif

}  // namespace mlacp
