#!/usr/bin/env bash
# Builds mlacp and runs every test:
#   1. the format check (clang-format);
#   2. build/ (CMake preset dev: RelWithDebInfo, warnings as errors) and all of ctest: MPI tests at 1, 2 and 4 ranks,
#      the install tests, the error catalogue and watchdog scenarios, the soak test, the perf tests in --quick mode, the
#      Python package's pytest suites at 1, 2 and 4 ranks and examples/train_mla.py (-L python, -L examples), the
#      performance model's formulas on tiny cases, its calibration and the planner (-L plan, test_layer_model,
#      test_machine, test_calibrate, test_mesh_plan), the simulated cluster's locality (testbed_locality, -L testbed:
#      network namespaces and tc; skipped with a message when not root), and the Slurm tests
#      (a local single-node Slurm is started and stopped by the tests themselves; needs root);
#   3. build-asan/ (preset asan: AddressSanitizer + UndefinedBehaviorSanitizer) and the MPI tests at 1 and 2 ranks.
# Installs the Debian dependencies first when something is missing. Exits non-zero on any failure.
#
#   ./scripts/test.sh                       # everything
#   SANITIZERS=OFF SLURM_TESTS=OFF ./scripts/test.sh   # quicker, without root-only parts
#   BUILD_DIR=/tmp/b CTEST_ARGS="-L mpi" ./scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build_dir=${BUILD_DIR:-$root/build}
asan_dir=${ASAN_BUILD_DIR:-$root/build-asan}
jobs=${BUILD_JOBS:-$(nproc)}

"$root/scripts/setup-deps.sh"

"$root/scripts/check-format.sh"

# This machine's launcher settings, passed to the build rather than built into it: Open MPI as root (CI runs as
# root), 4 ranks on fewer cores (--oversubscribe), one BLAS / OpenMP thread per rank.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
preflags=()
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then preflags=(-DMPIEXEC_PREFLAGS=--oversubscribe); fi

echo "== build and test ($build_dir, preset dev)"
# shellcheck disable=SC2086
cmake --preset dev -B "$build_dir" -DMLACP_ENABLE_SLURM_TESTS="${SLURM_TESTS:-ON}" -DMLACP_ENABLE_PYTHON=ON "${preflags[@]}" \
  ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$jobs"
# shellcheck disable=SC2086
# The fuzzer's long run (label fuzz_long, `ctest -L fuzz_long`) is left out; its quick run (label fuzz) is in.
ctest --test-dir "$build_dir" --output-on-failure -j "${CTEST_JOBS:-1}" -LE fuzz_long ${CTEST_ARGS:-}

if [[ ${SANITIZERS:-ON} == ON ]]; then
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer build and MPI tests at 1 and 2 ranks ($asan_dir, preset asan)"
  cmake --preset asan -B "$asan_dir" "${preflags[@]}"
  cmake --build "$asan_dir" -j "$jobs"
  # Open MPI is not built with frame pointers: the slow unwinder gives full stacks, so that the suppressions (Open
  # MPI's own allocations only, see the file) can match them.
  export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:abort_on_error=1
  export LSAN_OPTIONS=suppressions=$root/unit_tests/sanitizers/lsan-openmpi.supp:print_suppressions=0
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  # The watchdog scenarios end in MPI_Abort (no leak check is meaningful there), the soak test's resident-memory
  # bound does not hold under ASan's allocator, and an address-space cap (the allocation-failure tests) cannot work
  # beside ASan's shadow memory; all three run in the build above.
  ctest --test-dir "$asan_dir" --output-on-failure -L "np1|np2" -LE "soak|watchdog|memcap"
fi
