#!/usr/bin/env bash
# The main job: installs what is missing, builds Release in build-release/, runs the perf suite at P = 2 on both
# transports (shared memory: plain mpirun; a simulated 2 Gbit/s cluster link: scripts/netns-link.sh), prints the
# tables, and leaves the JSON files and the timeline PNG in perf_results/.
#
#   ./scripts/bench.sh                  # P = 2, both transports (a few minutes on a 2-core machine)
#   NP=4 ./scripts/bench.sh             # another group size (oversubscribes a small machine)
#   RATE=10gbit ./scripts/bench.sh      # another link rate
#   REPEATS=21 ./scripts/bench.sh       # more repeats per measurement
#   SKIP_LINK=1 ./scripts/bench.sh      # shared memory only (no root needed for the run itself)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build_dir=${BUILD_DIR:-$root/build-release}
out=${OUT_DIR:-$root/perf_results}
np=${NP:-2}
rate=${RATE:-2gbit}
export RATE=$rate

"$root/scripts/setup-deps.sh"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLACP_ENABLE_TESTS=OFF \
  -DMLACP_ENABLE_PERF_TESTS=ON ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j "${BUILD_JOBS:-$(nproc)}" --target mlacp-perf-overlap mlacp-perf-block \
  mlacp-perf-efficiency

mkdir -p "$out"
bin=$build_dir/perf_tests
mpirun_cmd=(mpirun -n "$np")
if mpirun --version 2>/dev/null | grep -q "Open MPI"; then mpirun_cmd+=(--oversubscribe); fi
common=()
if [[ -n ${REPEATS:-} ]]; then common+=(--repeats "$REPEATS"); fi

run_suite() {  # <transport label> <rate label> <wrapper...>
  local transport=$1 rate_label=$2
  shift 2
  local tag=${transport}_np${np}
  echo
  echo "==== transport $transport, rate $rate_label, P = $np ===="
  "$@" "${mpirun_cmd[@]}" "$bin/mlacp-perf-efficiency" "${common[@]}" --transport-label "$transport" \
    --rate-label "$rate_label" --json "$out/efficiency_$tag.json"
  "$@" "${mpirun_cmd[@]}" "$bin/mlacp-perf-overlap" "${common[@]}" --transport-label "$transport" \
    --rate-label "$rate_label" --json "$out/overlap_$tag.json"
  "$@" "${mpirun_cmd[@]}" "$bin/mlacp-perf-block" "${common[@]}" --transport-label "$transport" \
    --rate-label "$rate_label" --json "$out/block_$tag.json" --timeline "$out/block_timeline_$tag.json"
  /usr/bin/python3 "$root/scripts/plot_timeline.py" "$out/block_timeline_$tag.json" "$out/block_timeline_$tag.png"
}

run_suite shm none
if [[ -z ${SKIP_LINK:-} ]]; then
  run_suite tcp-lo "$rate" "$root/scripts/netns-link.sh"
fi
echo
echo "bench: results in $out"
ls -1 "$out"
