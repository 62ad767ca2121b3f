# The optional cuBLAS backend of the bf16 GEMM on Kokkos::Cuda (include/mlacp/bf16_gemm.hpp, src/cuda/): cublasGemmEx
# multiplies bf16 by bf16 into float with float accumulation, which Kokkos Kernels' TPLs do not offer for bf16.
# Sets MLACP_HAVE_CUBLAS; the library links CUDA::cublas (CUDAToolkit's target) privately.
# MLACP_ENABLE_CUBLAS: AUTO (use when Kokkos has its CUDA backend and cuBLAS is found), ON (fail otherwise), OFF (see
# MlacpOptionalDependency.cmake). Include it after MlacpKokkos.cmake, which sets MLACP_KOKKOS_BACKENDS.
include_guard(GLOBAL)
include("${CMAKE_CURRENT_LIST_DIR}/MlacpOptionalDependency.cmake")

macro(_mlacp_find_cublas found_var searched_var)
  if("CUDA" IN_LIST MLACP_KOKKOS_BACKENDS)
    if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
      set(CUDAToolkit_ROOT /usr/local/cuda)
    endif()
    find_package(CUDAToolkit QUIET)
    if(CUDAToolkit_FOUND AND TARGET CUDA::cublas)
      set(${found_var} "CUDA ${CUDAToolkit_VERSION}")
    endif()
    set(${searched_var} "CUDAToolkit_FOUND=${CUDAToolkit_FOUND} in ${CUDAToolkit_ROOT}")
  else()
    set(${searched_var} "Kokkos' backends are '${MLACP_KOKKOS_BACKENDS}', without CUDA")
  endif()
endmacro()

mlacp_optional_dependency(
  NAME CUBLAS
  FEATURE "cuBLAS bf16 GEMM"
  PACKAGE "Kokkos' CUDA backend or cuBLAS"
  HINT "build against a Kokkos with CUDA and set CUDAToolkit_ROOT"
  FIND _mlacp_find_cublas)
