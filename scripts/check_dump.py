#!/usr/bin/env python3
"""Loads an mlacp-mla-block --dump directory with numpy and checks it against docs/spec.md, independently of mlacp.

usage: check_dump.py DIR   (exit 0 when every check passes)

1. Every file loads with docs/spec.md's dtype and shape, and holds finite values.
2. y equals docs/spec.md's forward recomputed here in float64 numpy from the dumped x and weights (full sequence, one
   process), within docs/spec.md's tolerance (1e-10 double, 1e-4 float, 2e-2 bf16 or a bf16 wire). With
   cu_seqlens.npy (int64, packed documents; written by --cu-seqlens) the RoPE positions restart at each document's
   start (step 4) and attention is causal within a document only (step 6), the same for every batch row.
   With q-LoRA (config.json's q_lora_rank > 0) the query is factored (w_qa, g_q, w_qb in place of w_q, docs/spec.md
   step 1), and a positive softmax_scale replaces 1/sqrt(dqk) (step 6); both keys default to 0 when absent (dumps
   of tools that predate them). RoPE takes config.json's rope_base and YaRN scaling (rope_factor > 1, step 4).
3. Every gradient (dx and each weight's) is checked against finite differences of L = sum(y * dy) of that numpy
   forward along a random direction u: |(L(p + h u) - L(p - h u)) / 2h - <grad, u>| <= tol * |grad| |u|.
"""
import json
import sys
from pathlib import Path

import numpy as np


def document_starts(S, cu_seqlens):
    """start_of(t) for every token t: the first token of t's document (0 for all without cu_seqlens)."""
    if cu_seqlens is None:
        return np.zeros(S, dtype=np.int64)
    doc = np.searchsorted(cu_seqlens, np.arange(S), side="right") - 1
    return cu_seqlens[doc]


def mla_forward(p, x, c, cu_seqlens=None):
    """docs/spec.md steps 1-7 on the full sequence in float64 (P = 1): y [B, S, D]; packed documents with cu_seqlens."""
    B, S, _ = x.shape
    starts = document_starts(S, cu_seqlens)
    positions = np.arange(S) - starts
    H, dn, dr, dv, R = c["heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    dqk = dn + dr
    eps = c.get("rms_eps", 1e-6)
    if "w_qa" in p:  # q-LoRA: cq = RMSNorm(x w_qa^T) * g_q, q = cq w_qb^T + b_q
        cq = x @ p["w_qa"].T
        cq = cq / np.sqrt(np.mean(cq * cq, axis=-1, keepdims=True) + eps) * p["g_q"]
        q = (cq @ p["w_qb"].T + p.get("b_q", 0.0)).reshape(B, S, H, dqk)
    else:
        q = (x @ p["w_q"].T + p.get("b_q", 0.0)).reshape(B, S, H, dqk)
    a = x @ p["w_kva"].T
    lat, k_pe = a[..., :R], a[..., R:]
    lat = lat / np.sqrt(np.mean(lat * lat, axis=-1, keepdims=True) + eps) * p["g_kv"]
    inv_freq, amplitude = rope_frequencies(c, dr)
    angle = positions[:, None] * inv_freq[None, :]
    cos, sin = np.concatenate([np.cos(angle)] * 2, -1), np.concatenate([np.sin(angle)] * 2, -1)
    cos, sin = amplitude * cos, amplitude * sin

    def rot(t, cos_, sin_):
        half = t.shape[-1] // 2
        return t * cos_ + np.concatenate([-t[..., half:], t[..., :half]], -1) * sin_

    q = np.concatenate([q[..., :dn], rot(q[..., dn:], cos[:, None, :], sin[:, None, :])], -1)
    k_pe = rot(k_pe, cos, sin)
    kv = (lat @ p["w_kvb"].T + p.get("b_kvb", 0.0)).reshape(B, S, H, dn + dv)
    k = np.concatenate([kv[..., :dn], np.broadcast_to(k_pe[:, :, None, :], (B, S, H, dr))], -1)
    v = kv[..., dn:]
    scale = softmax_scale(c)
    scores = np.einsum("bihd,bjhd->bhij", q, k) * (scale if scale > 0 else 1.0 / np.sqrt(dqk))
    keys = np.arange(S)
    visible = (keys[None, :] <= keys[:, None]) & (keys[None, :] >= starts[:, None])  # causal, within the document
    scores = np.where(visible, scores, -np.inf)
    prob = np.exp(scores - scores.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    o = np.einsum("bhij,bjhd->bihd", prob, v).reshape(B, S, H * dv)
    return o @ p["w_o"].T + p.get("b_o", 0.0)


def rope_frequencies(c, dr):
    """docs/spec.md step 4: inv_freq [dr/2] and the factor on cos and sin, from config.json's rope_base and YaRN keys
    (rope_factor, rope_original_max_position, rope_beta_fast, rope_beta_slow, rope_mscale, rope_mscale_all_dim,
    rope_attention_factor; absent in dumps that predate them: plain RoPE of base 10000)."""
    base = float(c.get("rope_base", 10000.0))
    inv_freq = base ** (-2.0 * np.arange(dr // 2) / dr)
    f = float(c.get("rope_factor", 1.0))
    if f == 1.0:
        return inv_freq, 1.0
    L0 = float(c["rope_original_max_position"])

    def corr(rotations):
        return dr * np.log(L0 / (2 * np.pi * rotations)) / (2 * np.log(base))

    lo = max(np.floor(corr(float(c["rope_beta_fast"]))), 0.0)
    hi = min(np.ceil(corr(float(c["rope_beta_slow"]))), dr - 1.0)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dr // 2) - lo) / (hi - lo), 0.0, 1.0)
    inv_freq = inv_freq / f * ramp + inv_freq * (1 - ramp)

    def g(m):
        return 0.1 * m * np.log(f) + 1.0 if f > 1 else 1.0

    m, m_all, given = (float(c.get(k, 0.0)) for k in ("rope_mscale", "rope_mscale_all_dim", "rope_attention_factor"))
    amplitude = given if given > 0 else (g(m) / g(m_all) if m != 0 and m_all != 0 else g(1.0))
    return inv_freq, amplitude


def q_lora_rank(c):
    """config.json's q_lora_rank (0, the dense w_q, when the key is absent)."""
    return int(c.get("q_lora_rank", 0) or 0)


def softmax_scale(c):
    """config.json's softmax_scale (0, meaning 1/sqrt(dqk), when the key is absent)."""
    return float(c.get("softmax_scale", 0.0) or 0.0)


def weight_names(c):
    """The dumped weights of a configuration: w_qa, g_q, w_qb in place of w_q with q-LoRA; biases with bias."""
    query = ["w_qa", "g_q", "w_qb"] if q_lora_rank(c) > 0 else ["w_q"]
    return query + ["w_kva", "g_kv", "w_kvb", "w_o"] + (["b_q", "b_kvb", "b_o"] if c["bias"] else [])


def tolerance(c):
    """docs/spec.md's: 1e-10 double, 1e-4 float, 2e-2 for bf16 storage and for a float run with bf16 on the wire."""
    if c["dtype"] == "bf16" or c.get("wire_dtype", "same") != "same":
        return 2e-2
    return 1e-10 if c["dtype"] == "double" else 1e-4


def check_values(d, c):
    """Checks 2 and 3 of the module docstring; a list of problems."""
    tol = tolerance(c)
    names = weight_names(c)
    p = {n: np.load(d / f"{n}.npy").astype(np.float64) for n in names}
    x = np.load(d / "x.npy").astype(np.float64)
    dy = np.load(d / "dy.npy").astype(np.float64)
    cu_path = d / "cu_seqlens.npy"
    cu = np.load(cu_path) if cu_path.exists() else None
    problems = []
    if cu is not None:
        S = x.shape[1]
        if cu.dtype != np.int64 or cu.ndim != 1 or cu.size < 2 or cu[0] != 0 or cu[-1] != S or np.any(np.diff(cu) <= 0):
            return [f"cu_seqlens.npy: {cu.dtype}{cu.shape} {cu.tolist()}, expected int64 offsets 0 < ... < S = {S}"]
    y = np.load(d / "y.npy").astype(np.float64)
    want = mla_forward(p, x, c, cu)
    err = np.linalg.norm(y - want) / np.linalg.norm(want)
    if err > tol:
        problems.append(f"y differs from the numpy forward by {err:.3e} (tolerance {tol:g})")
    # Finite differences in float64 have a truncation error of about h^2 relative: compare the gradients at
    # max(tol, 1e-7) of |grad| |u|.
    fd_tol = max(tol, 1e-7)
    rng = np.random.default_rng(7)
    for n in ["x"] + names:
        grad = np.load(d / f"d{n}.npy").astype(np.float64)
        base = x if n == "x" else p[n]
        u = rng.standard_normal(base.shape)
        h = 1e-4 * max(np.linalg.norm(base), 1.0) / np.linalg.norm(u)

        def loss(shift):
            moved = base + shift * u
            if n == "x":
                return float(np.sum(mla_forward(p, moved, c, cu) * dy))
            return float(np.sum(mla_forward({**p, n: moved}, x, c, cu) * dy))

        fd = (loss(h) - loss(-h)) / (2 * h)
        analytic = float(np.sum(grad * u))
        err = abs(fd - analytic) / (np.linalg.norm(grad) * np.linalg.norm(u))
        if err > fd_tol:
            problems.append(f"d{n}: <grad, u> = {analytic:.6e}, finite differences {fd:.6e} (error {err:.3e})")
    return problems


def main(directory: str) -> int:
    d = Path(directory)
    c = json.loads((d / "config.json").read_text())
    B, S, D, H = c["batch"], c["seq"], c["hidden"], c["heads"]
    dn, dr, dv, R = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    # bf16 dumps are float32 files whose values are bf16's (docs/spec.md: they widen to float exactly).
    dtype = {"double": np.float64, "float": np.float32, "bf16": np.float32}[c["dtype"]]
    shapes = {
        "x": (B, S, D), "dy": (B, S, D), "y": (B, S, D), "dx": (B, S, D),
        "w_kva": (R + dr, D), "g_kv": (R,), "w_kvb": (H * (dn + dv), R), "w_o": (D, H * dv),
    }
    Rq = q_lora_rank(c)
    if Rq > 0:
        shapes.update({"w_qa": (Rq, D), "g_q": (Rq,), "w_qb": (H * (dn + dr), Rq)})
    else:
        shapes["w_q"] = (H * (dn + dr), D)
    if c["bias"]:
        shapes.update({"b_q": (H * (dn + dr),), "b_kvb": (H * (dn + dv),), "b_o": (D,)})
    for name in list(shapes):
        if name not in ("x", "dy", "y", "dx"):
            shapes["d" + name] = shapes[name]
    problems = []
    for name, shape in shapes.items():
        path = d / f"{name}.npy"
        if not path.exists():
            problems.append(f"{name}.npy missing")
            continue
        a = np.load(path)
        if a.dtype != dtype or a.shape != shape:
            problems.append(f"{name}.npy: {a.dtype}{a.shape}, expected {np.dtype(dtype)}{shape}")
        elif not np.all(np.isfinite(a)):
            problems.append(f"{name}.npy has non-finite values")
        elif c["dtype"] == "bf16" and not name.startswith(("dw", "db", "dg")):
            # Stored in bf16 (x, dy, y, dx, the weights): the low 16 bits of every float32 are zero. The weight
            # gradients are float (the library accumulates them in float).
            if np.any(a.view(np.uint32) & 0xFFFF):
                problems.append(f"{name}.npy holds values that are not bf16 (low 16 bits of a float32 set)")
    if not problems:
        problems += check_values(d, c)
    for p in problems:
        print("check_dump:", p)
    packed = "" if not (d / "cu_seqlens.npy").exists() else " (packed documents, cu_seqlens.npy)"
    packed += f" (q-LoRA, q_lora_rank={Rq})" if Rq > 0 else ""
    packed += f" (softmax_scale={softmax_scale(c):g})" if softmax_scale(c) > 0 else ""
    print(f"check_dump: {len(shapes)} tensors in {d}{packed}, y against a numpy forward, every gradient against finite "
          f"differences: {'OK' if not problems else 'FAILED'}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
