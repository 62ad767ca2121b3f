#!/usr/bin/env python3
"""Loads an mlacp-mla-block --dump directory with numpy and checks it against MLA_SPEC's dump format.

usage: check_dump.py DIR   (exit 0 when every file loads with the expected dtype and shape)
"""
import json
import sys
from pathlib import Path

import numpy as np


def main(directory: str) -> int:
    d = Path(directory)
    c = json.loads((d / "config.json").read_text())
    B, S, D, H = c["batch"], c["seq"], c["hidden"], c["heads"]
    dn, dr, dv, R = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    dtype = {"double": np.float64, "float": np.float32}[c["dtype"]]
    shapes = {
        "x": (B, S, D), "dy": (B, S, D), "y": (B, S, D), "dx": (B, S, D),
        "w_q": (H * (dn + dr), D), "w_kva": (R + dr, D), "g_kv": (R,), "w_kvb": (H * (dn + dv), R), "w_o": (D, H * dv),
    }
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
    # One number recomputed from the dump itself: the output projection's weight gradient is dy^T o, so its
    # bias gradient (when present) is the column sum of dy over every token.
    if c["bias"] and not problems:
        db_o = np.load(d / "db_o.npy").astype(np.float64)
        want = np.load(d / "dy.npy").astype(np.float64).sum(axis=(0, 1))
        err = np.linalg.norm(db_o - want) / np.linalg.norm(want)
        if err > (1e-10 if c["dtype"] == "double" else 1e-4):
            problems.append(f"db_o differs from the column sums of dy by {err:.3e}")
    for p in problems:
        print("check_dump:", p)
    print(f"check_dump: {len(shapes)} tensors in {d}: {'OK' if not problems else 'FAILED'}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
