# ctest script (cmake -P): installs the mlacp build tree MLACP_BUILD_DIR into WORK_DIR/prefix, then, by MODE (it
# prints "install test: passed" when every check passed, last):
#
#   consumer (default)  configures, builds and runs the consumer project CONSUMER_SOURCE_DIR against that prefix
#                       alone: no Kokkos_ROOT, the installed config must find the Kokkos and Kokkos Kernels mlacp was
#                       built with (BUILT_KOKKOS_DIR, checked in the consumer's cache), while a decoy Kokkos and Kokkos
#                       Kernels of another version are first in PATH, as a `module load`ed Kokkos's are.
#                       CXX_STANDARD (optional): the consumer's CMAKE_CXX_STANDARD, which the consumer must report back
#                       (__cplusplus). PROBE_SOURCE_DIR (optional, with CXX_STANDARD): a project that compiles Kokkos
#                       and Kokkos Kernels alone in that standard first; where it does not build, the test prints
#                       "install test: skipped" (for ctest's SKIP_REGULAR_EXPRESSION).
#   mismatch            configures the consumer against a Kokkos and Kokkos Kernels that differ from the build's: fakes
#                       made here, of another version, of other backends, a Kokkos Kernels of another version, and
#                       OTHER_KOKKOS_ROOT (optional, a real install of other version or backends, used as Kokkos_ROOT
#                       and KokkosKernels_ROOT). Each configure must fail with mlacp's error, which must name the
#                       build's (BUILT_KOKKOS_VERSION, BUILT_KOKKOS_BACKENDS comma-separated,
#                       BUILT_KOKKOSKERNELS_VERSION) and the found version and backends.
cmake_minimum_required(VERSION 3.22)
foreach(var MLACP_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR CMAKE_GENERATOR BUILT_KOKKOS_DIR BUILT_KOKKOS_VERSION
            BUILT_KOKKOS_BACKENDS)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "MlacpInstallTest.cmake: ${var} is not set")
  endif()
endforeach()
if(NOT DEFINED MODE)
  set(MODE consumer)
endif()
string(REPLACE "," ";" built_backends "${BUILT_KOKKOS_BACKENDS}")

function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "install test: '${command}' failed (${result})")
  endif()
endfunction()

# fake_package(<prefix> <package> <version> [<backends>...]): a package config of <package> (Kokkos or KokkosKernels)
# in <prefix>/lib/cmake/<package> that reports <version> and, for Kokkos, <backends> as Kokkos_DEVICES (and
# Kokkos_ENABLE_<backend>, as Kokkos' config sets them). It defines the package's imported target, without files, so
# that a configure finding it goes on (and fails later, or not at all) unless mlacp's check stops it.
function(fake_package prefix package version)
  set(dir "${prefix}/lib/cmake/${package}")
  file(WRITE "${dir}/${package}ConfigVersion.cmake"
       "set(PACKAGE_VERSION \"${version}\")\nset(PACKAGE_VERSION_COMPATIBLE TRUE)\n")
  if(package STREQUAL "Kokkos")
    string(CONCAT config "set(Kokkos_DEVICES ${ARGN})\nforeach(backend \${Kokkos_DEVICES})\n"
                  "  set(Kokkos_ENABLE_\${backend} ON)\nendforeach()\n" "set(target Kokkos::kokkos)\n")
  else()
    set(config "set(target Kokkos::kokkoskernels)\n")
  endif()
  file(WRITE "${dir}/${package}Config.cmake"
       "# A fake made by mlacp's install test (cmake/MlacpInstallTest.cmake).\n${config}"
       "if(NOT TARGET \${target})\n  add_library(\${target} INTERFACE IMPORTED)\nendif()\n")
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run_step(${CMAKE_COMMAND} --install "${MLACP_BUILD_DIR}" --prefix "${prefix}")
# The installed headers are the library: test and tool support (src/testing) stays out.
file(GLOB_RECURSE _installed_test_support "${prefix}/include/mlacp/testing/*" "${prefix}/include/mlacp/mla/synthetic.hpp"
     "${prefix}/include/mlacp/mla/reference_forward.hpp")
if(_installed_test_support)
  message(FATAL_ERROR "install test: test support was installed: ${_installed_test_support}")
endif()
set(consumer_args -G "${CMAKE_GENERATOR}" -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER} "-DCMAKE_PREFIX_PATH=${prefix}"
                  -DCMAKE_BUILD_TYPE=Release)

if(MODE STREQUAL "mismatch")
  # Backends that differ from the build's: Threads toggled.
  set(other_backends ${built_backends})
  if("THREADS" IN_LIST other_backends)
    list(REMOVE_ITEM other_backends THREADS)
  else()
    list(APPEND other_backends THREADS)
  endif()
  if(NOT other_backends)
    set(other_backends SERIAL)
  endif()
  list(SORT other_backends)
  list(JOIN built_backends ", " built_backends_text)
  list(JOIN other_backends ", " other_backends_text)
  string(REPLACE "." "\\." built_version_re "${BUILT_KOKKOS_VERSION}")
  set(built_kernels_re "${BUILT_KOKKOSKERNELS_VERSION}")
  if(built_kernels_re STREQUAL "")
    set(built_kernels_re "\\(no version: Trilinos-packaged\\)")
  endif()
  string(REPLACE "." "\\." built_kernels_re "${built_kernels_re}")
  set(built_re "mlacp was built with: Kokkos ${built_version_re}, backends ${built_backends_text} \\(")

  fake_package("${WORK_DIR}/kokkos-version" Kokkos 99.0.0 ${built_backends})
  fake_package("${WORK_DIR}/kokkos-backends" Kokkos ${BUILT_KOKKOS_VERSION} ${other_backends})
  fake_package("${WORK_DIR}/kernels-version" KokkosKernels 99.0.0)
  set(cases version backends kernels)
  set(version_args "-DKokkos_ROOT=${WORK_DIR}/kokkos-version")
  set(version_expect "${built_re}" "this project found: +Kokkos 99\\.0\\.0, backends ${built_backends_text} \\(")
  set(backends_args "-DKokkos_ROOT=${WORK_DIR}/kokkos-backends")
  set(backends_expect "${built_re}"
                      "this project found: +Kokkos ${built_version_re}, backends ${other_backends_text} \\(")
  set(kernels_args "-DKokkosKernels_ROOT=${WORK_DIR}/kernels-version")
  set(kernels_expect "mlacp was built with: KokkosKernels ${built_kernels_re} \\("
                     "this project found: +KokkosKernels 99\\.0\\.0 \\(")
  if(OTHER_KOKKOS_ROOT)
    list(APPEND cases other)
    set(other_args "-DKokkos_ROOT=${OTHER_KOKKOS_ROOT}" "-DKokkosKernels_ROOT=${OTHER_KOKKOS_ROOT}")
    set(other_expect "${built_re}" "this project found: +Kokkos [0-9.]+, backends [A-Z, ]+ \\(")
  endif()

  foreach(case IN LISTS cases)
    execute_process(
      COMMAND ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build-${case}" ${consumer_args}
              ${${case}_args}
      RESULT_VARIABLE result
      OUTPUT_VARIABLE output
      ERROR_VARIABLE output)
    if(result EQUAL 0)
      message(FATAL_ERROR "install test: the consumer configured against the ${case} mismatch (${${case}_args}):\n"
                          "${output}")
    endif()
    # The error must be mlacp's, and name both sides.
    foreach(expect "mlacp: (Kokkos|KokkosKernels) differs from the one this mlacp was built with" ${${case}_expect})
      if(NOT output MATCHES "${expect}")
        message(FATAL_ERROR "install test: the ${case} mismatch (${${case}_args}) failed the consumer's configure "
                            "without mlacp's error (no match for '${expect}'):\n${output}")
      endif()
    endforeach()
    string(REGEX MATCHALL "(mlacp was built with|this project found):[^\n]*" summary "${output}")
    list(JOIN summary "\n   " summary)
    message(STATUS "install test: ${case} mismatch rejected:\n   ${summary}")
  endforeach()
  list(LENGTH cases count)
  message(STATUS "install test: all ${count} Kokkos mismatches rejected")
  message(STATUS "install test: passed")
  return()
elseif(NOT MODE STREQUAL "consumer")
  message(FATAL_ERROR "MlacpInstallTest.cmake: MODE '${MODE}', expected consumer or mismatch")
endif()

# A decoy Kokkos / Kokkos Kernels of another version whose bin is first in PATH, as a `module load`ed one's is (CMake
# searches the prefixes of PATH's bin directories before the system prefixes, after HINTS): find_package(mlacp) must
# not take it.
fake_package("${WORK_DIR}/decoy" Kokkos 99.0.0 ${built_backends})
fake_package("${WORK_DIR}/decoy" KokkosKernels 99.0.0)
file(MAKE_DIRECTORY "${WORK_DIR}/decoy/bin")
set(ENV{PATH} "${WORK_DIR}/decoy/bin:$ENV{PATH}")
if(CXX_STANDARD)
  list(APPEND consumer_args -DCMAKE_CXX_STANDARD=${CXX_STANDARD} -DCMAKE_CXX_STANDARD_REQUIRED=ON)
  if(PROBE_SOURCE_DIR)
    # Configuring the probe must work (it is find_package(mlacp), as in the consumer); only its build may fail.
    run_step(${CMAKE_COMMAND} -S "${PROBE_SOURCE_DIR}" -B "${WORK_DIR}/probe" ${consumer_args})
    execute_process(
      COMMAND ${CMAKE_COMMAND} --build "${WORK_DIR}/probe"
      RESULT_VARIABLE result
      OUTPUT_VARIABLE output
      ERROR_VARIABLE output)
    if(NOT result EQUAL 0)
      string(REGEX MATCH "[^\n]*error[^\n]*" first_error "${output}")
      message(STATUS "install test: skipped: Kokkos / Kokkos Kernels (${BUILT_KOKKOS_VERSION}) do not compile in "
                     "C++${CXX_STANDARD} with ${CMAKE_CXX_COMPILER}: ${first_error}")
      return()
    endif()
  endif()
endif()
run_step(${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build" ${consumer_args})
# The Kokkos the consumer found is the one mlacp was built with.
file(STRINGS "${WORK_DIR}/build/CMakeCache.txt" found_dir REGEX "^Kokkos_DIR:")
string(REGEX REPLACE "^Kokkos_DIR:[A-Z]+=" "" found_dir "${found_dir}")
get_filename_component(found_dir "${found_dir}" REALPATH)
get_filename_component(built_dir "${BUILT_KOKKOS_DIR}" REALPATH)
if(NOT found_dir STREQUAL built_dir)
  message(FATAL_ERROR "install test: the consumer found Kokkos in '${found_dir}', mlacp was built with '${built_dir}'")
endif()
run_step(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
execute_process(
  COMMAND "${WORK_DIR}/build/consumer"
  RESULT_VARIABLE result
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)
message("${output}")
if(NOT result EQUAL 0)
  message(FATAL_ERROR "install test: the consumer failed (${result})")
endif()
if(CXX_STANDARD)
  # __cplusplus of each standard (the year and month of its publication as the compilers define it).
  set(cplusplus_17 201703)
  set(cplusplus_20 202002)
  if(DEFINED cplusplus_${CXX_STANDARD} AND NOT output MATCHES "C\\+\\+ standard: ${cplusplus_${CXX_STANDARD}}")
    message(FATAL_ERROR "install test: the consumer was not compiled as C++${CXX_STANDARD}")
  endif()
endif()
message(STATUS "install test: passed")
