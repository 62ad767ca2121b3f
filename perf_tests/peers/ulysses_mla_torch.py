#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The PyTorch peer of mlacp: the MLA block of docs/spec.md under Ulysses context parallelism, written the way
DeepSpeed-Ulysses writes it, with torch.distributed (gloo) and autograd.

What it is, so that the comparison with mlacp-mla-block is fair:
  * torch.distributed on the gloo backend (the CPU backend), one thread per rank (torch.set_num_threads(1));
  * the sequence/head exchange is all_to_all_single inside an autograd Function whose backward is the inverse
    all-to-all (DeepSpeed's _SeqAllToAll);
  * both schedules of docs/spec.md: "latent" all-gathers the [c, k_pe] payload along the sequence, each rank expands its
    own heads with its rows of w_kvb and only Q goes through the all-to-all (backward: reduce-scatter of the payload
    gradient); "expanded" expands all heads on the rank's tokens and sends Q, K and V through the all-to-all;
  * gloo has neither all-gather-into-tensor nor reduce-scatter, so they are emulated: all-gather = all_gather into a
    list + cat; reduce-scatter = all_to_all_single of the P blocks + a sum of the received blocks in rank order, which
    sends (P-1)/P of the tensor per rank where all_reduce + slice sends 2(P-1)/P and reduces all of it
    (--reduce-scatter allreduce selects that; measured slower, see README.md);
  * attention is matmul + causal mask + softmax + matmul, materialising the S x S scores per head (DeepSpeed-Ulysses'
    default local attention), all differentiated by autograd;
  * weight gradients are the rank's partial sums (no data-parallel reduction), as in docs/spec.md;
  * --q-lora R factors the query as DeepSeek-V2/V3 do (docs/spec.md step 1: cq = RMSNorm(x w_qa^T) * g_q, q = cq w_qb^T
    + b_q, w_qa [R, D], g_q [R], w_qb [H*dqk, R] in place of w_q), and --softmax-scale replaces 1/sqrt(dqk) (step
    6); --check reads both from the dump's config.json (q_lora_rank, softmax_scale; 0 when absent);
  * --dtype bf16 runs it the way a PyTorch user trains on CPU: torch.bfloat16 parameters and activations, GEMMs
    through torch (oneDNN's bf16 matmul on CPUs with AVX512-BF16 / AMX), RMSNorm's statistics in float32 (as Hugging
    Face's LlamaRMSNorm / DeepseekV2RMSNorm do), and 2-byte payloads on the wire. gloo in torch 1.13 refuses
    bfloat16 tensors ("Invalid scalar type", int16 too), so the all-to-alls and the all-gather move the same bytes as
    uint8 views (no conversion, the same bytes a bf16-capable gloo moves); see _WireBytes.

Launch it under mpirun (mpi4py provides the rank, the size, the store's address, a barrier and the timing
reductions; all the layer's data moves through gloo):

  mpirun -n 2 python3 ulysses_mla_torch.py --seq 512 --hidden 1024 --heads 8 --nope 16 --rope 16 --vdim 32 \\
      --latent 512 --strategy latent --dtype double --warmup 1 --iters 5 --json peer.json
  mpirun -n 2 python3 ulysses_mla_torch.py --check DIR     # DIR from mlacp-mla-block --dump DIR
  mpirun -n 2 python3 ulysses_mla_torch.py --check DIR --dtype bf16   # the peer in bf16 against a float/double dump

Timing protocol (the same as mlacp-mla-block): `--warmup` untimed iterations, then `--iters` timed ones; each starts
after a barrier, runs forward + backward, and its time is the maximum over the ranks; the report gives the median and
the minimum. An allocation failure (torch's allocator raising, or MemoryError; run it under `ulimit -v` / prlimit so
that an oversized S x S fails instead of taking the machine down) is reported as "out of memory", exit code 3.
"""
import argparse
import json
import math
import os
import resource
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from mpi4py import MPI

EXIT_OOM = 3
# docs/spec.md's relative (Frobenius) tolerances; bf16 (8 significant bits, float accumulation) is checked at 2e-2.
TOLERANCE = {"double": 1e-10, "float": 1e-4, "bf16": 2e-2}
DTYPES = {"double": torch.float64, "float": torch.float32, "bf16": torch.bfloat16}


# ---- collectives (gloo) with their adjoints ---------------------------------------------------------------------------


class _WireBytes:
    """How bf16 tensors go through gloo. torch 1.13's ProcessGroupGloo rejects torch.bfloat16 (and torch.int16) with
    "Invalid scalar type" before anything is sent; the data-moving collectives (all_to_all_single, all_gather) then
    move the same bytes as uint8 views of the bf16 tensors: no conversion, 2 bytes per element on the wire, as a gloo
    that takes bfloat16 moves them. Which one applies is found out once, by the first bf16 collective (every rank
    reaches it at the same point, and the refusal is raised locally before any communication). A reduction cannot
    add raw bytes: all_reduce of bf16 (only --reduce-scatter allreduce) widens to float32, sums, and narrows back."""

    native = None  # None: not probed yet; True: gloo takes bfloat16; False: uint8 views

    @classmethod
    def takes_bf16(cls):
        if cls.native is None:
            try:
                probe = torch.zeros(dist.get_world_size(), dtype=torch.bfloat16)
                dist.all_to_all_single(torch.empty_like(probe), probe)
                cls.native = True
            except RuntimeError as error:
                if "Invalid scalar type" not in str(error):
                    raise
                cls.native = False
        return cls.native

    @classmethod
    def view(cls, t):
        """What gloo is given for tensor t (contiguous): t itself, or its bytes where gloo refuses bfloat16."""
        if t.dtype == torch.bfloat16 and not cls.takes_bf16():
            return t.view(torch.uint8)
        return t

    @classmethod
    def describe(cls, dtype):
        """For the report; never probes (that is a collective)."""
        if dtype != torch.bfloat16:
            return str(dtype).replace("torch.", "")
        if cls.native is None:
            return "bfloat16 (no collective ran)"
        return "bfloat16" if cls.native else "bfloat16 as uint8 views (gloo rejects bfloat16)"


def _all_to_all(send):
    """all_to_all_single of a contiguous tensor whose first dimension is P: block j goes to rank j, and block j of
    the result came from rank j."""
    recv = torch.empty_like(send)
    dist.all_to_all_single(_WireBytes.view(recv), _WireBytes.view(send))
    return recv


def tokens_to_heads(x):
    """[B, s, H, d] token-local -> [B, S, h, d] head-local: gather the sequence, scatter the heads."""
    P = dist.get_world_size()
    B, s, H, d = x.shape
    send = x.reshape(B, s, P, H // P, d).permute(2, 0, 1, 3, 4).contiguous()  # [P, B, s, h, d]
    recv = _all_to_all(send)  # [P (token owner), B, s, h, d]
    return recv.permute(1, 0, 2, 3, 4).reshape(B, P * s, H // P, d)


def heads_to_tokens(x):
    """[B, S, h, d] head-local -> [B, s, H, d] token-local: the inverse of tokens_to_heads."""
    P = dist.get_world_size()
    B, S, h, d = x.shape
    send = x.reshape(B, P, S // P, h, d).transpose(0, 1).contiguous()  # [P, B, s, h, d]
    recv = _all_to_all(send)  # [P (head owner), B, s, h, d]
    return recv.permute(1, 2, 0, 3, 4).reshape(B, S // P, P * h, d)


class TokensToHeads(torch.autograd.Function):
    """DeepSpeed-Ulysses' sequence all-to-all: forward tokens -> heads, backward the inverse all-to-all."""

    @staticmethod
    def forward(ctx, x):
        return tokens_to_heads(x)

    @staticmethod
    def backward(ctx, grad):
        return heads_to_tokens(grad)


class HeadsToTokens(torch.autograd.Function):
    """The attention output's way back: forward heads -> tokens, backward tokens -> heads."""

    @staticmethod
    def forward(ctx, x):
        return heads_to_tokens(x)

    @staticmethod
    def backward(ctx, grad):
        return tokens_to_heads(grad)


def reduce_scatter_sequence(grad, algorithm):
    """Sum over the ranks of grad [B, S, W], each rank keeping its own token block [B, s, W].

    gloo has no reduce-scatter. "alltoall": each rank sends block j to rank j (all_to_all_single) and sums the P
    blocks it receives in rank order: (P-1)/P of the tensor on the wire per rank, and a sum of s tokens. "allreduce":
    all_reduce of the whole tensor, then the rank's slice: twice the bytes and P times the additions. The first is
    the default because it is faster (README.md has the measurement)."""
    P, r = dist.get_world_size(), dist.get_rank()
    B, S, W = grad.shape
    s = S // P
    if algorithm == "alltoall":
        send = grad.reshape(B, P, s, W).transpose(0, 1).contiguous()  # [P, B, s, W]
        return _all_to_all(send).sum(dim=0)
    # all_reduce is in place: never write into autograd's gradient. gloo cannot sum bf16 (see _WireBytes): the
    # bf16 gradient is summed in float32 (twice the bytes of bf16 on the wire) and narrowed back.
    full = grad.float() if grad.dtype == torch.bfloat16 else grad.contiguous().clone()
    dist.all_reduce(full)
    return full[:, r * s:(r + 1) * s].to(grad.dtype).contiguous()


class GatherSequence(torch.autograd.Function):
    """All-gather of [B, s, W] along the sequence into [B, S, W] (all_gather into a list + cat, as gloo has no
    all-gather into one tensor); backward: the reduce-scatter of the gradient back to the token owners."""

    @staticmethod
    def forward(ctx, x, algorithm):
        ctx.algorithm = algorithm
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather([_WireBytes.view(p) for p in parts], _WireBytes.view(x))
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_sequence(grad, ctx.algorithm), None


# ---- the layer ------------------------------------------------------------------------------------------------------


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x, cos, sin):
    """Rotate-half (GPT-NeoX) RoPE; cos and sin broadcast over x's leading dimensions."""
    return x * cos + rotate_half(x) * sin


def rms_norm(x, weight, eps):
    """RMSNorm; a bf16 input is normalised in float32 and rounded back before the gain, as Hugging Face's
    LlamaRMSNorm / DeepseekV2RMSNorm do (what a PyTorch user's bf16 model runs)."""
    if x.dtype == torch.bfloat16:
        xf = x.float()
        return weight * (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def causal_attention(q, k, v, mask, scale):
    """softmax(q k^T * scale, causal) v for head-local [B, S, h, d] tensors, materialising the [B, h, S, S] scores
    (what DeepSpeed-Ulysses' default local attention does). The scale is applied to q (S*dqk multiplications, not
    S*S); in place masking is safe because matmul's backward needs its inputs, not its output. In bf16 the scores
    and probabilities are bf16 tensors; torch's CPU softmax computes a bf16 row's max and sum in float (measured:
    the same result as a float32 softmax rounded to bf16), so no explicit upcast is needed."""
    q = q.transpose(1, 2)  # [B, h, S, dqk]
    k = k.transpose(1, 2)
    v = v.transpose(1, 2)
    scores = torch.matmul(q * scale, k.transpose(-1, -2))  # [B, h, S, S]
    scores.masked_fill_(mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v).transpose(1, 2)  # [B, S, h, dv]


class UlyssesMLA(torch.nn.Module):
    """The MLA block of docs/spec.md on one rank of a Ulysses group (the default torch.distributed group)."""

    def __init__(self, cfg, weights, dtype, strategy, reduce_scatter="alltoall"):
        super().__init__()
        self.P, self.rank = dist.get_world_size(), dist.get_rank()
        for key in ("batch", "seq", "hidden", "heads", "nope", "rope", "vdim", "latent"):
            setattr(self, key, cfg[key])
        self.q_lora = cfg.get("q_lora", 0)
        if self.seq % self.P or self.heads % self.P:
            raise ValueError(f"S={self.seq} and H={self.heads} must be divisible by P={self.P}")
        if self.rope % 2:
            raise ValueError(f"dr={self.rope} must be even")
        self.strategy, self.reduce_scatter = strategy, reduce_scatter
        self.s, self.h = self.seq // self.P, self.heads // self.P
        for name, value in weights.items():
            setattr(self, name, torch.nn.Parameter(torch.as_tensor(value, dtype=dtype).clone()))
        for name in ("b_q", "b_kvb", "b_o"):
            if name not in weights:
                setattr(self, name, None)
        # RoPE tables at this rank's global positions, and the causal mask (True = masked), computed once.
        positions = torch.arange(self.rank * self.s, (self.rank + 1) * self.s, dtype=torch.float64)
        inv_freq = 10000.0 ** (-torch.arange(0, self.rope, 2, dtype=torch.float64) / self.rope)
        angles = torch.outer(positions, inv_freq)
        angles = torch.cat((angles, angles), dim=-1)  # [s, dr] as [f, f]
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)
        self.mask = torch.ones(self.seq, self.seq, dtype=torch.bool).triu(1)
        softmax_scale = cfg.get("softmax_scale", 0.0)
        self.scale = softmax_scale if softmax_scale > 0 else 1.0 / math.sqrt(self.nope + self.rope)

    def forward(self, x):
        B, s, H, h = x.shape[0], self.s, self.heads, self.h
        dn, dr, dv, R = self.nope, self.rope, self.vdim, self.latent
        if self.q_lora:  # DeepSeek's q_a_proj, q_a_layernorm, q_b_proj
            cq = rms_norm(F.linear(x, self.w_qa), self.g_q, 1e-6)
            q = F.linear(cq, self.w_qb, self.b_q).view(B, s, H, dn + dr)
        else:
            q = F.linear(x, self.w_q, self.b_q).view(B, s, H, dn + dr)
        q_nope, q_pe = q.split([dn, dr], dim=-1)
        q = torch.cat((q_nope, apply_rope(q_pe, self.cos[:, None, :], self.sin[:, None, :])), dim=-1)
        c, k_pe = F.linear(x, self.w_kva).split([R, dr], dim=-1)
        c = rms_norm(c, self.g_kv, 1e-6)
        k_pe = apply_rope(k_pe, self.cos, self.sin)  # [B, s, dr], one key shared by the heads

        if self.strategy == "latent":
            payload = GatherSequence.apply(torch.cat((c, k_pe), dim=-1), self.reduce_scatter)  # [B, S, R + dr]
            c_all, k_pe_all = payload.split([R, dr], dim=-1)
            rows = slice(self.rank * h * (dn + dv), (self.rank + 1) * h * (dn + dv))  # this rank's heads
            bias = None if self.b_kvb is None else self.b_kvb[rows]
            kv = F.linear(c_all, self.w_kvb[rows], bias).view(B, self.seq, h, dn + dv)
            k_nope, v = kv.split([dn, dv], dim=-1)
            k = torch.cat((k_nope, k_pe_all[:, :, None, :].expand(B, self.seq, h, dr)), dim=-1)
            q = TokensToHeads.apply(q)
        else:
            kv = F.linear(c, self.w_kvb, self.b_kvb).view(B, s, H, dn + dv)
            k_nope, v = kv.split([dn, dv], dim=-1)
            k = torch.cat((k_nope, k_pe[:, :, None, :].expand(B, s, H, dr)), dim=-1)
            q, k, v = TokensToHeads.apply(q), TokensToHeads.apply(k), TokensToHeads.apply(v)

        o = causal_attention(q, k, v, self.mask, self.scale)  # [B, S, h, dv]
        o = HeadsToTokens.apply(o).reshape(B, s, H * dv)
        return F.linear(o, self.w_o, self.b_o)


def weight_shapes(cfg, bias):
    H, D, dqk, Rq = cfg["heads"], cfg["hidden"], cfg["nope"] + cfg["rope"], cfg.get("q_lora", 0)
    query = {"w_qa": (Rq, D), "g_q": (Rq,), "w_qb": (H * dqk, Rq)} if Rq else {"w_q": (H * dqk, D)}
    shapes = {**query, "w_kva": (cfg["latent"] + cfg["rope"], D), "g_kv": (cfg["latent"],),
              "w_kvb": (H * (cfg["nope"] + cfg["vdim"]), cfg["latent"]), "w_o": (D, H * cfg["vdim"])}
    if bias:
        shapes.update({"b_q": (H * dqk,), "b_kvb": (H * (cfg["nope"] + cfg["vdim"]),), "b_o": (D,)})
    return shapes


def synthetic_weights(cfg, bias, seed):
    """nn.Linear-like initialisation (uniform in +-1/sqrt(fan_in)); the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in weight_shapes(cfg, bias).items():
        if name in ("g_kv", "g_q"):
            weights[name] = 1.0 + 0.2 * (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1)
            continue
        fan_in = {"w_q": cfg["hidden"], "w_qa": cfg["hidden"], "w_qb": cfg.get("q_lora", 0), "w_kva": cfg["hidden"],
                  "w_kvb": cfg["latent"], "w_o": cfg["heads"] * cfg["vdim"]}.get(name)
        scale = 1.0 / math.sqrt(fan_in) if fan_in else 0.1
        weights[name] = scale * (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1)
    return weights


def mla_flops(cfg, P):
    """FLOPs per rank of one forward and backward: the counts of include/mlacp/mla/flop_count.hpp."""
    B, S, D, H = cfg["batch"], cfg["seq"], cfg["hidden"], cfg["heads"]
    dn, dr, dv, R = cfg["nope"], cfg["rope"], cfg["vdim"], cfg["latent"]
    dqk, N, h, Rq = dn + dr, B * S / P, H / P, cfg.get("q_lora", 0)
    E = B * h * S * (S + 1) / 2
    q_proj = 2 * N * (D * Rq + Rq * H * dqk) if Rq else 2 * N * D * H * dqk
    proj = q_proj + 2 * N * D * (R + dr) + 2 * N * R * H * (dn + dv) + 2 * N * H * dv * D
    f = {"projections_forward_flops": proj, "projections_backward_flops": 2 * proj,
         "attention_forward_flops": 2 * E * (dqk + dv), "attention_backward_flops": 2 * E * (3 * dqk + 2 * dv)}
    f["forward_flops"] = proj + f["attention_forward_flops"]
    f["backward_flops"] = 2 * proj + f["attention_backward_flops"]
    f["total_flops"] = f["forward_flops"] + f["backward_flops"]
    return f


# ---- running under MPI ----------------------------------------------------------------------------------------------


def init_distributed(comm, timeout_s):
    """gloo process group on the MPI world: rank 0 picks a free TCP port and broadcasts it with MPI. The store is
    127.0.0.1 when every rank is on rank 0's host, else rank 0's host name (or MASTER_ADDR when set)."""
    host = socket.gethostname()
    hosts = comm.allgather(host)
    addr = os.environ.get("MASTER_ADDR") or ("127.0.0.1" if len(set(hosts)) == 1 else hosts[0])
    port = None
    if comm.rank == 0:
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=comm.rank, world_size=comm.size,
                            timeout=timedelta(seconds=timeout_s))


def peak_rss_bytes():
    """This process's resident high-water mark (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes():
    """This process's resident memory now (/proc/self/statm, Linux), for the baseline of torch + gloo."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def is_out_of_memory(error):
    if isinstance(error, MemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower()
                                                or "Cannot allocate memory" in text)


class OutOfMemory(Exception):
    """An allocation failed on at least one rank (the message says where)."""


def agree_on_failure(comm, failure, deadline_s, on_abort=None):
    """All ranks learn whether any rank failed. A rank that failed may find the others stuck in a gloo collective it
    will never join; it then waits at most `deadline_s` for them, calls on_abort(failure) (the report) and ends the
    job with MPI_Abort."""
    result = np.zeros(1, np.int32)
    request = comm.Iallreduce(np.array([1 if failure else 0], dtype=np.int32), result, op=MPI.MAX)
    start = time.monotonic()
    while not request.Test():
        if failure and time.monotonic() - start > deadline_s:
            print(f"ulysses-mla-torch: rank {comm.rank}: out of memory ({failure}); the other ranks are stuck in a "
                  "collective, aborting the job", file=sys.stderr, flush=True)
            if on_abort:
                on_abort(failure)
            comm.Abort(EXIT_OOM)
        time.sleep(0.001)
    return bool(result[0])


def run_step(comm, body, deadline_s, on_abort=None):
    """Runs body() on every rank; an allocation failure on any rank becomes OutOfMemory on every rank (or, where the
    other ranks cannot be reached, on_abort and MPI_Abort: see agree_on_failure)."""
    failure = None
    try:
        body()
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        failure = str(error).splitlines()[0][:200]
    if agree_on_failure(comm, failure, deadline_s, on_abort):
        messages = [m for m in comm.allgather(failure) if m]
        raise OutOfMemory(messages[0])


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", metavar="DIR", help="check against an mlacp-mla-block --dump DIR (PASS/FAIL)")
    for name, default in (("batch", 2), ("seq", 32), ("hidden", 48), ("heads", 4), ("nope", 8), ("rope", 4),
                          ("vdim", 6), ("latent", 12)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--q-lora", type=int, default=0, metavar="R",
                   help="q_lora_rank: the query through w_qa [R, D], RMSNorm g_q, w_qb [H*dqk, R] (0: dense w_q)")
    p.add_argument("--softmax-scale", type=float, default=0.0,
                   help="the attention's softmax scale (0, the default: 1/sqrt(nope + rope))")
    p.add_argument("--strategy", choices=("latent", "expanded"), default="latent")
    p.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                   help="double (default), float, or bf16 (torch.bfloat16 parameters and activations); with --check: "
                        "run the peer in this dtype instead of the dump's (bf16 checked at 2e-2)")
    p.add_argument("--bias", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--iters", type=int, default=1, help="timed iterations (default 1)")
    p.add_argument("--warmup", type=int, default=0, help="untimed iterations first (default 0, as mlacp-mla-block)")
    p.add_argument("--json", metavar="FILE", help="write the result as JSON")
    p.add_argument("--reduce-scatter", choices=("alltoall", "allreduce"), default="alltoall",
                   help="emulation of the latent payload gradient's reduce-scatter (default alltoall)")
    p.add_argument("--timeout", type=float, default=600, help="gloo collective timeout, seconds")
    p.add_argument("--oom-deadline", type=float, default=60,
                   help="how long a rank that ran out of memory waits for the others before aborting the job")
    p.add_argument("--transport-label", default="", help="recorded in the JSON (e.g. shm, tcp-lo)")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        p.error("--iters must be at least 1 and --warmup at least 0")
    if args.q_lora < 0 or args.softmax_scale < 0:
        p.error("--q-lora and --softmax-scale must not be negative")
    if args.dtype is None and not args.check:
        args.dtype = "double"
    return args


def write_json(path, doc):
    """Atomic (rename): in an out-of-memory abort every failing rank may write the same file."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as out:
        json.dump(doc, out, indent=1)
        out.write("\n")
    os.replace(tmp, path)


def relative_error(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return math.inf
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def check(args, comm):
    """Loads a dump, runs the peer on this group with the dump's x and dy sharded, compares on rank 0."""
    d = Path(args.check)
    cfg_json = json.loads((d / "config.json").read_text())
    if (d / "cu_seqlens.npy").exists():
        raise SystemExit("ulysses-mla-torch: packed sequences (cu_seqlens.npy) are not supported by the peer")
    cfg = {"batch": cfg_json["batch"], "seq": cfg_json["seq"], "hidden": cfg_json["hidden"],
           "heads": cfg_json["heads"], "nope": cfg_json["qk_nope_head_dim"], "rope": cfg_json["qk_rope_head_dim"],
           "vdim": cfg_json["v_head_dim"], "latent": cfg_json["kv_lora_rank"],
           "q_lora": int(cfg_json.get("q_lora_rank", 0) or 0),
           "softmax_scale": float(cfg_json.get("softmax_scale", 0.0) or 0.0)}
    strategy, bias = cfg_json["strategy"], cfg_json["bias"]
    # The peer runs in --dtype where given (e.g. bf16 against a float or double dump), else in the dump's dtype
    # (a bf16 dump of mlacp-mla-block holds float arrays, docs/spec.md).
    dtype_name = args.dtype or {"bfloat16": "bf16"}.get(cfg_json["dtype"], cfg_json["dtype"])
    if dtype_name not in DTYPES:
        raise SystemExit(f"ulysses-mla-torch: the dump's dtype {cfg_json['dtype']!r} is not one of {tuple(DTYPES)}")
    dtype = DTYPES[dtype_name]
    P, rank = comm.size, comm.rank
    if cfg_json.get("ranks", P) != P and rank == 0:
        print(f"ulysses-mla-torch: note: the dump was written at P={cfg_json['ranks']}, checking at P={P} "
              "(the numbers do not depend on P)")
    weights = {name: np.load(d / f"{name}.npy") for name in weight_shapes(cfg, bias)}
    model = UlyssesMLA(cfg, weights, dtype, strategy, args.reduce_scatter)
    s = cfg["seq"] // P
    tokens = slice(rank * s, (rank + 1) * s)
    x = torch.tensor(np.load(d / "x.npy")[:, tokens], dtype=dtype, requires_grad=True)
    dy = torch.tensor(np.load(d / "dy.npy")[:, tokens], dtype=dtype)
    y = model(x)
    y.backward(dy)

    # Rank 0 assembles y and dx in global token order and sums the weight gradients over the ranks.
    got = {}
    for name, local in (("y", y.detach()), ("dx", x.grad)):
        parts = comm.gather(local.double().numpy(), root=0)  # numpy has no bf16
        if rank == 0:
            got[name] = np.concatenate(parts, axis=1)
    for name in weight_shapes(cfg, bias):
        grad = getattr(model, name).grad
        local = np.zeros(getattr(model, name).shape) if grad is None else grad.double().numpy()
        total = np.zeros_like(local) if rank == 0 else None
        comm.Reduce(local, total, op=MPI.SUM, root=0)
        if rank == 0:
            got["d" + name] = total
    verdict = 0
    if rank == 0:
        tolerance = TOLERANCE[dtype_name]
        print(f"ulysses-mla-torch --check {d}: B={cfg['batch']} S={cfg['seq']} D={cfg['hidden']} H={cfg['heads']} "
              f"dn={cfg['nope']} dr={cfg['rope']} dv={cfg['vdim']} R={cfg['latent']} Rq={cfg['q_lora']} "
              f"softmax_scale={cfg['softmax_scale']:g} bias={'yes' if bias else 'no'} "
              f"strategy={strategy} dtype={dtype_name} P={P}"
              + (f" (dump: {cfg_json['dtype']})" if dtype_name != cfg_json["dtype"] else ""))
        if dtype == torch.bfloat16:
            print(f"  gloo payload: {_WireBytes.describe(dtype)}")
        print(f"  relative error vs the dump (tolerance {tolerance:g}):")
        worst = 0.0
        for name, values in got.items():
            e = relative_error(values, np.load(d / f"{name}.npy"))
            worst = max(worst, e)
            print(f"    {name:7s}{e:.3e}{'' if e <= tolerance else '   <-- above tolerance'}")
        verdict = 0 if worst <= tolerance else 1
        print(f"{'PASS' if verdict == 0 else 'FAIL'} (max relative error {worst:.3e})", flush=True)
    return comm.bcast(verdict, root=0)


def gemm_rate(cfg, P, dtype, comm):
    """torch's rate for q_proj's forward GEMM ([B*s, D] x [D, H*dqk]), measured as mlacp-mla-block measures its own:
    every rank at once, barrier, max over ranks, median of 5 after one untimed call."""
    m, k, n = cfg["batch"] * cfg["seq"] // P, cfg["hidden"], cfg["heads"] * (cfg["nope"] + cfg["rope"])
    a, b, c = torch.rand(m, k, dtype=dtype), torch.rand(n, k, dtype=dtype), torch.empty(m, n, dtype=dtype)
    times = []
    for it in range(6):
        comm.Barrier()
        start = time.perf_counter()
        torch.mm(a, b.t(), out=c)  # into a kept buffer: the GEMM, not a fresh allocation's page faults
        t = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if it:
            times.append(t)
    return 2.0 * m * k * n / float(np.median(times)), f"[{m} x {k}] x [{k} x {n}]"


def timing(args, comm):
    """The timing mode: synthetic weights and inputs, mlacp-mla-block's protocol, text + machine-readable line."""
    cfg = {k: getattr(args, k) for k in ("batch", "seq", "hidden", "heads", "nope", "rope", "vdim", "latent", "q_lora",
                                         "softmax_scale")}
    dtype, P, rank = DTYPES[args.dtype], comm.size, comm.rank
    doc = {"tool": "ulysses-mla-torch", "status": "ok", "torch": torch.__version__, "backend": "gloo",
           "transport": args.transport_label,
           "config": {"B": args.batch, "S": args.seq, "D": args.hidden, "H": args.heads, "dn": args.nope,
                      "dr": args.rope, "dv": args.vdim, "R": args.latent, "Rq": args.q_lora,
                      "softmax_scale": args.softmax_scale, "bias": args.bias},
           "P": P, "dtype": args.dtype, "element_bytes": torch.tensor([], dtype=dtype).element_size(),
           "strategy": args.strategy, "reduce_scatter": args.reduce_scatter,
           "warmup": args.warmup, "iters": args.iters,
           "protocol": "per iteration: barrier, forward + backward, time = max over ranks; median"}
    flops = mla_flops(cfg, P)
    state, times, gemm = {}, [], {}
    # What the process holds before the layer exists (the torch library, gloo, MPI): most of a small run's peak.
    doc["baseline_rss_bytes"] = comm.allreduce(current_rss_bytes(), op=MPI.MAX)

    def setup():
        gemm["rate"], gemm["shape"] = gemm_rate(cfg, P, dtype, comm)
        state["model"] = UlyssesMLA(cfg, synthetic_weights(cfg, args.bias, args.seed), dtype, args.strategy,
                                    args.reduce_scatter)
        gen = torch.Generator().manual_seed(args.seed + 100 + 7919 * rank)
        shape = (args.batch, args.seq // P, args.hidden)
        state["x"] = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype).requires_grad_()
        state["dy"] = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1).to(dtype)

    def iteration():
        model, x = state["model"], state["x"]
        for p in model.parameters():
            p.grad = None  # set_to_none, outside the timed region: every iteration writes fresh gradients
        x.grad = None
        comm.Barrier()
        start = time.perf_counter()
        model(x).backward(state["dy"])
        state["t"] = time.perf_counter() - start

    def report_alone(failure):
        """The out-of-memory report of a rank that cannot reach the others (it is about to abort the job)."""
        state.clear()
        doc.update(status="out of memory", error=failure, peak_rss_bytes=peak_rss_bytes(),
                   note=f"rank {rank} alone: the other ranks were stuck in a collective; its own peak memory")
        print(f"RESULT tool=ulysses-mla-torch status=oom strategy={args.strategy} dtype={args.dtype} P={P} "
              f"S={args.seq} peak_rss_mib={doc['peak_rss_bytes'] / 2**20:.1f}", flush=True)
        if args.json:
            write_json(args.json, doc)

    try:
        run_step(comm, setup, args.oom_deadline, report_alone)
        for it in range(args.warmup + args.iters):
            run_step(comm, iteration, args.oom_deadline, report_alone)
            t = comm.allreduce(state["t"], op=MPI.MAX)
            if it >= args.warmup:
                times.append(t)
    except OutOfMemory as error:
        doc.update(status="out of memory", error=str(error))
    state.clear()
    peak = comm.allreduce(peak_rss_bytes(), op=MPI.MAX)
    doc["peak_rss_bytes"] = peak
    doc["gloo_payload"] = _WireBytes.describe(dtype)
    label = (f"B={args.batch} S={args.seq} D={args.hidden} H={args.heads} dn={args.nope} dr={args.rope} "
             f"dv={args.vdim} R={args.latent} Rq={args.q_lora} softmax_scale={args.softmax_scale:g} "
             f"bias={'yes' if args.bias else 'no'} strategy={args.strategy} "
             f"dtype={args.dtype} P={P}")
    if rank == 0:
        print(f"ulysses-mla-torch: {label} (torch {torch.__version__}, gloo, reduce-scatter {args.reduce_scatter}"
              + (f", payload {doc['gloo_payload']})" if dtype == torch.bfloat16 else ")"))
    if doc["status"] != "ok":
        if rank == 0:
            print(f"  out of memory: {doc['error']}\n  peak resident memory (max over ranks): {peak / 2**20:.4g} MiB")
            print(f"RESULT tool=ulysses-mla-torch status=oom strategy={args.strategy} dtype={args.dtype} P={P} "
                  f"S={args.seq} peak_rss_mib={peak / 2**20:.1f}", flush=True)
            if args.json:
                write_json(args.json, doc)
        return EXIT_OOM
    median, fastest = sorted(times)[len(times) // 2], min(times)  # mlacp-mla-block's median (the upper one if even)
    fraction = flops["total_flops"] / gemm["rate"] / median
    doc.update(time_median_s=median, time_min_s=fastest, times_s=times,
               roofline=dict(flops, gemm_rate_flops_per_s=gemm["rate"], gemm_shape=gemm["shape"],
                             flop_rate_per_s=flops["total_flops"] / median, fraction_of_gemm_rate=fraction))
    if rank == 0:
        print(f"  iteration time (max over ranks): median {median * 1e3:.4g} ms, min {fastest * 1e3:.4g} ms over "
              f"{args.iters} iteration(s) after {args.warmup} warm-up")
        print(f"  peak resident memory (max over ranks): {peak / 2**20:.4g} MiB "
              f"({doc['baseline_rss_bytes'] / 2**20:.4g} MiB before the layer: torch, gloo, MPI)")
        print(f"  roofline per rank: forward {flops['forward_flops'] * 1e-9:.4g} GFLOP, backward "
              f"{flops['backward_flops'] * 1e-9:.4g} GFLOP; torch GEMM rate {gemm['rate'] * 1e-9:.4g} GFLOP/s "
              f"({gemm['shape']}, {args.dtype}); fraction of torch's GEMM rate {fraction:.3f}")
        print(f"RESULT tool=ulysses-mla-torch status=ok strategy={args.strategy} dtype={args.dtype} P={P} "
              f"S={args.seq} median_ms={median * 1e3:.3f} min_ms={fastest * 1e3:.3f} "
              f"peak_rss_mib={peak / 2**20:.1f} gflops={flops['total_flops'] / median * 1e-9:.3f}", flush=True)
        if args.json:
            write_json(args.json, doc)
            print(f"  wrote {args.json}")
    return 0


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    init_distributed(comm, args.timeout)
    try:
        if args.check:
            return check(args, comm)
        return timing(args, comm)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
