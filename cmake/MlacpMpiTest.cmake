# mlacp_add_mpi_test(<name> SOURCES <src>... [RANKS <n>...] [LABELS <label>...] [TIMEOUT <s>] [ARGS <arg>...])
#
# Builds one GoogleTest binary on the MPI test main and registers it with ctest once per rank count, as
# <name>_np<n>, launched through MPIEXEC_EXECUTABLE MPIEXEC_NUMPROC_FLAG <n> MPIEXEC_PREFLAGS <binary>
# MPIEXEC_POSTFLAGS. Set MPIEXEC_EXECUTABLE=srun and MPIEXEC_NUMPROC_FLAG=-n to run them under Slurm.
# Every test gets a TIMEOUT so that a hang fails instead of blocking the run.
#
# Launcher flags that depend on the machine (Open MPI's --oversubscribe where 4 ranks exceed the cores) and Open
# MPI's run-as-root variables are the caller's: pass them in MPIEXEC_PREFLAGS and the environment (scripts/test.sh
# does both for CI). Nothing here forces them on a user's cluster.
include_guard(GLOBAL)

# The environment of every MPI test: one BLAS / OpenMP thread per rank, and bf16 layers on their bf16 path
# (MLACP_BF16_COMPUTE=bf16), so that what a bf16 test checks does not depend on which path the machine times faster.
# The tests of the choice itself (test_mla_bf16_compute) set their own value after this one.
set(MLACP_TEST_ENVIRONMENT "OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1;MLACP_BF16_COMPUTE=bf16")

function(mlacp_add_mpi_test name)
  cmake_parse_arguments(arg "" "TIMEOUT" "SOURCES;RANKS;LABELS;ARGS" ${ARGN})
  if(NOT arg_RANKS)
    set(arg_RANKS 1 2 4)
  endif()
  add_executable(${name} ${arg_SOURCES})
  target_link_libraries(${name} PRIVATE mlacp_test_main mlacp::mlacp mlacp_warnings)
  foreach(nranks IN LISTS arg_RANKS)
    set(timeout)
    if(arg_TIMEOUT)
      set(timeout TIMEOUT ${arg_TIMEOUT})
    endif()
    mlacp_add_mpi_test_run(${name}_np${nranks} TARGET ${name} RANKS ${nranks} LABELS ${arg_LABELS} ${timeout}
                           ARGS ${arg_ARGS})
  endforeach()
endfunction()

# mlacp_add_mpi_test_run(<test name> TARGET <test binary target> RANKS <n> [LABELS <label>...] [TIMEOUT <s>]
#                        [ARGS <arg>...] [ENVIRONMENT <VAR=value>...])
#
# One ctest run of a test binary (of mlacp_add_mpi_test) at <n> ranks, as mlacp_add_mpi_test registers each of its
# rank counts, with ENVIRONMENT added to MLACP_TEST_ENVIRONMENT: the same tests again under another setting.
function(mlacp_add_mpi_test_run test)
  cmake_parse_arguments(arg "" "TARGET;RANKS;TIMEOUT" "LABELS;ARGS;ENVIRONMENT" ${ARGN})
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT ${MLACP_TEST_TIMEOUT})
  endif()
  set(environment ${MLACP_TEST_ENVIRONMENT} ${arg_ENVIRONMENT})
  add_test(NAME ${test} COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${arg_RANKS} ${MPIEXEC_PREFLAGS}
                                $<TARGET_FILE:${arg_TARGET}> ${MPIEXEC_POSTFLAGS} ${arg_ARGS})
  set_tests_properties(
    ${test}
    PROPERTIES TIMEOUT ${arg_TIMEOUT}
               PROCESSORS ${arg_RANKS}
               LABELS "mpi;np${arg_RANKS};${arg_LABELS}"
               ENVIRONMENT "${environment}")
endfunction()

# mlacp_add_expect_output_test(<name> RANKS <n> COMMAND <exe> <args>... EXPECT_EXIT zero|nonzero|<status>
#                              EXPECT <regex>... [REJECT <regex>...] [TIMEOUT <s>] [LABELS <label>...]
#                              [ENVIRONMENT <VAR=value>...])
#
# Runs <exe> under MPIEXEC with <n> ranks and checks the exit status and that every EXPECT pattern matches the
# combined output (each on its own, in any order: ranks' output interleaves), through MlacpExpectOutput.cmake.
# Patterns may not contain '|' (it separates the list on the way to the script).
function(mlacp_add_expect_output_test name)
  cmake_parse_arguments(arg "" "RANKS;EXPECT_EXIT;TIMEOUT" "COMMAND;EXPECT;REJECT;LABELS;ENVIRONMENT" ${ARGN})
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 120)
  endif()
  set(command ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${arg_RANKS} ${MPIEXEC_PREFLAGS} ${arg_COMMAND}
              ${MPIEXEC_POSTFLAGS})
  string(REPLACE ";" "|" command "${command}")
  string(REPLACE ";" "|" expect "${arg_EXPECT}")
  string(REPLACE ";" "|" reject "${arg_REJECT}")
  set(environment ${MLACP_TEST_ENVIRONMENT} ${arg_ENVIRONMENT})
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${command}" -DEXPECT_EXIT=${arg_EXPECT_EXIT}
                                "-DEXPECT=${expect}" "-DREJECT=${reject}" -P ${PROJECT_SOURCE_DIR}/cmake/MlacpExpectOutput.cmake)
  set_tests_properties(
    ${name}
    PROPERTIES TIMEOUT ${arg_TIMEOUT}
               PROCESSORS ${arg_RANKS}
               LABELS "mpi;np${arg_RANKS};${arg_LABELS}"
               ENVIRONMENT "${environment}")
endfunction()
