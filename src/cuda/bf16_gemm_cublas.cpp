// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
// The cuBLAS backend of the bf16 GEMM (bf16_gemm.hpp): cublasGemmEx with bf16 A and B, a float or bf16 C, float
// accumulation (CUBLAS_COMPUTE_32F), enqueued on the caller's stream. Kokkos Kernels has no bf16 TPL GEMM, so the plan
// calls cuBLAS here, with a handle it owns. Built only with cuBLAS (MLACP_HAVE_CUBLAS: Kokkos' CUDA backend and the
// CUDA toolkit's cuBLAS).
//
// cuBLAS is column-major and mlacp's matrices row-major: a row-major [m, n] C with row stride ldc is a column-major
// [n, m] C^T with leading dimension ldc, and C^T = op(B)^T op(A)^T, so the call passes B before A, n before m, and
// each operand's own transpose flag (a row-major A stored [m, k] is the column-major A^T that op(A)^T asks for).
#include <mlacp/bf16_gemm.hpp>
#include <mlacp/error.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

namespace mlacp::detail::cublas {

struct Handle {
  cublasHandle_t handle = nullptr;
};

namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw mlacp::Error(std::string("mlacp: cuBLAS ") + what + " failed: " + cublasGetStatusName(status) + " (" +
                       cublasGetStatusString(status) + ")");
}

int as_int(std::int64_t value, const char* name) {
  if (value < 0 || value > 2147483647)
    throw mlacp::InvalidArgument("mlacp: cuBLAS bf16 GEMM: " + std::string(name) + " = " + std::to_string(value) +
                                 " does not fit cublasGemmEx's int; expected at most 2147483647");
  return static_cast<int>(value);
}

}  // namespace

void HandleDeleter::operator()(Handle* handle) const {
  if (handle != nullptr && handle->handle != nullptr) cublasDestroy(handle->handle);
  delete handle;
}

std::unique_ptr<Handle, HandleDeleter> make_handle() {
  std::unique_ptr<Handle, HandleDeleter> handle(new Handle);
  check(cublasCreate(&handle->handle), "cublasCreate");
  return handle;
}

void matmul(Handle& handle, void* stream, const Bf16MatmulCall& call) {
  check(cublasSetStream(handle.handle, static_cast<cudaStream_t>(stream)), "cublasSetStream");
  check(cublasSetPointerMode(handle.handle, CUBLAS_POINTER_MODE_HOST), "cublasSetPointerMode");
  const cublasOperation_t op_b = call.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = call.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const float alpha = call.alpha, beta = call.beta;
  check(cublasGemmEx(handle.handle, op_b, op_a, as_int(call.n, "n"), as_int(call.m, "m"), as_int(call.k, "k"), &alpha,
                     call.b, CUDA_R_16BF, as_int(call.ldb, "ldb"), call.a, CUDA_R_16BF, as_int(call.lda, "lda"), &beta,
                     call.c, call.c_bf16 ? CUDA_R_16BF : CUDA_R_32F, as_int(call.ldc, "ldc"), CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

}  // namespace mlacp::detail::cublas
