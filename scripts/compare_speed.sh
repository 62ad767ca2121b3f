#!/usr/bin/env bash
# Compares the layer's speed of two builds of mlacp, interleaved round by round on this machine (the machine is shared
# and drifts: each round runs the "before" build, then the "after" one, and the report takes each one's median over
# the rounds with the rounds' own range beside it). What runs, at P = 2 (one rank per core on a 2-core machine):
#   - mlacp-perf-block on shared memory and on the simulated 2 Gbit/s link (scripts/netns-link.sh): the overlapped
#     forward + backward of each strategy;
#   - mlacp-perf-overlap on both transports: each overlap pair's overlapped time;
#   - mlacp-mla-block at the DeepSeek-like head dims (shared memory), latent and expanded.
# Used for the refactors that must keep the speed within its run-to-run range (issues 32-34).
#
#   sudo ./scripts/compare_speed.sh BEFORE_BUILD AFTER_BUILD [OUT_DIR]      # ROUNDS=3 REPEATS=5 by default
#
# Needs root for the link (netns-link.sh); LINK=0 skips it. OVERLAP=0 skips mlacp-perf-overlap (the long part: about
# 6 minutes per run on the link, so that 2 rounds of everything take about 50 minutes on 2 cores);
# `LINK=0 OVERLAP=0` is the short form (a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
before=${1:?usage: compare_speed.sh BEFORE_BUILD AFTER_BUILD [OUT_DIR]}
after=${2:?usage: compare_speed.sh BEFORE_BUILD AFTER_BUILD [OUT_DIR]}
out=${3:-/tmp/mlacp-compare-speed}
rounds=${ROUNDS:-3}
repeats=${REPEATS:-5}
link=${LINK:-1}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
mpirun_cmd=(mpirun -n 2 --oversubscribe)
deepseek=(--batch 1 --seq 1024 --hidden 1024 --heads 8 --nope 128 --rope 64 --vdim 128 --latent 512 --iters 5
  --no-reference)
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; rounds $rounds, repeats $repeats" | tee "$out/cpu.txt"
for ((r = 1; r <= rounds; ++r)); do
  for which in before after; do
    b=$before
    [[ $which == after ]] && b=$after
    tag=${which}_r$r
    "${mpirun_cmd[@]}" "$b/perf_tests/mlacp-perf-block" --repeats "$repeats" --json "$out/block_shm_$tag.json" \
      > "$out/block_shm_$tag.txt" 2>&1
    if [[ ${OVERLAP:-1} == 1 ]]; then
      "${mpirun_cmd[@]}" "$b/perf_tests/mlacp-perf-overlap" --repeats "$repeats" --json "$out/overlap_shm_$tag.json" \
        > "$out/overlap_shm_$tag.txt" 2>&1
    fi
    if [[ $link == 1 ]]; then
      "$root/scripts/netns-link.sh" "${mpirun_cmd[@]}" "$b/perf_tests/mlacp-perf-block" --repeats "$repeats" \
        --json "$out/block_link_$tag.json" > "$out/block_link_$tag.txt" 2>&1
      if [[ ${OVERLAP:-1} == 1 ]]; then
        "$root/scripts/netns-link.sh" "${mpirun_cmd[@]}" "$b/perf_tests/mlacp-perf-overlap" --repeats "$repeats" \
          --json "$out/overlap_link_$tag.json" > "$out/overlap_link_$tag.txt" 2>&1
      fi
    fi
    for strategy in latent expanded; do
      "${mpirun_cmd[@]}" "$b/src/mlacp-mla-block" "${deepseek[@]}" --strategy "$strategy" \
        > "$out/mla_block_${strategy}_$tag.txt" 2>&1
    done
    echo "round $r: $which done"
  done
done
/usr/bin/python3 "$root/scripts/compare_speed_report.py" "$out" | tee "$out/report.md"
