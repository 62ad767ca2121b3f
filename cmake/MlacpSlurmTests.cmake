# The ctests labelled `slurm`: mlacp-mla-block and the overlap perf test launched by `srun --mpi=pmix -n <n>`, as
# users run them, with nothing that only mpirun provides (no Open MPI root variables, no --oversubscribe).
#
# MLACP_ENABLE_SLURM_TESTS (OFF by default; scripts/test.sh turns it on) registers them. With MLACP_SLURM_LOCAL_CLUSTER
# (ON) a fixture starts a private single-node Slurm first (scripts/slurm/start-slurm.sh, root, installs Debian's
# packages when missing) and stops it after the last test (scripts/slurm/stop-slurm.sh); OFF runs them on the cluster
# that srun already talks to (from an salloc, say). Each test has a TIMEOUT and a Slurm time limit, so that a hang
# fails and leaves no job behind, and they share one RESOURCE_LOCK, as the node has room for one 4-rank job.
include_guard(GLOBAL)

option(MLACP_ENABLE_SLURM_TESTS "Register the ctests that run mlacp-mla-block and a perf test under srun" OFF)
option(MLACP_SLURM_LOCAL_CLUSTER "Start (and stop) a private single-node Slurm for the slurm tests (needs root)" ON)
set(MLACP_SLURM_DIR
    "/run/mlacp-slurm"
    CACHE PATH "Config, state, logs and pid files of the private Slurm (MLACP_SLURM_LOCAL_CLUSTER)")
set(MLACP_SLURM_SRUN_FLAGS
    "--mpi=pmix"
    CACHE STRING "Flags for srun in the slurm tests, before -n (Debian's Open MPI needs --mpi=pmix)")
if(NOT MLACP_ENABLE_SLURM_TESTS)
  return()
endif()

enable_testing()
# srun may not be installed yet when the private cluster is used: start-slurm.sh installs it before the first srun.
find_program(MLACP_SRUN_EXECUTABLE srun)
if(NOT MLACP_SRUN_EXECUTABLE)
  if(NOT MLACP_SLURM_LOCAL_CLUSTER)
    message(FATAL_ERROR "MLACP_ENABLE_SLURM_TESTS: srun not found (set MLACP_SRUN_EXECUTABLE)")
  endif()
  set(MLACP_SRUN_EXECUTABLE srun)
endif()

# One BLAS / OpenMP thread per rank; Open MPI's root variables are removed, as srun (unlike mpirun) does not need them.
set(_mlacp_slurm_environment "OPENBLAS_NUM_THREADS=set:1;OMP_NUM_THREADS=set:1;OMPI_ALLOW_RUN_AS_ROOT=unset:"
                             "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=unset:")
if(MLACP_SLURM_LOCAL_CLUSTER)
  list(APPEND _mlacp_slurm_environment "SLURM_CONF=set:${MLACP_SLURM_DIR}/slurm.conf")
  add_test(NAME slurm_start COMMAND ${PROJECT_SOURCE_DIR}/scripts/slurm/start-slurm.sh)
  add_test(NAME slurm_stop COMMAND ${PROJECT_SOURCE_DIR}/scripts/slurm/stop-slurm.sh)
  # The start may install packages first.
  set_tests_properties(slurm_start PROPERTIES FIXTURES_SETUP mlacp_slurm TIMEOUT 300)
  set_tests_properties(slurm_stop PROPERTIES FIXTURES_CLEANUP mlacp_slurm TIMEOUT 60)
  set_tests_properties(
    slurm_start slurm_stop
    PROPERTIES LABELS "slurm"
               RESOURCE_LOCK mlacp_slurm
               ENVIRONMENT "MLACP_SLURM_DIR=${MLACP_SLURM_DIR}")
endif()

# mlacp_add_slurm_test(<name> RANKS <n> TIMEOUT <s> COMMAND <exe> <args>... [EXPECT <regex>...] [REJECT <regex>...])
#
# Runs `srun MLACP_SRUN_FLAGS -n <n> <exe> <args>` and checks that it exits 0 and that its output matches every EXPECT
# and no REJECT pattern (MlacpExpectOutput.cmake; patterns must not contain '|'). srun's errors are always rejected:
# srun exits 0 when the tasks fail to launch, so an exit status alone proves nothing.
function(mlacp_add_slurm_test name)
  cmake_parse_arguments(arg "" "RANKS;TIMEOUT" "COMMAND;EXPECT;REJECT" ${ARGN})
  list(APPEND arg_REJECT "srun: error")
  # Slurm's own limit (minutes) ends the job should ctest's timeout kill srun.
  math(EXPR minutes "(${arg_TIMEOUT} + 59) / 60 + 1")
  set(command ${MLACP_SRUN_EXECUTABLE} ${MLACP_SRUN_FLAGS} -n ${arg_RANKS} --time=${minutes} --kill-on-bad-exit=1
              --job-name=${name} ${arg_COMMAND})
  string(REPLACE ";" "|" command "${command}")
  string(REPLACE ";" "|" expect "${arg_EXPECT}")
  string(REPLACE ";" "|" reject "${arg_REJECT}")
  set(work_dir ${PROJECT_BINARY_DIR}/slurm_tests/${name})
  file(MAKE_DIRECTORY ${work_dir})
  add_test(
    NAME ${name}
    COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${command}" -DEXPECT_EXIT=zero "-DEXPECT=${expect}" "-DREJECT=${reject}" -P
            ${PROJECT_SOURCE_DIR}/cmake/MlacpExpectOutput.cmake
    WORKING_DIRECTORY ${work_dir})
  set_tests_properties(
    ${name}
    PROPERTIES TIMEOUT ${arg_TIMEOUT}
               PROCESSORS ${arg_RANKS}
               LABELS "slurm;np${arg_RANKS}"
               RESOURCE_LOCK mlacp_slurm
               ENVIRONMENT_MODIFICATION "${_mlacp_slurm_environment}")
  if(MLACP_SLURM_LOCAL_CLUSTER)
    set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED mlacp_slurm)
  endif()
endfunction()

foreach(nranks 2 4)
  # P=<n> in the header: one job of <n> ranks, not <n> singletons that each ran alone (a PMI mismatch).
  foreach(strategy_dtype latent:double expanded:float)
    string(REPLACE ":" ";" strategy_dtype ${strategy_dtype})
    list(GET strategy_dtype 0 strategy)
    list(GET strategy_dtype 1 dtype)
    mlacp_add_slurm_test(
      slurm_mla_block_${strategy}_np${nranks}
      RANKS ${nranks}
      TIMEOUT 120
      COMMAND $<TARGET_FILE:mlacp-mla-block> --strategy ${strategy} --dtype ${dtype} --bias
      EXPECT "P=${nranks} " "PASS"
      REJECT "FAIL")
  endforeach()
  if(TARGET mlacp-perf-overlap)
    mlacp_add_slurm_test(
      slurm_perf_overlap_np${nranks}
      RANKS ${nranks}
      TIMEOUT ${MLACP_TEST_TIMEOUT}
      COMMAND $<TARGET_FILE:mlacp-perf-overlap> --quick --json perf_overlap_quick.json
      EXPECT "mlacp-perf-overlap: P=${nranks} " "wrote .*perf_overlap_quick.json"
      REJECT " nan" " -?inf " "error:")
  endif()
endforeach()
