#!/usr/bin/env bash
# The main job: installs what is missing, builds build-release/ (CMake preset release) and measures mlacp at P = 2.
#
# The default form prints the headline tables within about 10 minutes on 2 cores after the build:
#   1. the performance model's calibration on the simulated 2 Gbit/s link (scripts/netns-link.sh; mlacp-plan
#      --calibrate), whose machine file gives every mlacp-mla-block run its predicted time ("model ms");
#   2. the overlap pairs on the link (mlacp-perf-overlap: each collective hidden behind its independent compute);
#   3. mlacp-mla-block against the PyTorch peer (perf_tests/peers/, DeepSpeed-Ulysses style on gloo) on the link,
#      double and float, the perf_block and DeepSeek-like shapes, both strategies, each beside the fraction of the
#      GEMM rate it reaches and the model's prediction. bf16 cells run only on a CPU with bf16 instructions
#      (avx512_bf16 or amx_bf16; scripts/cpu_bf16_caps.py decides and prints the CPU): without them torch 1.13 falls
#      back to a path 22-31x slower than mlacp's, and those cells would tell nothing.
# FULL=1 runs everything (about 47 minutes on a fresh 2-core machine): the suite (efficiency, overlap, block and its
# timeline PNG) on shared memory and on the link, the calibration at P and at RING_NP on both transports, the
# attention core against the GEMM rate, the GEMM shapes, the ring cells at P = 4, the peer comparison on both
# transports with the q-LoRA shapes and bf16 on any CPU, the scaling sweep and a short validation of the model.
# Each part's variable below selects it in either form (1 on, 0 off); its default is the form's.
#
#   ./scripts/bench.sh                  # the headline tables (the default form)
#   FULL=1 ./scripts/bench.sh           # everything
#   NP=4 ./scripts/bench.sh             # another group size (oversubscribes a small machine)
#   RATE=10gbit ./scripts/bench.sh      # another link rate
#   REPEATS=21 ./scripts/bench.sh       # more repeats per measurement
#   SKIP_LINK=1 ./scripts/bench.sh      # shared memory only (no root needed for the run itself)
#   SUITE=1                             # the whole overlap suite (efficiency, overlap, block + timeline PNG) on both
#                                       # transports (default form: mlacp-perf-overlap on the link only)
#   CORE=1                              # the attention core against the GEMM rate (CORE_SEQS=512,1024,2048), and
#                                       # torch's math attention beside it (perf_tests/peers/attention_torch.py)
#   GEMM_SHAPES=1                       # the layer's time split GEMM shape by shape against each shape alone
#                                       # (mlacp-perf-gemm-shapes at P = 1 and P = NP; about 4 minutes)
#   PEER=0                              # without the mlacp-vs-PyTorch-peer comparison (and sweep)
#   PEER_TRANSPORTS="shm tcp-lo"        # the comparison's transports (default form: tcp-lo, the link)
#   BF16=0 / BF16=1                     # the comparison's bf16 cells off / on whatever the CPU
#   SWEEP=1                             # the scaling sweep S = 512 ... 16384 (a few minutes)
#   RING=1                              # the ring attention cells (P = 4 on the two-level mesh: balance, bytes and
#                                       # 2 x 2 vs 4 x 1 times at the DeepSeek-like shape; about 8 minutes)
#   RING_NP=4 RING_ROUNDS=3 RING_SEQ=4096   # the ring cells' P, alternating rounds and S of the DeepSeek-like shape
#   PEER_ITERS=9 PEER_WARMUP=2          # timed / untimed iterations of each comparison run (default 7 / 1)
#   PEER_SHAPES="deepseek deepseek_qlora"  # which comparison shapes (default form: block deepseek; FULL: and
#                                       # block_qlora deepseek_qlora)
#   SWEEP_DTYPES=double                 # the sweep's dtypes (default "double float"; bf16 is accepted too)
#   SWEEP_SEQS="512 1024 2048"          # the sweep's sequence lengths
#   MODEL=0                             # without the performance model: no calibration (mlacp-plan --calibrate),
#                                       # no "model ms" beside the measured times
#   VALIDATE=1                          # the model's short validation on the simulated two-node cluster
#                                       # (validate-model.sh with CASE_GROUPS=$RATE:block:float:same:0 ROUNDS=1;
#                                       # about 1 minute)
#   OVERLAP_COST=0 COST_ROUNDS=3        # the overlapped / blocking cells off / their alternated rounds (default on:
#                                       # float on shm and the link; FULL adds bf16 and q-LoRA; about 2-5 minutes)
#   PEER_MEM_GIB=10                     # per-rank address-space limit of the PyTorch runs (comparison, and torch's
#                                       # attention beside the core; default: the smaller of 10 GiB and 70% of the
#                                       # available memory / P)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build_dir=${BUILD_DIR:-$root/build-release}
out=${OUT_DIR:-$root/perf_results}
np=${NP:-2}
rate=${RATE:-2gbit}
export RATE=$rate

# The form and its parts (see the top): each part's variable wins; unset, it takes the form's default.
full=0
if [[ ${FULL:-0} != 0 ]]; then full=1; fi
core=${CORE:-$full} gemm_shapes=${GEMM_SHAPES:-$full} ring=${RING:-$full} sweep=${SWEEP:-$full}
validate=${VALIDATE:-$full} model=${MODEL:-1} peer=${PEER:-1}
suite=${SUITE:-overlap} # overlap: the default form's mlacp-perf-overlap on the link only
if ((full)) && [[ -z ${SUITE:-} ]]; then suite=1; fi
link_transport=tcp-lo
if [[ -n ${SKIP_LINK:-} ]]; then link_transport=shm; fi
if [[ -n ${PEER_TRANSPORTS:-} ]]; then
  read -r -a peer_transports <<<"$PEER_TRANSPORTS"
elif ((full)) && [[ -z ${SKIP_LINK:-} ]]; then
  peer_transports=(shm tcp-lo)
else
  peer_transports=("$link_transport")
fi
peer_shapes=${PEER_SHAPES:-block deepseek}
if ((full)) && [[ -z ${PEER_SHAPES:-} ]]; then peer_shapes="block deepseek block_qlora deepseek_qlora"; fi
bf16=${BF16:-$([[ $full == 1 ]] && echo 1 || echo auto)} # auto: only on a CPU with bf16 instructions

"$root/scripts/setup-deps.sh"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# The release preset: Release, compiled for this machine's instruction set (-march=native), as an HPC build for a
# known cluster is (Kokkos_ARCH_*); the attention core's row kernels choose their instruction set at run time in
# any build (src/host_row_kernels.cpp).
# The Python package is built too (PYTHONPATH=$build_dir/python), so that a PyTorch script runs on the same release
# build as the benchmarks.
# shellcheck disable=SC2086
cmake --preset release -B "$build_dir" -DMLACP_ENABLE_PYTHON=ON ${CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j "${BUILD_JOBS:-$(nproc)}" --target mlacp-perf-overlap mlacp-perf-block \
  mlacp-perf-efficiency mlacp-perf-attention mlacp-perf-gemm-shapes mlacp-mla-block mlacp-plan _mlacp

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

# ---- the performance model's calibration (issue 22) ------------------------------------------------------------------
# mlacp-plan --calibrate on each transport at each P the layer runs at below: machine_<transport>_np<P>.json. Every
# mlacp-mla-block run then gets its transport's file (--machine) and reports the model's prediction beside its time.
machine_args() {  # <transport> <P>: "--machine FILE" when that calibration exists
  local f=$out/machine_$1_np$2.json
  if [[ -f $f ]]; then echo "--machine $f"; fi
}
# The default form calibrates only what its runs use: P on the comparison's transports (and RING_NP for the ring
# cells); nothing when neither the comparison nor the ring cells run.
if [[ $model != 0 ]] && { ((full)) || [[ $peer != 0 || $ring != 0 ]]; }; then
  echo
  echo "==== performance model: calibration ===="
  cal_nps=$np cal_transports=("${peer_transports[@]}")
  if ((full)) || [[ $ring != 0 ]]; then cal_nps=$(printf '%s\n' "$np" "${RING_NP:-4}" | sort -u); fi
  if ((full)); then
    cal_transports=(shm)
    if [[ -z ${SKIP_LINK:-} ]]; then cal_transports+=(tcp-lo); fi
  fi
  for cal_np in $cal_nps; do
    cal_mpirun=(mpirun -n "$cal_np")
    if mpirun --version 2>/dev/null | grep -q "Open MPI"; then cal_mpirun+=(--oversubscribe); fi
    for transport in "${cal_transports[@]}"; do
      wrap=()
      if [[ $transport != shm ]]; then wrap=("$root/scripts/netns-link.sh"); fi
      "${wrap[@]}" "${cal_mpirun[@]}" "$build_dir/src/mlacp-plan" --calibrate \
        --out "$out/machine_${transport}_np$cal_np.json" | sed "s/^/  $transport: /" ||
        echo "bench: calibration on $transport at P = $cal_np failed"
    done
  done
fi

if [[ $suite == overlap ]]; then
  echo
  echo "==== overlap pairs, transport $link_transport, P = $np ===="
  wrap=() rate_label=none
  if [[ $link_transport != shm ]]; then wrap=("$root/scripts/netns-link.sh") rate_label=$rate; fi
  "${wrap[@]}" "${mpirun_cmd[@]}" "$bin/mlacp-perf-overlap" "${common[@]}" --transport-label "$link_transport" \
    --rate-label "$rate_label" --json "$out/overlap_${link_transport}_np$np.json"
elif [[ $suite != 0 ]]; then
  run_suite shm none
  if [[ -z ${SKIP_LINK:-} ]]; then
    run_suite tcp-lo "$rate" "$root/scripts/netns-link.sh"
  fi
fi

# The per-rank address-space limit of the PyTorch runs (torch's attention beside the core, the peer comparison): they
# materialise S x S scores, and at large S they must fail with "out of memory" instead of taking the machine down.
if [[ -n ${PEER_MEM_GIB:-} ]]; then
  limit_bytes=$((PEER_MEM_GIB * 1024 * 1024 * 1024))
else
  available_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
  limit_bytes=$((available_kib * 1024 / 10 * 7 / np))
  if ((limit_bytes > 10 * 1024 * 1024 * 1024)); then limit_bytes=$((10 * 1024 * 1024 * 1024)); fi
fi
limit=()
if command -v prlimit >/dev/null; then limit=(prlimit --as="$limit_bytes"); fi

# ---- the attention core alone against the GEMM rate --------------------------------------------------------------
# Every rank runs the same core work (P ranks load P cores, as in the layer); both dtypes, the perf_block head shape
# (dqk = dv = 32) and a DeepSeek-like one (dqk = 192, dv = 128), and the reference core where it is quick to time.
# Then torch's math attention on the same shapes under the same mpirun (perf_tests/peers/attention_torch.py, issue 36:
# matmul, masked_fill, softmax, matmul, autograd; the same FLOP count) and attention_report.py's table of the two,
# both against mlacp's GEMM rate too: attention_torch_np<P>.json, attention_vs_torch_np<P>.json.
if [[ $core != 0 ]]; then
  echo
  echo "==== attention core, P = $np ===="
  core_args=(--seq "${CORE_SEQS:-512,1024,2048}" --shapes "small,deepseek")
  "${mpirun_cmd[@]}" "$bin/mlacp-perf-attention" "${core_args[@]}" --json "$out/attention_np$np.json"
  if /usr/bin/python3 -c 'import torch, mpi4py, numpy' 2>/dev/null; then
    echo
    echo "==== attention core against torch's math attention, P = $np ===="
    rm -f "$out/attention_torch_np$np.json" "$out/attention_vs_torch_np$np.json"
    "${mpirun_cmd[@]}" "${limit[@]}" /usr/bin/python3 "$root/perf_tests/peers/attention_torch.py" "${core_args[@]}" \
      --json "$out/attention_torch_np$np.json" || echo "bench: attention_torch.py failed (rc $?)"
    /usr/bin/python3 "$root/perf_tests/peers/attention_report.py" "$out/attention_np$np.json" \
      "$out/attention_torch_np$np.json" "$out/attention_vs_torch_np$np.json" ||
      echo "bench: attention_report.py failed (rc $?)"
  else
    echo "bench: /usr/bin/python3 lacks torch, mpi4py or numpy: torch's attention beside the core skipped"
  fi
fi

# ---- the layer's GEMMs shape by shape against each shape alone (issue 23) -----------------------------------------
# mlacp-perf-gemm-shapes: forward + backward of both strategies at the perf_block and DeepSeek-like shapes, float and
# double, without and with q-LoRA (Rq = 1536), profiled through Kokkos Tools (GEMM regions, kernels, waits), each GEMM
# shape timed alone as the CPU's ceiling; at P = 1 and P = NP. perf_results/gemm_shapes/ holds the JSON.
if [[ $gemm_shapes != 0 ]]; then
  mkdir -p "$out/gemm_shapes"
  for p in 1 "$np"; do
    shapes_cmd=("${mpirun_cmd[@]}")
    shapes_cmd[2]=$p # mpirun -n P [...]
    echo
    echo "==== GEMM shapes: the layer against each shape alone, P = $p ===="
    "${shapes_cmd[@]}" "$bin/mlacp-perf-gemm-shapes" --json "$out/gemm_shapes/gemm_shapes_np$p.json" ||
      echo "bench: mlacp-perf-gemm-shapes at P = $p failed (rc $?)"
  done
fi

# ---- ring attention on the two-level mesh (issue 21) --------------------------------------------------------------
# mlacp-mla-block at P = 4 (RING_NP; oversubscribes a small machine): the attention balance over the ranks (C = 2 and
# 4, contiguous and zigzag, S = 4096, small heads: visible pairs x heads and attention CPU time, max/min), the bytes per
# rank per layer call at the DeepSeek-like shape (4 x 1, 2 x 2 and 1 x 4, both strategies; counted by the library and
# from the formula, and the formula at H = 128), and the times of 2 x 2 against flat Ulysses 4 x 1 there, both
# strategies, zigzag, float, RING_ROUNDS rounds alternating the order, on the link (shm with SKIP_LINK).
# perf_results/ring.json holds the tables (perf_tests/peers/ring_report.py).
if [[ $ring != 0 ]]; then
  ring_runs=$out/ring_runs
  rm -rf "$ring_runs"
  mkdir -p "$ring_runs"
  ring_np=${RING_NP:-4}
  ring_mpirun=(mpirun -n "$ring_np")
  if mpirun --version 2>/dev/null | grep -q "Open MPI"; then ring_mpirun+=(--oversubscribe); fi
  ring_block_bin=$build_dir/src/mlacp-mla-block
  ring_run() {  # <json> <wrapper|-> <args...>: one run, its output in <json>.log; never fails
    local json=$1 wrapper=$2 rc=0
    shift 2
    local wrap=()
    if [[ $wrapper != - ]]; then wrap=("$wrapper"); fi
    local transport=shm
    if [[ $wrapper != - ]]; then transport=tcp-lo; fi
    # shellcheck disable=SC2046
    "${wrap[@]}" "${ring_mpirun[@]}" "$ring_block_bin" --no-reference --dtype float "$@" --json "$json" \
      $(machine_args "$transport" "$ring_np") >"${json%.json}.log" 2>&1 || rc=$?
    if ((rc != 0)); then echo "  $(basename "${json%.json}"): rc $rc (see ${json%.json}.log)"; fi
  }
  echo
  echo "==== ring attention, P = $ring_np ===="
  for ring in 2 4; do
    for layout in contiguous zigzag; do
      ring_run "$ring_runs/balance_C${ring}_${layout}.json" - --seq 4096 --heads 8 --hidden 256 --nope 32 --rope 16 \
        --vdim 32 --latent 64 --warmup 0 --iters 1 --ring "$ring" --ring-layout "$layout"
    done
  done
  ring_shape=(--batch 1 --seq "${RING_SEQ:-4096}" --hidden 1024 --heads 8 --nope 128 --rope 64 --vdim 128 --latent 512
    --ring-layout zigzag)
  for strategy in latent expanded; do  # the 1 x P meshes: their byte count (one iteration, shm)
    ring_run "$ring_runs/mesh_1x${ring_np}_${strategy}_bytes_r0.json" - "${ring_shape[@]}" --strategy "$strategy" \
      --ring "$ring_np" --warmup 0 --iters 1
  done
  ring_transport=tcp-lo ring_wrapper=$root/scripts/netns-link.sh
  if [[ -n ${SKIP_LINK:-} ]]; then ring_transport=shm ring_wrapper=-; fi
  ring_cells=("latent 1" "latent 2" "expanded 1" "expanded 2")
  for ((round = 0; round < ${RING_ROUNDS:-3}; round++)); do
    for ((k = 0; k < ${#ring_cells[@]}; k++)); do
      read -r strategy ring <<<"${ring_cells[$(((k + round) % ${#ring_cells[@]}))]}"
      ring_run "$ring_runs/mesh_$((ring_np / ring))x${ring}_${strategy}_${ring_transport}_r${round}.json" \
        "$ring_wrapper" "${ring_shape[@]}" --strategy "$strategy" --ring "$ring" --warmup 1 --iters 1
    done
  done
  /usr/bin/python3 "$root/perf_tests/peers/ring_report.py" "$ring_runs" "$out"
fi

# ---- mlacp vs the PyTorch peer ---------------------------------------------------------------------------------------
# Both tools time the same thing the same way (barrier, forward + backward, max over ranks, median after warm-up).
# Each pair runs back to back, the order alternating from pair to pair, so that a load change on this shared machine
# hits both alike. Every run has a per-rank address-space limit: the peer materialises S x S scores, and at large S
# it must fail with "out of memory" (exit 3, JSON status) instead of taking the machine down.
peer_script=$root/perf_tests/peers/ulysses_mla_torch.py
block_bin=$build_dir/src/mlacp-mla-block
runs=$out/peer_runs
if [[ $peer != 0 ]] && ! /usr/bin/python3 -c 'import torch, mpi4py, numpy' 2>/dev/null; then
  echo "bench: /usr/bin/python3 lacks torch, mpi4py or numpy: no PyTorch peer comparison"
  peer=0
fi
if [[ $peer != 0 ]]; then
  rm -rf "$runs"
  mkdir -p "$runs"
  # gloo on the loopback interface: the only one inside netns-link.sh's namespace, and the same path on shm runs
  # (gloo has no shared-memory transport; the peer's "shm" runs use TCP over an unlimited loopback).
  export GLOO_SOCKET_IFNAME=lo
  iters=(--warmup "${PEER_WARMUP:-1}" --iters "${PEER_ITERS:-7}")
  shape_block=(--batch 1 --seq 512 --hidden 1024 --heads 8 --nope 16 --rope 16 --vdim 32 --latent 512)
  shape_deepseek=(--batch 1 --seq 1024 --hidden 1024 --heads 8 --nope 128 --rope 64 --vdim 128 --latent 512)
  # The same two with DeepSeek-V2/V3's factored query (q-LoRA; Rq / D as V3's 1536 / 7168 ~ 0.2-0.4).
  # shellcheck disable=SC2034  # read through `declare -n dims="shape_$shape"` below
  shape_block_qlora=("${shape_block[@]}" --q-lora 192)
  # shellcheck disable=SC2034
  shape_deepseek_qlora=("${shape_deepseek[@]}" --q-lora 384)

  on_transport() {  # <shm|tcp-lo> <command...>
    local transport=$1
    shift
    if [[ $transport == shm ]]; then "$@"; else "$root/scripts/netns-link.sh" "$@"; fi
  }
  run_one() {  # <tool: mlacp|peer> <transport> <json> <args...>: one run, its output in <json>.log; never fails
    local tool=$1 transport=$2 json=$3 rc=0
    shift 3
    if [[ $tool == mlacp ]]; then
      # shellcheck disable=SC2046
      on_transport "$transport" "${mpirun_cmd[@]}" "${limit[@]}" "$block_bin" --no-reference "$@" --json "$json" \
        $(machine_args "$transport" "$np") >"${json%.json}.log" 2>&1 || rc=$?
    else
      on_transport "$transport" "${mpirun_cmd[@]}" "${limit[@]}" /usr/bin/python3 "$peer_script" "$@" \
        --transport-label "$transport" --json "$json" >"${json%.json}.log" 2>&1 || rc=$?
    fi
    local what="rc $rc"
    if [[ -f $json ]]; then
      what=$(/usr/bin/python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
print("%.1f ms" % (d["time_median_s"] * 1e3) if d["status"] == "ok" else d["status"])' "$json")
    fi
    printf '  %-60s %s\n' "$(basename "${json%.json}")" "$what"
  }
  pair=0
  run_pair() {  # <json prefix> <transport> <args...>: mlacp and the peer back to back, alternating who goes first
    local prefix=$1 transport=$2
    shift 2
    local order=(mlacp peer)
    if ((pair++ % 2)); then order=(peer mlacp); fi
    for tool in "${order[@]}"; do run_one "$tool" "$transport" "${prefix}_${tool}.json" "$@"; done
  }

  dtypes=(double float)
  echo
  echo "==== mlacp vs the PyTorch peer, P = $np, ${PEER_ITERS:-7} iterations after ${PEER_WARMUP:-1} warm-up," \
    "address-space limit $((limit_bytes >> 20)) MiB per rank ===="
  if [[ $bf16 != 0 ]]; then
    # bf16 cells: mlacp's bf16 layer against the peer's torch.bfloat16 one. What bf16 runs on here (the probe
    # never fails the run; its JSON goes into peer_comparison.json through peer_report.py) decides them in the
    # default form: without bf16 instructions torch 1.13's bf16 path is 22-31x slower than mlacp's.
    /usr/bin/python3 "$root/scripts/cpu_bf16_caps.py" --binary "$block_bin" --json "$runs/cpu_bf16_caps.json" ||
      echo "bench: scripts/cpu_bf16_caps.py failed (rc $?)"
    if [[ $bf16 == auto ]]; then
      has_bf16=$(/usr/bin/python3 -c 'import json, sys
print(int(bool(json.load(open(sys.argv[1]))["cpu"]["bf16_instructions"])))' "$runs/cpu_bf16_caps.json" 2>/dev/null ||
        echo 0)
      if ((has_bf16)); then
        dtypes+=(bf16)
      else
        echo "  bf16 cells skipped: this CPU has no bf16 instructions (avx512_bf16, amx_bf16), where torch 1.13's bf16" \
          "falls back to a path 22-31x slower than mlacp's; BF16=1 runs them anyway"
      fi
    else
      dtypes+=(bf16)
    fi
  fi
  for shape in $peer_shapes; do
    declare -n dims="shape_$shape"
    for strategy in latent expanded; do
      for dtype in "${dtypes[@]}"; do
        for transport in "${peer_transports[@]}"; do
          run_pair "$runs/cmp_${shape}_${strategy}_${dtype}_${transport}" "$transport" "${dims[@]}" \
            --strategy "$strategy" --dtype "$dtype" "${iters[@]}"
        done
      done
    done
    unset -n dims
  done

  # The scaling sweep: the perf_block shape at growing S, latent, shm. Fewer iterations where one takes seconds.
  if [[ $sweep != 0 ]]; then
    echo
    echo "==== scaling sweep, P = $np, latent, shm, dtypes: ${SWEEP_DTYPES:-double float} ===="
    for seq in ${SWEEP_SEQS:-512 1024 2048 4096 8192 16384}; do
      if ((seq <= 2048)); then sweep_iters=(--warmup 1 --iters 5); elif ((seq <= 4096)); then
        sweep_iters=(--warmup 1 --iters 3)
      else sweep_iters=(--warmup 0 --iters 1); fi  # one iteration of 5-30 s each: a single sample, noisier
      for dtype in ${SWEEP_DTYPES:-double float}; do
        run_pair "$runs/sweep_S${seq}_latent_${dtype}" shm "${shape_block[@]}" --seq "$seq" --strategy latent \
          --dtype "$dtype" "${sweep_iters[@]}"
      done
    done
  fi
  /usr/bin/python3 "$root/perf_tests/peers/peer_report.py" "$runs" "$out"
fi
# ---- overlap that never costs: the layer overlapped against its blocking form on each transport (issue 36) --------
# mlacp-mla-block, latent, the DeepSeek-like shape: the overlapped schedule (the default) and --blocking (every
# collective waited right after its launch) back to back, the order alternating from round to round; each round's
# ratio of the two medians. OverlapPolicy polls only collectives that do not move through shared memory, so on shared
# memory the ratio is ~1 (nothing to hide, nothing paid) and on the link it is below 1 (what overlap hides). FULL
# adds bf16 and q-LoRA.
if [[ ${OVERLAP_COST:-1} != 0 ]]; then
  echo
  echo "==== overlapped / blocking: mlacp-mla-block latent, DeepSeek-like shape, P = $np, ${COST_ROUNDS:-3} rounds ===="
  cost_shape=(--batch 1 --seq 1024 --hidden 1024 --heads 8 --nope 128 --rope 64 --vdim 128 --latent 512)
  cost_transports=(shm)
  if [[ -z ${SKIP_LINK:-} ]]; then cost_transports+=(tcp-lo); fi
  cost_cells=("float")
  if ((full)); then cost_cells+=("bf16" "float --q-lora 384" "bf16 --q-lora 384"); fi
  mkdir -p "$out/overlap_cost"
  cost_round=0
  for transport in "${cost_transports[@]}"; do
    for cell in "${cost_cells[@]}"; do
      read -r -a cell_args <<<"$cell"
      ratios=""
      for ((round = 0; round < ${COST_ROUNDS:-3}; round++)); do
        modes=(overlapped blocking)
        if ((cost_round++ % 2)); then modes=(blocking overlapped); fi
        declare -A median=()
        for mode in "${modes[@]}"; do
          log=$out/overlap_cost/${transport}_${cell// /_}_${mode}_r$round.log
          wrap=()
          if [[ $transport != shm ]]; then wrap=("$root/scripts/netns-link.sh"); fi
          flag=()
          if [[ $mode == blocking ]]; then flag=(--blocking); fi
          "${wrap[@]}" "${mpirun_cmd[@]}" "$block_bin" --no-reference "${cost_shape[@]}" --strategy latent \
            --dtype "${cell_args[@]}" --warmup 1 --iters "${PEER_ITERS:-7}" "${flag[@]}" >"$log" 2>&1 ||
            echo "bench: mlacp-mla-block ($transport $cell $mode) failed (rc $?)"
          median[$mode]=$(sed -n 's/.*median \([0-9.]*\) ms.*/\1/p' "$log" | head -n 1)
        done
        if [[ -n ${median[overlapped]} && -n ${median[blocking]} ]]; then
          ratios+=" $(awk -v o="${median[overlapped]}" -v b="${median[blocking]}" 'BEGIN { printf "%.3f", o / b }')"
          ratios+=" (${median[overlapped]}/${median[blocking]} ms)"
        fi
        unset median
      done
      policy=$(sed -n 's/^  overlap: //p' "$out/overlap_cost/${transport}_${cell// /_}_overlapped_r0.log" | head -n 1)
      printf '  %-7s %-20s overlapped/blocking:%s\n          %s\n' "$transport" "$cell" "$ratios" "$policy"
    done
  done
fi

# ---- the performance model against the simulated two-node cluster (short form of scripts/validate-model.sh) -------
if [[ $validate != 0 && -z ${SKIP_LINK:-} ]]; then
  echo
  echo "==== performance model: validation on 2 nodes x 1 rank at $rate (short form) ===="
  CASE_GROUPS="$rate:block:float:same:0" ROUNDS=1 BUILD_DIR=$build_dir OUT_DIR=$out/model \
    "$root/scripts/validate-model.sh" || echo "bench: validate-model.sh failed (rc $?)"
fi
echo
echo "bench: results in $out ($((SECONDS / 60)) min $((SECONDS % 60)) s)"
ls -1 "$out"
