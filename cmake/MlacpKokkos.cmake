# Finds Kokkos and Kokkos Kernels and presents them as two targets, whatever their packaging:
#   Kokkos::kokkos         Kokkos core
#   Kokkos::kokkoskernels  Kokkos Kernels (links Kokkos::kokkos)
#
# Upstream Kokkos 4.x/5.x exports exactly these names; users point CMake at theirs with Kokkos_ROOT and
# KokkosKernels_ROOT (or CMAKE_PREFIX_PATH).
#
# Debian's Trilinos-packaged Kokkos 3.4.01 (libtrilinos-kokkos-dev) differs: its Kokkos::kokkos target lists a
# non-existent include directory (/usr/lib/include, computed one level too high), its real libraries are
# trilinos_kokkoscore / trilinos_kokkoskernels, and its headers live in <prefix>/include/trilinos. This module
# repairs Kokkos::kokkos and defines Kokkos::kokkoskernels there. It is the only place that knows about it, and it
# is installed with mlacp so that downstream projects get the same targets from find_package(mlacp).
#
# What it found, which mlacp's package config records:
#   MLACP_KOKKOS_DIR, MLACP_KOKKOS_VERSION, MLACP_KOKKOS_BACKENDS (Kokkos_DEVICES: upper case, sorted),
#   MLACP_KOKKOSKERNELS_DIR, MLACP_KOKKOSKERNELS_VERSION (empty for the Trilinos packaging: it has no version file)
#
# In a consumer's project the installed package config sets MLACP_BUILT_KOKKOS_DIR, MLACP_BUILT_KOKKOS_VERSION,
# MLACP_BUILT_KOKKOS_BACKENDS, MLACP_BUILT_KOKKOSKERNELS_DIR and MLACP_BUILT_KOKKOSKERNELS_VERSION to those of mlacp's
# build before it includes this module. The recorded directories are HINTS, searched before the system paths (so a
# consumer finds the Kokkos mlacp was built with, not Debian's in /usr), and a Kokkos or Kokkos Kernels of another
# version, or a Kokkos with other backends, is a FATAL_ERROR naming both: libmlacp is compiled against one Kokkos and
# must not be linked with another. (What comes before HINTS, a consumer's Kokkos_ROOT, Kokkos_DIR, CMAKE_PREFIX_PATH
# or an earlier find_package(Kokkos), is the consumer's choice, and checked.)
include_guard(GLOBAL)

# _mlacp_kokkos_check(<what> <differs> <built> <found> <built_dir> <found_dir>): the error when <differs>, where
# <built> and <found> describe the two (version, backends) and <built_dir> / <found_dir> are their config dirs.
function(_mlacp_kokkos_check what differs built found built_dir found_dir)
  if(NOT differs)
    return()
  endif()
  message(
    FATAL_ERROR
      "mlacp: ${what} differs from the one this mlacp was built with.\n"
      "  mlacp was built with: ${what} ${built} (${built_dir})\n"
      "  this project found:   ${what} ${found} (${found_dir})\n"
      "libmlacp is compiled against the first and must not be linked with another. find_package(mlacp) finds the "
      "Kokkos and Kokkos Kernels it was built with by default: drop Kokkos_ROOT / KokkosKernels_ROOT (and their "
      "prefixes in CMAKE_PREFIX_PATH), clear the cached Kokkos_DIR / KokkosKernels_DIR (cmake -U 'Kokkos*_DIR', or "
      "a fresh build directory) and call find_package(mlacp) before any find_package(Kokkos) of your own; or point "
      "${what}_DIR at ${built_dir}; or rebuild mlacp against the ${what} you want.")
endfunction()

# _mlacp_version_differs(<out> <built> <found>): versions compare as versions (4.6.01 is 4.6.1); an empty one (the
# Trilinos packaging's Kokkos Kernels) equals only an empty one.
function(_mlacp_version_differs out built found)
  if("${built}" STREQUAL "" OR "${found}" STREQUAL "")
    if("${built}" STREQUAL "${found}")
      set(${out} FALSE PARENT_SCOPE)
    else()
      set(${out} TRUE PARENT_SCOPE)
    endif()
  elseif("${built}" VERSION_EQUAL "${found}")
    set(${out} FALSE PARENT_SCOPE)
  else()
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()

# It sets no language variable (CMAKE_CXX_STANDARD, CMAKE_CXX_EXTENSIONS) in the including scope: in a consumer's
# project those are the consumer's; mlacp's targets carry cxx_std_17 as a compile feature.
find_package(Kokkos REQUIRED HINTS ${MLACP_BUILT_KOKKOS_DIR})

# The backends: Kokkos_DEVICES, which upstream's config (4.x, 5.x) and the Trilinos one (3.4.01: SERIAL) both set;
# else the Kokkos_ENABLE_<BACKEND> variables, which both set from it.
set(MLACP_KOKKOS_BACKENDS "")
if(DEFINED Kokkos_DEVICES)
  foreach(_mlacp_backend IN LISTS Kokkos_DEVICES)
    string(TOUPPER "${_mlacp_backend}" _mlacp_backend)
    list(APPEND MLACP_KOKKOS_BACKENDS "${_mlacp_backend}")
  endforeach()
else()
  foreach(_mlacp_backend SERIAL OPENMP THREADS HPX CUDA HIP SYCL OPENMPTARGET OPENACC)
    if(Kokkos_ENABLE_${_mlacp_backend})
      list(APPEND MLACP_KOKKOS_BACKENDS "${_mlacp_backend}")
    endif()
  endforeach()
endif()
list(REMOVE_DUPLICATES MLACP_KOKKOS_BACKENDS)
list(SORT MLACP_KOKKOS_BACKENDS)
set(MLACP_KOKKOS_DIR "${Kokkos_DIR}")
set(MLACP_KOKKOS_VERSION "${Kokkos_VERSION}")

if(DEFINED MLACP_BUILT_KOKKOS_VERSION)
  _mlacp_version_differs(_mlacp_differs "${MLACP_BUILT_KOKKOS_VERSION}" "${MLACP_KOKKOS_VERSION}")
  if(NOT "${MLACP_BUILT_KOKKOS_BACKENDS}" STREQUAL "${MLACP_KOKKOS_BACKENDS}")
    set(_mlacp_differs TRUE)
  endif()
  list(JOIN MLACP_BUILT_KOKKOS_BACKENDS ", " _mlacp_built_backends)
  list(JOIN MLACP_KOKKOS_BACKENDS ", " _mlacp_found_backends)
  _mlacp_kokkos_check(
    Kokkos ${_mlacp_differs} "${MLACP_BUILT_KOKKOS_VERSION}, backends ${_mlacp_built_backends}"
    "${MLACP_KOKKOS_VERSION}, backends ${_mlacp_found_backends}" "${MLACP_BUILT_KOKKOS_DIR}" "${MLACP_KOKKOS_DIR}")
endif()

find_package(KokkosKernels REQUIRED HINTS ${MLACP_BUILT_KOKKOSKERNELS_DIR})
set(MLACP_KOKKOSKERNELS_DIR "${KokkosKernels_DIR}")
set(MLACP_KOKKOSKERNELS_VERSION "${KokkosKernels_VERSION}")

if(DEFINED MLACP_BUILT_KOKKOSKERNELS_VERSION)
  _mlacp_version_differs(_mlacp_differs "${MLACP_BUILT_KOKKOSKERNELS_VERSION}" "${MLACP_KOKKOSKERNELS_VERSION}")
  set(_mlacp_built_version "${MLACP_BUILT_KOKKOSKERNELS_VERSION}")
  set(_mlacp_found_version "${MLACP_KOKKOSKERNELS_VERSION}")
  foreach(_mlacp_version _mlacp_built_version _mlacp_found_version)
    if("${${_mlacp_version}}" STREQUAL "")
      set(${_mlacp_version} "(no version: Trilinos-packaged)")
    endif()
  endforeach()
  _mlacp_kokkos_check(KokkosKernels ${_mlacp_differs} "${_mlacp_built_version}" "${_mlacp_found_version}"
                      "${MLACP_BUILT_KOKKOSKERNELS_DIR}" "${MLACP_KOKKOSKERNELS_DIR}")
endif()

if(TARGET trilinos_kokkoscore)
  # Debian / Trilinos packaging. Kokkos_INCLUDE_DIRS is correct there (it names include/trilinos).
  list(GET Kokkos_INCLUDE_DIRS 0 _mlacp_kokkos_include)
  get_filename_component(_mlacp_kokkos_include "${_mlacp_kokkos_include}" REALPATH)
  if(NOT EXISTS "${_mlacp_kokkos_include}/Kokkos_Core.hpp")
    message(FATAL_ERROR "mlacp: Trilinos-packaged Kokkos found, but no Kokkos_Core.hpp in '${_mlacp_kokkos_include}'")
  endif()
  set_target_properties(
    Kokkos::kokkos
    PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_mlacp_kokkos_include}"
               INTERFACE_LINK_LIBRARIES "trilinos_kokkosalgorithms;trilinos_kokkoscontainers;trilinos_kokkoscore")
  if(NOT TARGET Kokkos::kokkoskernels)
    add_library(Kokkos::kokkoskernels INTERFACE IMPORTED)
    set_target_properties(Kokkos::kokkoskernels PROPERTIES INTERFACE_LINK_LIBRARIES
                                                           "trilinos_kokkoskernels;Kokkos::kokkos")
  endif()
  set(MLACP_KOKKOS_FLAVOR "Trilinos-packaged Kokkos ${Kokkos_VERSION}")
else()
  if(NOT TARGET Kokkos::kokkos OR NOT TARGET Kokkos::kokkoskernels)
    message(FATAL_ERROR "mlacp: Kokkos::kokkos and Kokkos::kokkoskernels targets were not found; "
                        "set Kokkos_ROOT and KokkosKernels_ROOT to an upstream Kokkos 4.x/5.x install")
  endif()
  set(MLACP_KOKKOS_FLAVOR "Kokkos ${Kokkos_VERSION}, Kokkos Kernels ${KokkosKernels_VERSION}")
endif()

list(JOIN MLACP_KOKKOS_BACKENDS ", " _mlacp_found_backends)
message(STATUS "mlacp: using ${MLACP_KOKKOS_FLAVOR} (backends ${_mlacp_found_backends}; ${MLACP_KOKKOS_DIR})")
