#!/usr/bin/env bash
# Validates the performance model (include/mlacp/model/) where the measurement is sound: one rank per core, P = 2 on a
# 2-core machine, pinned (rank r on core r), either as two simulated nodes of one rank joined by a tc-limited link
# (scripts/netns-cluster.sh: 500mbit, 2gbit, 10gbit) or as one node of two ranks (shared memory, "shm"). For each
# testbed, calibration and measurement are interleaved round by round (the machine is shared and drifts):
# `mlacp-plan --calibrate` writes the round's machine file, then `mlacp-mla-block --machine <it>` runs every case of
# the testbed and reports its measured median beside the model's prediction and its peak Kokkos bytes beside the
# predicted memory. The case order is reversed every other round, so that a drift does not always hit the same cases.
# perf_tests/model/validate_report.py turns the JSON files into the table, the errors beside the rounds' own spread,
# the planner's ranking within each group (Kendall tau, the first choice's regret) and the predicted-vs-measured plot.
#
# The cases are a designed subset, not the full product: CASE_GROUPS lists (link, shape, dtype, wire, q-LoRA) groups and
# every group runs every CHOICES entry (strategy, C, layout; U = 2 / C). A group is what the planner ranks: the
# choices for one layer on one testbed. The default groups cover both shapes, float, bf16 and the bf16 wire, q-LoRA
# and every link, each dimension more than once.
#
#   sudo ./scripts/validate-model.sh                                  # 10 groups x 6 choices, 5 rounds (~12 min)
#   CASE_GROUPS="2gbit:block:float:same:0" ROUNDS=1 ./scripts/validate-model.sh    # a smoke run
#   BUILD_DIR=build OUT_DIR=/tmp/v ITERS=3 ./scripts/validate-model.sh
#
# Environment: BUILD_DIR (default build-release, with mlacp-plan and mlacp-mla-block), OUT_DIR (default
# perf_results/model; the runs go to OUT_DIR/validation, emptied first), ROUNDS (5), ITERS (5 timed iterations per
# run, after WARMUP 1), CALIBRATE_REPEATS (3), NICE (-15: the ranks' priority), CASE_GROUPS, CHOICES, and DELAY (the
# links' one-way delay, netns-cluster.sh's default). Needs root (the testbed). (CASE_GROUPS, not GROUPS: bash owns
# that name.)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build_dir=${BUILD_DIR:-$root/build-release}
out=${OUT_DIR:-$root/perf_results/model}
rounds=${ROUNDS:-5}
iters=${ITERS:-5}
warmup=${WARMUP:-1}
calibrate_repeats=${CALIBRATE_REPEATS:-3}
# The ranks' niceness: other work on a shared machine (builds) would otherwise take a rank's core for whole
# milliseconds, and every collective waits for the slowest rank. -15 gives a rank ~97% of its core against a nice-0
# process; 0 leaves the scheduler's default.
nice_level=${NICE:--15}
# link:shape:dtype:wire:q_lora. wire: same, or bf16 (a float layer whose all-to-alls and latent all-gather send bf16).
default_groups="500mbit:block:float:same:0 500mbit:block:float:bf16:0 500mbit:deepseek:float:same:384
2gbit:block:float:same:0 2gbit:deepseek:float:same:0 2gbit:deepseek:bf16:same:384
10gbit:deepseek:float:same:0 10gbit:block:float:bf16:384
shm:block:bf16:same:0 shm:deepseek:float:same:384"
groups=${CASE_GROUPS:-$default_groups}
# strategy:C:layout (the layout only matters for C = 2; U = 2 / C).
choices=${CHOICES:-latent:1:zigzag expanded:1:zigzag latent:2:zigzag latent:2:contiguous expanded:2:zigzag
expanded:2:contiguous}
plan_tool=$build_dir/src/mlacp-plan
block_tool=$build_dir/src/mlacp-mla-block
cluster=$root/scripts/netns-cluster.sh
ncpu=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc honours OMP_NUM_THREADS

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
if ((ncpu < 2)); then
  echo "validate-model: needs 2 cores for one rank per core (this machine has $ncpu)" >&2
  exit 1
fi

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

# The links' token bucket (tbf burst, unless BURST is set): 0.5 ms of the link's rate, at least 16 KiB. A bucket much
# larger than that refills while the layer computes and lets each collective's first bytes through at the veth's
# speed: with netns-cluster.sh's default 256 KiB at 500 Mbit/s a 128 KiB all-to-all after compute took 0.12-0.38 ms
# (2.8-8.7 Gbit/s), so the "500 Mbit/s" link was one only on average. 0.5 ms bounds that gain per collective.
burst_of() {
  local n=${1%%[a-z]*} unit=${1##*[0-9]} factor
  case $unit in
    kbit) factor=1e3 ;;
    mbit) factor=1e6 ;;
    gbit) factor=1e9 ;;
    *)
      echo "validate-model: link rate $1: expected <n>kbit, <n>mbit or <n>gbit" >&2
      exit 2
      ;;
  esac
  awk -v n="$n" -v f="$factor" 'BEGIN { b = n * f / 8 * 0.0005; if (b < 16384) b = 16384; printf "%db\n", b }'
}

export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
runs=$out/validation
rm -rf "$runs"
mkdir -p "$runs"
{
  echo "started $(date -u +%FT%TZ)"
  lscpu | grep -E "^Model name|^CPU\(s\)|^Thread|^Core|^Socket" | sed 's/:  */: /'
  echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "rounds=$rounds iters=$iters warmup=$warmup calibrate_repeats=$calibrate_repeats nice=$nice_level"
  for link in $(tr ' ' '\n' <<<"$groups" | cut -d: -f1 | awk '!seen[$0]++'); do
    [[ $link == shm ]] || echo "link $link: tbf burst ${BURST:-$(burst_of "$link")}"
  done
} >"$runs/environment.txt"
trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
# Each rank pinned to its own core (mpirun's own binding would put the one rank of each simulated node on core 0).
pin=(bash -c 'exec taskset -c $((OMPI_COMM_WORLD_RANK % '"$ncpu"')) "$0" "$@"')
started=$SECONDS
for link in $(tr ' ' '\n' <<<"$groups" | cut -d: -f1 | awk '!seen[$0]++'); do
  if [[ $link == shm ]]; then
    RATE=10gbit "$cluster" up 1 >/dev/null
    hosts=mlacp-node0:2
  else
    RATE=$link BURST=${BURST:-$(burst_of "$link")} "$cluster" up 2 >/dev/null
    hosts=mlacp-node0:1,mlacp-node1:1
  fi
  launch=(nice -n "$nice_level" "$cluster" run -- mpirun -np 2 --host "$hosts" --bind-to none "${pin[@]}")
  cases=()
  for group in $groups; do
    IFS=: read -r g_link shape dtype wire q_lora <<<"$group"
    [[ $g_link == "$link" ]] || continue
    for choice in $choices; do cases+=("$shape:$dtype:$wire:$q_lora:$choice"); done
  done
  for round in $(seq 1 "$rounds"); do
    tag=${link}_r$round
    machine=$runs/machine_$tag.json
    load=$(cut -d' ' -f1 /proc/loadavg)
    echo "== $link, round $round ($((SECONDS - started)) s; load $load): calibration"
    echo "load before $link round $round: $load" >>"$runs/loads.txt"
    "${launch[@]}" "$plan_tool" --calibrate --repeats "$calibrate_repeats" --out "$machine" |
      tee "$runs/calibration_$tag.txt" | sed 's/^/   /'
    ordered=("${cases[@]}")
    if ((round % 2 == 0)); then
      ordered=()
      for ((i = ${#cases[@]} - 1; i >= 0; i--)); do ordered+=("${cases[i]}"); done
    fi
    for case_ in "${ordered[@]}"; do
      IFS=: read -r shape dtype wire q_lora strategy ring layout <<<"$case_"
      read -r -a dims <<<"$(shape_args "$shape")"
      name=run_${tag}_${shape}_${dtype}_${wire}_q${q_lora}_${strategy}_C${ring}_${layout}
      label="$shape $dtype wire=$wire q=$q_lora $strategy C=$ring $layout"
      "${launch[@]}" "$block_tool" "${dims[@]}" --dtype "$dtype" --wire-dtype "$wire" --q-lora "$q_lora" \
        --strategy "$strategy" --ring "$ring" --ring-layout "$layout" --no-reference --warmup "$warmup" \
        --iters "$iters" --machine "$machine" --json "$runs/$name.json" |
        grep -E "iteration time|model \(" | sed "s/^/   $label: /" || echo "   $label: failed" >&2
    done
  done
  "$cluster" down >/dev/null
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg); $((SECONDS - started)) s" >>"$runs/environment.txt"
# --plan: the report also predicts every run with the calibrated synchronisation lag left out (sync_s = 0).
/usr/bin/python3 "$root/perf_tests/model/validate_report.py" "$runs" --out "$out" --plan "$plan_tool"
