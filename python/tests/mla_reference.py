# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Test support: docs/spec.md in plain PyTorch on one process and the full sequence (the reference the distributed layer
is checked against), and the helpers that move tensors between the ranks with mpi4py."""
import math

import torch
import torch.nn.functional as F
from mpi4py import MPI

import mlacp


def rope_frequencies(config, dr):
    """docs/spec.md step 4's inv_freq [dr/2] (float64) and the factor on cos and sin, from the config's rope_base and
    YaRN rows, written out here from the spec's formulas."""
    base = config.rope_base
    inv_freq = base**(-torch.arange(0, dr, 2, dtype=torch.float64) / dr)
    f = config.rope_factor
    if f == 1.0:
        return inv_freq, 1.0
    L0 = config.rope_original_max_position

    def corr(rotations):
        return dr * math.log(L0 / (2 * math.pi * rotations)) / (2 * math.log(base))

    lo = max(math.floor(corr(config.rope_beta_fast)), 0)
    hi = min(math.ceil(corr(config.rope_beta_slow)), dr - 1)
    if lo == hi:
        hi += 0.001
    ramp = ((torch.arange(dr // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
    inv_freq = inv_freq / f * ramp + inv_freq * (1 - ramp)

    def g(m):
        return 0.1 * m * math.log(f) + 1.0 if f > 1 else 1.0

    m, m_all = config.rope_mscale, config.rope_mscale_all_dim
    if config.rope_attention_factor > 0:
        amplitude = config.rope_attention_factor
    elif m != 0 and m_all != 0:
        amplitude = g(m) / g(m_all)
    else:
        amplitude = g(1.0)
    return inv_freq, amplitude


def rope(t, positions, config):
    """Rotate-half RoPE of t [..., S, (heads,) dr] at `positions` [S] (docs/spec.md step 4, with the config's base and
    YaRN scaling); t's dim -2 or -3 is S."""
    dr = t.shape[-1]
    inv_freq, amplitude = rope_frequencies(config, dr)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos = (amplitude * torch.cat([angles.cos(), angles.cos()], -1)).to(t.dtype)
    sin = (amplitude * torch.cat([angles.sin(), angles.sin()], -1)).to(t.dtype)
    if t.dim() == 4:  # [B, S, H, dr]: one angle per token, shared by the heads
        cos, sin = cos[:, None, :], sin[:, None, :]
    half = dr // 2
    rotated = torch.cat([-t[..., half:], t[..., :half]], -1)
    return t * cos + rotated * sin


def mla_forward(config, x, p):
    """y [B, S, D] of docs/spec.md for the full sequence x [B, S, D] and weights p {name: tensor} (biases optional).
    The two schedules (latent, expanded) compute these same numbers; this is the single-process definition."""
    B, S, _ = x.shape
    H, dn, dr, dv, R = config.heads, config.nope, config.rope, config.vdim, config.latent
    # Packed documents (config.cu_seqlens, docs/spec.md steps 4 and 6): positions restart at each document's start and
    # a token attends only to earlier tokens of its own document. Empty: one document.
    offsets = list(config.cu_seqlens) or [0, S]
    document = torch.repeat_interleave(torch.arange(len(offsets) - 1), torch.tensor(offsets).diff())
    positions = torch.arange(S) - torch.tensor(offsets[:-1])[document]
    if "w_qa" in p:  # step 1 with q-LoRA (config.q_lora_rank > 0): RMSNorm of the query latent, then w_qb
        cq = F.linear(x, p["w_qa"])
        cq = cq * torch.rsqrt(cq.pow(2).mean(-1, keepdim=True) + config.rms_eps) * p["g_q"]
        q = F.linear(cq, p["w_qb"], p.get("b_q")).view(B, S, H, dn + dr)
    else:
        q = F.linear(x, p["w_q"], p.get("b_q")).view(B, S, H, dn + dr)  # step 1
    q = torch.cat([q[..., :dn], rope(q[..., dn:], positions, config)], -1)  # step 4 on q_pe
    a = F.linear(x, p["w_kva"])  # step 2
    c, k_pe = a[..., :R], a[..., R:]
    c = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + config.rms_eps) * p["g_kv"]  # step 3
    k_pe = rope(k_pe, positions, config)  # step 4 on the shared key
    kv = F.linear(c, p["w_kvb"], p.get("b_kvb")).view(B, S, H, dn + dv)  # step 5
    k = torch.cat([kv[..., :dn], k_pe[:, :, None, :].expand(B, S, H, dr)], -1)
    v = kv[..., dn:]
    scale = config.softmax_scale if config.softmax_scale > 0 else 1.0 / math.sqrt(dn + dr)
    scores = torch.einsum("bshd,bthd->bhst", q, k) * scale  # step 6, causal
    causal = torch.ones(S, S, dtype=torch.bool).tril() & (document[:, None] == document[None, :])
    attention = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    o = torch.einsum("bhst,bthd->bshd", attention, v).reshape(B, S, H * dv)
    return F.linear(o, p["w_o"], p.get("b_o"))  # step 7


def reference(config, layer, x_full, dy_full):
    """y, dx and the weight gradients {name: tensor} of the reference in double, for `layer`'s weights (cast to
    double), x_full and dy_full: what the distributed layer's outputs must match (weight gradients summed over ranks)."""
    params = {n: p.detach().to(torch.float64).requires_grad_() for n, p in layer.named_parameters()}
    x = x_full.detach().to(torch.float64).requires_grad_()
    y = mla_forward(config, x, params)
    y.backward(dy_full.to(torch.float64))
    return y.detach(), x.grad, {n: p.grad for n, p in params.items()}


def relative_error(got, expected):
    """Relative Frobenius error ||got - expected|| / ||expected|| (docs/spec.md's measure), computed in double."""
    got, expected = got.detach().to(torch.float64), expected.detach().to(torch.float64)
    return float((got - expected).norm() / expected.norm().clamp_min(1e-300))


def tolerance(dtype):
    return 1e-10 if dtype == torch.float64 else 1e-4


def shard(t, rank, size, dim=1):
    """Rank `rank`'s contiguous shard of `t` along `dim` (docs/spec.md: rank r holds tokens [r*s, (r+1)*s))."""
    s = t.shape[dim] // size
    return t.narrow(dim, rank * s, s).contiguous()


def gather(comm, t, dim=1):
    """The shards of all ranks, concatenated in rank order along `dim` (every rank gets the full tensor)."""
    return torch.cat([torch.from_numpy(a) for a in comm.allgather(t.detach().numpy())], dim)


class Replicate(torch.autograd.Function):
    """Identity on a tensor every rank holds the same copy of; backward sums the gradient over the ranks (the
    adjoint of replication), so that a function of replicated inputs has the global gradient on every rank."""

    @staticmethod
    def forward(ctx, comm, t):
        ctx.comm = comm
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        out = g.contiguous().clone()
        ctx.comm.Allreduce(MPI.IN_PLACE, out.numpy())
        return None, out


class AllGather(torch.autograd.Function):
    """The full tensor from the shards along `dim`; backward keeps this rank's shard of the (identical on every
    rank) gradient."""

    @staticmethod
    def forward(ctx, comm, t, dim):
        ctx.comm, ctx.dim, ctx.shape = comm, dim, t.shape
        return gather(comm, t, dim)

    @staticmethod
    def backward(ctx, g):
        return None, shard(g, ctx.comm.rank, ctx.comm.size, ctx.dim), None


def distributed_function(layer, comm):
    """f(x_full, *parameters) -> y_full: the whole distributed layer as one function of replicated inputs (each
    rank runs its shard; y is gathered), for torch.autograd.gradcheck run in lockstep on every rank."""

    def f(x_full, *params):
        x_local = shard(Replicate.apply(comm, x_full), comm.rank, comm.size)
        params = [Replicate.apply(comm, p) for p in params]
        y_local = mlacp.attention._MlaFunction.apply(layer, None, x_local, *params)  # None: the configured packing
        return AllGather.apply(comm, y_local, 1)

    return f
