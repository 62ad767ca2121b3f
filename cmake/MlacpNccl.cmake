# The optional NCCL backend: CUDA runtime + NCCL, found in CUDAToolkit_ROOT or /usr/local/cuda.
# Sets MLACP_HAVE_NCCL and provides the target mlacp_nccl_deps::nccl (an imported NCCL library).
# MLACP_ENABLE_NCCL: AUTO (use when found), ON (fail when not found), OFF.
include_guard(GLOBAL)

if(NOT DEFINED MLACP_ENABLE_NCCL)
  set(MLACP_ENABLE_NCCL AUTO)
endif()
set(MLACP_HAVE_NCCL OFF)
string(TOUPPER "${MLACP_ENABLE_NCCL}" _mlacp_nccl_mode)
if(NOT _mlacp_nccl_mode MATCHES "^(AUTO|ON|OFF|TRUE|FALSE|YES|NO|1|0)$")
  message(FATAL_ERROR "mlacp: MLACP_ENABLE_NCCL='${MLACP_ENABLE_NCCL}', expected AUTO, ON or OFF")
endif()

if(NOT _mlacp_nccl_mode MATCHES "^(OFF|FALSE|NO|0)$")
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
    set(MLACP_HAVE_NCCL ON)
    if(NOT TARGET mlacp_nccl_deps::nccl)
      add_library(mlacp_nccl_deps::nccl UNKNOWN IMPORTED)
      set_target_properties(
        mlacp_nccl_deps::nccl
        PROPERTIES IMPORTED_LOCATION "${MLACP_NCCL_LIBRARY}"
                   INTERFACE_INCLUDE_DIRECTORIES "${MLACP_NCCL_INCLUDE_DIR}"
                   INTERFACE_LINK_LIBRARIES CUDA::cudart)
    endif()
    message(STATUS "mlacp: NCCL backend ON (${MLACP_NCCL_LIBRARY}, CUDA ${CUDAToolkit_VERSION})")
  elseif(_mlacp_nccl_mode MATCHES "^(ON|TRUE|YES|1)$")
    message(FATAL_ERROR "mlacp: MLACP_ENABLE_NCCL=ON but CUDA runtime or NCCL was not found "
                        "(CUDAToolkit_FOUND=${CUDAToolkit_FOUND}, nccl.h: ${MLACP_NCCL_INCLUDE_DIR}, "
                        "libnccl: ${MLACP_NCCL_LIBRARY}); set CUDAToolkit_ROOT or NCCL_ROOT")
  else()
    message(STATUS "mlacp: NCCL backend OFF (CUDA runtime or NCCL not found)")
  endif()
endif()
