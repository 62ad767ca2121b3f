#!/usr/bin/env bash
# Validates the performance model (include/mlacp/model/) on the simulated cluster (scripts/netns-cluster.sh): for each
# inter-node rate and each layout of 4 ranks (2 nodes x 2 ranks, 4 nodes x 1), calibration and measurement are
# interleaved round by round (the machine is shared and drifts): `mlacp-plan --calibrate` writes the round's machine
# file, then `mlacp-mla-block --machine <it>` runs every (shape, strategy, mesh) case and reports its measured median
# beside the model's prediction and its peak Kokkos bytes beside the predicted memory, and `mlacp-plan` ranks the same
# choices. perf_tests/model/validate_report.py turns the JSON files into the table, the errors, the planner's hit
# rate and the predicted-vs-measured plot.
#
#   sudo ./scripts/validate-model.sh                       # 500mbit, 2gbit, 10gbit; 2 rounds (about 30 minutes)
#   RATES="2gbit" ROUNDS=1 SHAPES=block ./scripts/validate-model.sh     # the short form bench.sh runs
#   BUILD_DIR=build OUT_DIR=/tmp/v ./scripts/validate-model.sh
#
# Needs root (the testbed) and a build with mlacp-plan and mlacp-mla-block (BUILD_DIR, default build-release).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build_dir=${BUILD_DIR:-$root/build-release}
out=${OUT_DIR:-$root/perf_results/model}
rates=${RATES:-500mbit 2gbit 10gbit}
rounds=${ROUNDS:-2}
shapes=${SHAPES:-block deepseek}
layouts=${LAYOUTS:-2x2 4x1}
dtype=${DTYPE:-float}
iters=${ITERS:-3}
plan_tool=$build_dir/src/mlacp-plan
block_tool=$build_dir/src/mlacp-mla-block
cluster=$root/scripts/netns-cluster.sh

if [[ $(id -u) -ne 0 ]]; then
  echo "validate-model: needs root (scripts/netns-cluster.sh builds network namespaces)" >&2
  exit 1
fi
for tool in "$plan_tool" "$block_tool"; do
  [[ -x $tool ]] || {
    echo "validate-model: $tool not built (cmake --build $build_dir --target mlacp-plan mlacp-mla-block)" >&2
    exit 1
  }
done

shape_args() {
  case $1 in
    # perf_block's shape (scripts/bench.sh) and the DeepSeek-like head dimensions at a short sequence.
    block) echo "--batch 1 --seq 512 --hidden 1024 --heads 8 --nope 16 --rope 16 --vdim 32 --latent 512" ;;
    deepseek) echo "--batch 1 --seq 1024 --hidden 1024 --heads 8 --nope 128 --rope 64 --vdim 128 --latent 512" ;;
    *)
      echo "validate-model: unknown shape $1 (block, deepseek)" >&2
      exit 2
      ;;
  esac
}

# The run's own prediction beside its time where the tool takes a machine file (the report predicts every case again
# from the round's calibration with mlacp-plan, so that it does not depend on this).
machine_flag=0
if "$block_tool" --help 2>&1 | grep -q -- "--machine"; then machine_flag=1; fi

mkdir -p "$out/validation"
runs=$out/validation
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
for rate in $rates; do
  for layout in $layouts; do
    # NODESxG: 2x2 = 2 nodes of 2 ranks, 4x1 = 4 nodes of 1.
    nodes=${layout%x*}
    per_node=${layout#*x}
    hosts=$(seq -s, -f "mlacp-node%g:$per_node" 0 $((nodes - 1)))
    RATE=$rate "$cluster" up "$nodes" >/dev/null
    launch=("$cluster" run -- mpirun -np 4 --host "$hosts" --oversubscribe)
    for round in $(seq 1 "$rounds"); do
      tag=${rate}_${layout}_r${round}
      machine=$runs/machine_$tag.json
      echo "== $rate, $layout, round $round: calibration"
      "${launch[@]}" "$plan_tool" --calibrate --out "$machine" | sed 's/^/   /'
      for shape in $shapes; do
        read -r -a dims <<<"$(shape_args "$shape")"
        "$plan_tool" "${dims[@]}" --dtype "$dtype" --nodes "$nodes" --ranks-per-node "$per_node" --layout zigzag \
          --machine "$machine" --json "$runs/plan_${tag}_$shape.json" >/dev/null
        for strategy in latent expanded; do
          for ring in 1 2 4; do
            name=run_${tag}_${shape}_${strategy}_C$ring
            machine_arg=()
            if ((machine_flag)); then machine_arg=(--machine "$machine"); fi
            "${launch[@]}" "$block_tool" "${dims[@]}" --dtype "$dtype" --strategy "$strategy" --ring "$ring" \
              --no-reference --warmup 1 --iters "$iters" --json "$runs/$name.json" "${machine_arg[@]}" |
              grep -E "predicted|iteration time" | sed "s/^/   $shape $strategy C=$ring: /"
          done
        done
      done
    done
    "$cluster" down >/dev/null
  done
done
/usr/bin/python3 "$root/perf_tests/model/validate_report.py" "$runs" --plan "$plan_tool" --out "$out"
