#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Tables of scripts/bench.sh's ring attention cells (issue 21), from the JSON files mlacp-mla-block wrote.

usage: ring_report.py RUNS_DIR OUT_DIR

RUNS_DIR holds one mlacp-mla-block --json per run, named
  balance_C<C>_<layout>.json              (the attention balance: S = 4096, small heads, P = 4, U = 4 / C)
  mesh_<U>x<C>_<strategy>_<transport>_r<round>.json   (bytes and times at the DeepSeek-like shape, zigzag;
                                                       transport "bytes": a run for its byte count, not timed)
A missing file is a run that failed (its .log is next to where the JSON would be).
Prints three tables (balance; bytes per rank per layer call, counted and from the formula, with the formula at
H = 128; times, median over the rounds of each run's median) and writes OUT_DIR/ring.json.
"""
import json
import re
import statistics
import sys
from pathlib import Path

FORMULA = (
    "elements per rank per forward + backward, s = S/P tokens per rank, c = S/C tokens per ring chunk, h = H/U heads "
    "per rank, dqk = dn + dr, L = R + dr; times the value type's size (the wire dtype; the ring's gradient "
    "accumulators in the accumulation type, float for bf16). "
    "Flat (C = 1) latent: B*(s*(2*H*dqk + 2*H*dv + L) + S*L) (Q, O, dO, dQ all-to-alls, payload all-gather, latent "
    "reduce-scatter). Flat expanded: B*s*H*4*(dqk + dv) (Q, K, V, O, dO, dQ, dK, dV all-to-alls). "
    "Ring latent: [U > 1] B*(s*H*2*(dqk + dv) + (s + c)*L) + B*c*L*(3*C - 2) (the Ulysses collectives in the group, "
    "then the payload chunk C - 1 times forward, C - 1 times again in the backward, and its gradient accumulator C "
    "times). Ring expanded: [U > 1] B*s*H*4*(dqk + dv) + B*c*h*(dqk + dv)*(3*C - 2) (K and V of the rank's heads, "
    "then dK and dV). [U > 1]: a group of one rank hands nothing to its Ulysses collectives."
)


def load(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"status": "failed"}


def formula_bytes(cfg, strategy, U, C, width, acc_width):
    """Bytes per rank: the ring's gradient accumulators (C of the 3*C - 2 chunk passes) in the accumulation type."""
    B, S, H = cfg["B"], cfg["S"], cfg["H"]
    dqk, dv, L = cfg["dn"] + cfg["dr"], cfg["dv"], cfg["R"] + cfg["dr"]
    P = U * C
    s, c, h = S / P, S / C, H / U
    if C == 1:
        if strategy == "latent":
            return width * B * (s * (2 * H * dqk + 2 * H * dv + L) + S * L)
        return width * B * s * H * 4 * (dqk + dv)
    group = 1 if U > 1 else 0
    passes = width * (2 * C - 2) + acc_width * C
    if strategy == "latent":
        return width * group * B * (s * H * 2 * (dqk + dv) + (s + c) * L) + B * c * L * passes
    return width * group * B * s * H * 4 * (dqk + dv) + B * c * h * (dqk + dv) * passes


def mib(x):
    return "%.2f" % (x / 2**20)


def main():
    runs, out = Path(sys.argv[1]), Path(sys.argv[2])
    report = {"formula": FORMULA}

    # ---- balance
    rows = []
    for path in sorted(runs.glob("balance_C*_*.json")):
        d = load(path)
        m = re.match(r"balance_C(\d+)_(\w+)\.json", path.name)
        C, layout = int(m.group(1)), m.group(2)
        ok = d.get("status") == "ok"
        rows.append({"C": C, "U": d.get("ulysses_size"), "layout": layout, "status": d.get("status"),
                     "pairs_max_over_min": d.get("attention_pairs_max_over_min") if ok else None,
                     "cpu_max_over_min": d.get("attention_cpu_max_over_min") if ok else None})
    rows.sort(key=lambda r: (r["C"], r["layout"]))
    report["balance"] = rows
    if rows:
        print("\nattention balance over the ranks, max/min (target <= 1.15 balanced):")
        print("  %-6s %-11s %18s %16s" % ("mesh", "layout", "pairs x heads", "attention CPU"))
        for r in rows:
            mesh = "%sx%d" % (r["U"], r["C"])
            if r["pairs_max_over_min"] is None:
                print("  %-6s %-11s %18s" % (mesh, r["layout"], r["status"]))
            else:
                print("  %-6s %-11s %18.3f %16.3f" % (mesh, r["layout"], r["pairs_max_over_min"],
                                                      r["cpu_max_over_min"]))

    # ---- bytes and times
    cells = {}
    for path in sorted(runs.glob("mesh_*.json")):
        m = re.match(r"mesh_(\d+)x(\d+)_(\w+?)_([\w-]+)_r(\d+)\.json", path.name)
        if not m:
            continue
        U, C, strategy, transport = int(m.group(1)), int(m.group(2)), m.group(3), m.group(4)
        cell = cells.setdefault((U, C, strategy, transport), {"times": [], "bytes": None, "config": None,
                                                              "predicted": []})
        d = load(path)
        if d.get("status") == "ok":
            cell["times"].append(d["time_median_s"])
            cell["bytes"] = d["collective_bytes_per_iteration"]
            cell["config"] = d["config"]
            cell["dtype"] = d["dtype"]
            if "predicted" in d:  # mlacp-mla-block --machine: the performance model's prediction of the run
                cell["predicted"].append(d["predicted"]["total_s"])
    size = {"double": 8, "float": 4, "bf16": 2}
    byte_rows = []
    seen = set()
    for (U, C, strategy, transport), cell in sorted(cells.items(), key=lambda kv: (kv[0][2], -kv[0][0])):
        if (U, C, strategy) in seen or cell["config"] is None:
            continue
        seen.add((U, C, strategy))
        cfg, width = cell["config"], size[cell["dtype"]]
        acc_width = 4 if cell["dtype"] == "bf16" else width
        at128 = dict(cfg, H=128)
        byte_rows.append({"mesh": "%dx%d" % (U, C), "strategy": strategy, "counted": cell["bytes"],
                          "formula": formula_bytes(cfg, strategy, U, C, width, acc_width),
                          "formula_H128": formula_bytes(at128, strategy, U, C, width, acc_width)})
    report["bytes"] = byte_rows
    if byte_rows:
        cfg = next(c["config"] for c in cells.values() if c["config"])
        dtype = next(c["dtype"] for c in cells.values() if c["config"])
        print("\nbytes per rank per layer call (forward + backward), %s, B=%d S=%d D=%d H=%d dn=%d dr=%d dv=%d R=%d, "
              "P = 4 (MiB):" % (dtype, cfg["B"], cfg["S"], cfg["D"], cfg["H"], cfg["dn"], cfg["dr"], cfg["dv"], cfg["R"]))
        print("  %-6s %-9s %14s %14s %16s" % ("mesh", "strategy", "counted", "formula", "formula H=128"))
        for r in byte_rows:
            print("  %-6s %-9s %14s %14s %16s" % (r["mesh"], r["strategy"], mib(r["counted"]), mib(r["formula"]),
                                                   mib(r["formula_H128"])))
        print("  formula: " + FORMULA)

    time_rows = []
    for (U, C, strategy, transport), cell in sorted(cells.items(), key=lambda kv: (kv[0][3], kv[0][2], -kv[0][0])):
        if transport == "bytes" or not cell["times"]:  # the cells run for their byte count only
            continue
        time_rows.append({"mesh": "%dx%d" % (U, C), "strategy": strategy, "transport": transport,
                          "times_s": cell["times"], "median_s": statistics.median(cell["times"]),
                          "model_s": statistics.median(cell["predicted"]) if cell["predicted"] else None})
    for r in time_rows:
        flat = [t for t in time_rows if t["mesh"].endswith("x1") and t["strategy"] == r["strategy"]
                and t["transport"] == r["transport"]]
        r["over_flat"] = r["median_s"] / flat[0]["median_s"] if flat else None
    report["times"] = time_rows
    if time_rows:
        print("\nforward + backward at that shape, zigzag, median over alternating rounds (each a run's median):")
        print("  %-9s %-6s %-9s %10s %9s %10s  %s" % ("transport", "mesh", "strategy", "median", "/ flat", "model",
                                                      "rounds (ms)"))
        for r in time_rows:
            print("  %-9s %-6s %-9s %8.0fms %9s %10s  %s" % (
                r["transport"], r["mesh"], r["strategy"], r["median_s"] * 1e3,
                "%.2f" % r["over_flat"] if r["over_flat"] else "-",
                "%.0fms" % (r["model_s"] * 1e3) if r["model_s"] else "-",
                " ".join("%.0f" % (t * 1e3) for t in r["times_s"])))
    (out / "ring.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
