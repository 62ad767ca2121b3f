#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The PyTorch peer of mlacp-perf-attention: torch's own causal attention, forward and backward, on the shapes that
tool times mlacp's attention core on, in the same kind of run (issue 36).

torch 1.13 has no fused attention (scaled_dot_product_attention came with 2.0), so what a PyTorch user runs there
is the math path, as ulysses_mla_torch.py (the layer's peer) does: q * scale (on q: S*dqk multiplications, not
S*S), q k^T (matmul), masked_fill_ with a cached [S, S] causal mask, softmax, @ v (matmul), materialising the S x S
scores of every head; the backward is autograd's (o.backward(dO) with a fixed random dO). The tensors are contiguous
[1, h, S, d] (torch's natural layout for batched matmul; mlacp's core reads [1, S, h, d]).

Every rank runs the same work (P ranks load P cores, as mlacp-perf-attention), torch.set_num_threads(1). Protocol (the
C++ tool's): `--warmup` untimed iterations, then `--repeats` timed ones; each iteration times the forward and then the
backward separately, each after a barrier, each time the maximum over the ranks; the report gives the medians.

FLOPs per (batch, head), exactly as mlacp-perf-attention counts them: E = S(S+1)/2 visible causal pairs; forward
2E(dqk+dv), backward 2E(3dqk+2dv). The torch math path computes all S*S scores (and their gradients), so its
"fraction" counts only the useful work. GEMM rate: torch's square 512 x 512 x 512 matmul (C = A B^T into a kept
buffer, as the C++ tool's gemm "N", "T") of the same dtype, measured in the same run, median of max(repeats, 5) after
one untimed call; fraction = (FLOPs / rate) / (forward + backward time).

An allocation failure (run it under `prlimit --as`, as scripts/bench.sh does, so that an S x S that does not fit
fails instead of swapping) makes that row "OOM" and the run goes on.

  mpirun -n 2 python3 attention_torch.py [--quick] [--json FILE] [--repeats N] [--warmup N]
      [--dtype float|double|bf16|both] [--seq S[,S...]] [--heads h] [--shapes small,deepseek] [--check]

--check first compares torch's O, dQ, dK and dV on one small problem per head shape and dtype against a float64
recomputation done another way (numpy, one query row at a time, softmax and its backward written out) and prints
PASS/FAIL with the largest relative (Frobenius) error; a FAIL makes the exit code 1 (the timing still runs).
"""
import argparse
import math
import socket
import sys
import time
import traceback

import numpy as np
import torch
from mpi4py import MPI

# The layer peer's conventions: what counts as an allocation failure, the atomic JSON write, the relative error and
# docs/spec.md's tolerances (the module only defines; importing it starts nothing).
from ulysses_mla_torch import TOLERANCE, is_out_of_memory, relative_error, write_json

DTYPES = {"double": torch.float64, "float": torch.float32, "bf16": torch.bfloat16}
SHAPES = {"small": ("dqk=32 dv=32", 32, 32), "deepseek": ("dqk=192 dv=128", 192, 128)}
GEMM_N = 512


def causal_attention(q, k, v, mask, scale):
    """softmax(q k^T * scale, causal) v on [B, h, S, d] tensors, torch's math path as ulysses_mla_torch.py's
    causal_attention runs it (the scale on q; masking in place is safe: matmul's backward needs its inputs)."""
    scores = torch.matmul(q * scale, k.transpose(-1, -2))  # [B, h, S, S]
    scores.masked_fill_(mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v)  # [B, h, S, dv]


def attention_flops(s, h, dqk, dv):
    """(forward, backward) FLOPs of mlacp-perf-attention: E = h S(S+1)/2 visible pairs."""
    e = h * s * (s + 1.0) / 2.0
    return 2.0 * e * (dqk + dv), 2.0 * e * (3.0 * dqk + 2.0 * dv)


def step(comm, body):
    """Runs body() on every rank, timed; returns (seconds, max over ranks; failure message or None). An allocation
    failure on any rank is a failure on every rank (all ranks then leave the row together: the collectives match)."""
    failure = None
    start = time.perf_counter()
    try:
        body()
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        failure = str(error).splitlines()[0][:200] or type(error).__name__
    seconds = time.perf_counter() - start
    local = np.array([seconds, 1.0 if failure else 0.0])
    total = np.zeros(2)
    comm.Allreduce(local, total, op=MPI.MAX)
    if total[1]:
        messages = [m for m in comm.allgather(failure) if m]
        return total[0], messages[0]
    return total[0], None


def gemm_rate(comm, dtype, repeats):
    """torch's rate for a square GEMM C = A B^T ([512 x 512] x [512 x 512]) of the dtype: every rank at once, barrier,
    max over ranks, median of `repeats` after one untimed call."""
    n = GEMM_N
    a = torch.full((n, n), 0.5, dtype=dtype)
    b = torch.full((n, n), 0.25, dtype=dtype)
    c = torch.empty(n, n, dtype=dtype)
    times = []
    for it in range(repeats + 1):
        comm.Barrier()
        start = time.perf_counter()
        torch.mm(a, b.t(), out=c)
        t = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if it:
            times.append(t)
    return 2.0 * n * n * n / float(np.median(times))


def random_tensor(gen, shape, dtype):
    return (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)


def time_row(comm, dtype_name, shape, s, h, warmup, repeats, rate):
    """One row: forward and backward of causal_attention at [1, h, S, d], mlacp-perf-attention's fields."""
    head_shape, dqk, dv = SHAPES[shape]
    dtype = DTYPES[dtype_name]
    f_flops, b_flops = attention_flops(s, h, dqk, dv)
    row = {"dtype": dtype_name, "shape": shape, "head_shape": head_shape, "core": "torch-math", "seq": s,
           "heads": h, "dqk": dqk, "dv": dv, "status": "ok", "forward_s": None, "backward_s": None,
           "forward_flops": f_flops, "backward_flops": b_flops, "flops": f_flops + b_flops, "gemm_rate_flops": rate,
           "fraction_of_gemm_rate": None}
    state = {}

    def setup():
        gen = torch.Generator().manual_seed(7)
        state["q"] = random_tensor(gen, (1, h, s, dqk), dtype).requires_grad_()
        state["k"] = random_tensor(gen, (1, h, s, dqk), dtype).requires_grad_()
        state["v"] = random_tensor(gen, (1, h, s, dv), dtype).requires_grad_()
        state["do"] = random_tensor(gen, (1, h, s, dv), dtype)
        state["mask"] = torch.ones(s, s, dtype=torch.bool).triu(1)  # True = masked, computed once per row

    def forward():
        state["o"] = causal_attention(state["q"], state["k"], state["v"], state["mask"], 1.0 / math.sqrt(dqk))

    def backward():
        state.pop("o").backward(state["do"])

    forward_times, backward_times = [], []
    comm.Barrier()
    _, failure = step(comm, setup)
    for it in range(warmup + repeats):
        if failure:
            break
        for name in ("q", "k", "v"):
            state[name].grad = None  # outside the timed region: every iteration writes fresh gradients
        state.pop("o", None)
        comm.Barrier()
        t_f, failure = step(comm, forward)
        if failure:
            break
        comm.Barrier()
        t_b, failure = step(comm, backward)
        if it >= warmup and not failure:
            forward_times.append(t_f)
            backward_times.append(t_b)
    state.clear()
    if failure:
        row.update(status="OOM", error=failure)
        return row
    row.update(forward_s=float(np.median(forward_times)), backward_s=float(np.median(backward_times)),
               forward_times_s=forward_times, backward_times_s=backward_times)
    row["fraction_of_gemm_rate"] = row["flops"] / rate / (row["forward_s"] + row["backward_s"])
    return row


# ---- --check: torch's attention against a float64 recomputation done another way --------------------------------


def reference_attention(q, k, v, do, scale):
    """O, dQ, dK, dV in float64 numpy for [h, S, d] arrays, one query row at a time: the row's visible keys 0..i,
    a max-shifted exponential, the normalised probabilities; backward dP = dO V^T, dS = P (dP - rowsum(P dP)),
    dQ = scale dS K, dK += scale dS^T q, dV += P^T dO. No mask, no matmul over the whole S x S."""
    h, s, _ = q.shape
    o, dq = np.zeros((h, s, v.shape[2])), np.zeros_like(q)
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    for head in range(h):
        for i in range(s):
            keys, values = k[head, :i + 1], v[head, :i + 1]
            logits = keys @ q[head, i] * scale
            p = np.exp(logits - logits.max())
            p /= p.sum()
            o[head, i] = p @ values
            dp = values @ do[head, i]
            ds = p * (dp - p @ dp)
            dq[head, i] = scale * (ds @ keys)
            dk[head, :i + 1] += scale * np.outer(ds, q[head, i])
            dv[head, :i + 1] += np.outer(p, do[head, i])
    return {"O": o, "dQ": dq, "dK": dk, "dV": dv}


def check(comm, dtype_names, shapes, s=53, h=2):
    """Every rank checks the same small problem (S = 53, h = 2) for each dtype and head shape; rank 0 prints.
    Returns 0 (PASS) or 1 (FAIL)."""
    worst_verdict = 0
    for dtype_name in dtype_names:
        dtype, tolerance = DTYPES[dtype_name], TOLERANCE[dtype_name]
        for shape in shapes:
            _, dqk, dv = SHAPES[shape]
            gen = torch.Generator().manual_seed(11)
            # The inputs rounded to the dtype first: the reference sees exactly what torch sees.
            q, k = random_tensor(gen, (1, h, s, dqk), dtype), random_tensor(gen, (1, h, s, dqk), dtype)
            v, do = random_tensor(gen, (1, h, s, dv), dtype), random_tensor(gen, (1, h, s, dv), dtype)
            q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
            o = causal_attention(q, k, v, torch.ones(s, s, dtype=torch.bool).triu(1), 1.0 / math.sqrt(dqk))
            o.backward(do)
            got = {"O": o.detach(), "dQ": q.grad, "dK": k.grad, "dV": v.grad}
            want = reference_attention(*(t.detach().double().numpy()[0] for t in (q, k, v, do)), 1.0 / math.sqrt(dqk))
            errors = {name: relative_error(got[name].double().numpy()[0], want[name]) for name in want}
            worst = max(errors.values())
            verdict = 0 if worst <= tolerance else 1  # a nan error is above any tolerance
            worst = comm.allreduce(worst, op=MPI.MAX)
            verdict = comm.allreduce(verdict, op=MPI.MAX)
            worst_verdict = max(worst_verdict, verdict)
            if comm.rank == 0:
                print(f"attention-torch --check {dtype_name} {SHAPES[shape][0]} S={s} h={h}: relative error vs a "
                      "float64 row-by-row recomputation: "
                      + " ".join(f"{name} {e:.3e}" for name, e in errors.items())
                      + f"; {'PASS' if verdict == 0 else 'FAIL'} (max relative error {worst:.3e}, tolerance "
                      f"{tolerance:g})", flush=True)
    return worst_verdict


# ---- the run ----------------------------------------------------------------------------------------------------


def cpu_model():
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return "unknown"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="mlacp-perf-attention's quick run: S 256, 2 repeats, 1 warm-up")
    p.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    p.add_argument("--repeats", type=int, default=0, help="timed iterations (default 5, quick 2)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations first (default 2, quick 1)")
    p.add_argument("--dtype", choices=("float", "double", "bf16", "both"), default="both",
                   help="both (the default) = double, then float, as mlacp-perf-attention")
    p.add_argument("--seq", default=None, help="S[,S...] (default 512,2048; quick 256)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--shapes", default="small,deepseek", help="small (dqk = dv = 32), deepseek (dqk 192, dv 128)")
    p.add_argument("--check", action="store_true",
                   help="first check O, dQ, dK, dV against a float64 recomputation (PASS/FAIL; FAIL: exit code 1)")
    args = p.parse_args(argv)
    if args.repeats < 0 or args.warmup < 0 or args.heads < 1:
        p.error("--repeats and --warmup must not be negative, --heads at least 1")
    args.shape_list = [x for x in args.shapes.split(",") if x]
    for name in args.shape_list:
        if name not in SHAPES:
            p.error(f"--shapes {name}: expected small or deepseek")
    try:
        args.seq_list = [int(x) for x in (args.seq or ("256" if args.quick else "512,2048")).split(",") if x]
    except ValueError:
        p.error(f"--seq {args.seq}: expected S[,S...]")
    if any(x < 1 for x in args.seq_list):
        p.error("--seq: every S must be at least 1")
    args.dtype_list = ["double", "float"] if args.dtype == "both" else [args.dtype]
    return args


def abort_on_exception(kind, value, tb):
    """An unexpected exception on one rank ends the whole job (the others would wait in a barrier forever)."""
    traceback.print_exception(kind, value, tb)
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(1)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.excepthook = abort_on_exception
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    repeats = args.repeats or (2 if args.quick else 5)
    warmup = 1 if args.quick else args.warmup
    verdict = check(comm, args.dtype_list, args.shape_list) if args.check else 0

    rows, rates = [], {}
    for dtype_name in args.dtype_list:
        rates[dtype_name] = gemm_rate(comm, DTYPES[dtype_name], max(repeats, 5))
        for shape in args.shape_list:
            for s in args.seq_list:
                rows.append(time_row(comm, dtype_name, shape, s, args.heads, warmup, repeats, rates[dtype_name]))
    if rank == 0:
        print(f"attention-torch: torch {torch.__version__} math attention (matmul, masked_fill, softmax, matmul; "
              f"autograd backward), B=1, per rank (P = {size} ranks run the same work), median of max over ranks")
        print(f"CPU: {cpu_model()}")
        print(f"{'dtype':8s}{'head shape':16s}{'core':14s}{'S':>7s}{'h':>4s}{'fwd ms':>11s}{'bwd ms':>11s}"
              f"{'GFLOP/s':>10s}{'GEMM':>10s}{'fraction':>10s}")
        for r in rows:
            if r["status"] != "ok":
                print(f"{r['dtype']:8s}{r['head_shape']:16s}{r['core']:14s}{r['seq']:7d}{r['heads']:4d}"
                      f"{'OOM':>11s}{'OOM':>11s}{'-':>10s}{r['gemm_rate_flops'] / 1e9:10.2f}{'-':>10s}")
                continue
            total = r["forward_s"] + r["backward_s"]
            print(f"{r['dtype']:8s}{r['head_shape']:16s}{r['core']:14s}{r['seq']:7d}{r['heads']:4d}"
                  f"{r['forward_s'] * 1e3:11.2f}{r['backward_s'] * 1e3:11.2f}{r['flops'] / total / 1e9:10.2f}"
                  f"{r['gemm_rate_flops'] / 1e9:10.2f}{r['fraction_of_gemm_rate']:10.3f}")
        print(f"GEMM: torch's [{GEMM_N} x {GEMM_N}] x [{GEMM_N} x {GEMM_N}] matmul of the row's dtype, GFLOP/s; "
              "fraction = (FLOPs / GEMM rate) / (fwd + bwd), FLOPs over the S(S+1)/2 visible pairs")
        for r in rows:
            line = (f"RESULT tool=attention-torch status={r['status'].lower()} dtype={r['dtype']} shape={r['shape']} "
                    f"seq={r['seq']} heads={r['heads']}")
            if r["status"] == "ok":
                line += (f" forward_ms={r['forward_s'] * 1e3:.4f} backward_ms={r['backward_s'] * 1e3:.4f} "
                         f"gflops={r['flops'] / (r['forward_s'] + r['backward_s']) / 1e9:.4f} "
                         f"fraction={r['fraction_of_gemm_rate']:.4f}")
            print(line, flush=True)
        if args.json:
            doc = {"benchmark": "attention-torch", "tool": "attention-torch", "torch": torch.__version__,
                   "cpu_model": cpu_model(), "hostname": socket.gethostname(), "P": size, "quick": args.quick,
                   "warmup": warmup, "repeats": repeats, "torch_threads": torch.get_num_threads(),
                   "attention": "q * scale, matmul(q, k^T), masked_fill_(causal mask, -inf), softmax, matmul(p, v); "
                                "autograd backward with a fixed dO; [1, h, S, d] contiguous",
                   "flop_count": "E = S(S+1)/2 per head; forward 2E(dqk+dv), backward 2E(3dqk+2dv) (as "
                                 "mlacp-perf-attention)",
                   "protocol": "per iteration: barrier, forward, time = max over ranks; barrier, backward, time = "
                               "max over ranks; medians",
                   "gemm": {"shape": f"[{GEMM_N} x {GEMM_N}] x [{GEMM_N} x {GEMM_N}]",
                            "rate_flops": rates},
                   "check": None if not args.check else ("PASS" if verdict == 0 else "FAIL"),
                   "results": rows}
            write_json(args.json, doc)
            print(f"wrote {args.json}", flush=True)
    return verdict


if __name__ == "__main__":
    sys.exit(main())
