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
include_guard(GLOBAL)

# It sets no language variable (CMAKE_CXX_STANDARD, CMAKE_CXX_EXTENSIONS) in the including scope: in a consumer's
# project those are the consumer's; mlacp's targets carry cxx_std_17 as a compile feature.
find_package(Kokkos REQUIRED)
find_package(KokkosKernels REQUIRED)

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

message(STATUS "mlacp: using ${MLACP_KOKKOS_FLAVOR}")
