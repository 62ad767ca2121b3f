#!/usr/bin/env bash
# Builds mlacp and runs every test: the format check, then ctest (MPI tests at 1, 2 and 4 ranks, the install test).
# Installs the Debian dependencies first when something is missing. Exits non-zero on any failure.
#
#   ./scripts/test.sh                  # build in build/ and test
#   BUILD_DIR=/tmp/b ./scripts/test.sh  # elsewhere
#   CTEST_ARGS="-L mpi" ./scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build_dir=${BUILD_DIR:-$root/build}

"$root/scripts/setup-deps.sh"

"$root/scripts/check-format.sh"

# Open MPI as root (CI runs as root), and one BLAS thread per rank.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMLACP_ENABLE_WERROR=ON \
  -DMLACP_ENABLE_TESTS=ON -DMLACP_ENABLE_PERF_TESTS=ON ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j "${BUILD_JOBS:-$(nproc)}"
# shellcheck disable=SC2086
ctest --test-dir "$build_dir" --output-on-failure -j "${CTEST_JOBS:-1}" ${CTEST_ARGS:-}
