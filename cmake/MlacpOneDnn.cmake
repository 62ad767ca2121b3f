# The optional oneDNN backend of the bf16 GEMM (include/mlacp/bf16_gemm.hpp): its matmul primitive multiplies bf16 by
# bf16 into float on host CPUs, with the CPU's bf16 instructions (AVX512-BF16, AMX) where it finds them at run time.
# Sets MLACP_HAVE_ONEDNN and provides the target mlacp_onednn_deps::dnnl (oneDNN's library and headers).
# MLACP_ENABLE_ONEDNN: AUTO (use when found), ON (fail when not found), OFF (see MlacpOptionalDependency.cmake).
#
# Found through oneDNN's own package config (dnnl-config.cmake, target DNNL::dnnl; Debian's libdnnl-dev 2.6 ships
# one, which also requires OpenCL, its GPU runtime), else as a header (oneapi/dnnl/dnnl.hpp) and a library (libdnnl)
# under DNNL_ROOT or the default paths. oneDNN is a private dependency of libmlacp: its headers stay out of mlacp's
# public headers, and a consumer of a static libmlacp only links it.
include_guard(GLOBAL)
include("${CMAKE_CURRENT_LIST_DIR}/MlacpOptionalDependency.cmake")

macro(_mlacp_find_onednn found_var searched_var)
  # The package config first. Its find_package(OpenCL REQUIRED) would stop the whole configure where OpenCL is
  # missing, so it is tried only where OpenCL is there (or where the config does not ask for it).
  find_package(OpenCL QUIET)
  if(OpenCL_FOUND)
    find_package(dnnl CONFIG QUIET HINTS ${DNNL_ROOT})
  endif()
  if(TARGET DNNL::dnnl)
    set(${found_var} "package config dnnl ${dnnl_VERSION}")
    if(NOT TARGET mlacp_onednn_deps::dnnl)
      add_library(mlacp_onednn_deps::dnnl INTERFACE IMPORTED)
      set_target_properties(mlacp_onednn_deps::dnnl PROPERTIES INTERFACE_LINK_LIBRARIES DNNL::dnnl)
    endif()
  else()
    find_path(
      MLACP_ONEDNN_INCLUDE_DIR oneapi/dnnl/dnnl.hpp
      HINTS ${DNNL_ROOT}
      PATH_SUFFIXES include)
    find_library(
      MLACP_ONEDNN_LIBRARY dnnl
      HINTS ${DNNL_ROOT}
      PATH_SUFFIXES lib lib64)
    if(MLACP_ONEDNN_INCLUDE_DIR AND MLACP_ONEDNN_LIBRARY)
      set(${found_var} "${MLACP_ONEDNN_LIBRARY}")
      if(NOT TARGET mlacp_onednn_deps::dnnl)
        add_library(mlacp_onednn_deps::dnnl UNKNOWN IMPORTED)
        set_target_properties(mlacp_onednn_deps::dnnl PROPERTIES IMPORTED_LOCATION "${MLACP_ONEDNN_LIBRARY}"
                                                                 INTERFACE_INCLUDE_DIRECTORIES "${MLACP_ONEDNN_INCLUDE_DIR}")
      endif()
    endif()
    string(CONCAT ${searched_var} "no dnnl package config, oneapi/dnnl/dnnl.hpp: ${MLACP_ONEDNN_INCLUDE_DIR}, "
                  "libdnnl: ${MLACP_ONEDNN_LIBRARY}")
  endif()
endmacro()

mlacp_optional_dependency(
  NAME ONEDNN
  FEATURE "oneDNN bf16 GEMM backend"
  PACKAGE oneDNN
  HINT "install libdnnl-dev or set DNNL_ROOT"
  FIND _mlacp_find_onednn)
