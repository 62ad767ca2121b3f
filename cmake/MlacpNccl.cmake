# The optional NCCL backend: CUDA runtime + NCCL, found in CUDAToolkit_ROOT or /usr/local/cuda.
# Sets MLACP_HAVE_NCCL and provides the target mlacp_nccl_deps::nccl (an imported NCCL library).
# MLACP_ENABLE_NCCL: AUTO (use when found), ON (fail when not found), OFF (see MlacpOptionalDependency.cmake).
include_guard(GLOBAL)
include("${CMAKE_CURRENT_LIST_DIR}/MlacpOptionalDependency.cmake")

macro(_mlacp_find_nccl found_var searched_var)
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  find_path(
    MLACP_NCCL_INCLUDE_DIR nccl.h
    HINTS ${NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}
    PATH_SUFFIXES include)
  find_library(
    MLACP_NCCL_LIBRARY nccl
    HINTS ${NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT}
    PATH_SUFFIXES lib lib64)
  if(CUDAToolkit_FOUND
     AND MLACP_NCCL_INCLUDE_DIR
     AND MLACP_NCCL_LIBRARY)
    set(${found_var} "${MLACP_NCCL_LIBRARY}, CUDA ${CUDAToolkit_VERSION}")
    if(NOT TARGET mlacp_nccl_deps::nccl)
      add_library(mlacp_nccl_deps::nccl UNKNOWN IMPORTED)
      set_target_properties(
        mlacp_nccl_deps::nccl
        PROPERTIES IMPORTED_LOCATION "${MLACP_NCCL_LIBRARY}"
                   INTERFACE_INCLUDE_DIRECTORIES "${MLACP_NCCL_INCLUDE_DIR}"
                   INTERFACE_LINK_LIBRARIES CUDA::cudart)
    endif()
  endif()
  string(CONCAT ${searched_var} "CUDAToolkit_FOUND=${CUDAToolkit_FOUND}, nccl.h: ${MLACP_NCCL_INCLUDE_DIR}, "
                "libnccl: ${MLACP_NCCL_LIBRARY}")
endmacro()

mlacp_optional_dependency(
  NAME NCCL
  FEATURE "NCCL backend"
  PACKAGE "CUDA runtime or NCCL"
  HINT "set CUDAToolkit_ROOT or NCCL_ROOT"
  FIND _mlacp_find_nccl)
