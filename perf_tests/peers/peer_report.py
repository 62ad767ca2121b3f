#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Tables of scripts/bench.sh's mlacp-vs-peer runs, from the JSON files each run wrote.

usage: peer_report.py RUNS_DIR OUT_DIR

RUNS_DIR holds one JSON per run (mlacp-mla-block --json or ulysses_mla_torch.py --json), named
  cmp_<shape>_<strategy>_<dtype>_<transport>_<tool>.json   (the side-by-side comparison)
  sweep_S<S>_<strategy>_<dtype>_<tool>.json                  (the scaling sweep)
with <tool> mlacp or peer and <dtype> double, float or bf16. A missing file is a run that failed (its .log is next
to where the JSON would be). RUNS_DIR/cpu_bf16_caps.json (scripts/cpu_bf16_caps.py), where present, is printed
beside the bf16 cells and copied into the comparison's JSON as "cpu_bf16_caps".
Prints both tables and writes OUT_DIR/peer_comparison.json and OUT_DIR/peer_sweep.json.
"""
import json
import re
import sys
from pathlib import Path


def load(path):
    """The run's JSON, or {"status": "failed"} when the run left none (crash, or killed)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"status": "failed"}


def ms(doc):
    return doc["time_median_s"] * 1e3 if doc.get("status") == "ok" else None


def predicted_ms(doc):
    """The model's predicted forward + backward of an mlacp run (mlacp-mla-block --machine), ms; None without one."""
    p = doc.get("predicted") if doc.get("status") == "ok" else None
    return p["total_s"] * 1e3 if p else None


def cell(value, fmt, doc=None, width=10):
    """The formatted value; where there is none, the run's status (OOM, failed) when `doc` is given, else "-"."""
    if value is not None:
        return f"{value:{width}{fmt}}"
    if doc is None:
        return f"{'-':>{width}}"
    status = doc.get("status", "failed")
    return f"{'OOM' if status == 'out of memory' else status:>{width}}"


def pairs(runs, pattern):
    """{key tuple: {"mlacp": doc, "peer": doc}} for the files matching pattern (groups = key, last group = tool)."""
    found = {}
    for path in sorted(runs.glob("*.json")):
        m = re.fullmatch(pattern, path.name)
        if m:
            found.setdefault(m.groups()[:-1], {})[m.groups()[-1]] = path
    for logs in runs.glob("*.log"):  # a run that wrote a log but no JSON failed: keep it in the table
        m = re.fullmatch(pattern, logs.name[:-4] + ".json")
        if m:
            found.setdefault(m.groups()[:-1], {}).setdefault(m.groups()[-1], logs.with_suffix(".json"))
    return {key: {tool: load(p) for tool, p in tools.items()} for key, tools in found.items()}


def bf16_caps_line(caps):
    """One line of scripts/cpu_bf16_caps.py's JSON: the CPU and what its bf16 GEMMs dispatch to."""
    cpu, flags = caps.get("cpu", {}), caps.get("cpu", {}).get("flags", {})
    onednn, torch, blas = caps.get("onednn", {}), caps.get("torch") or {}, caps.get("openblas", {})
    yes = {True: "yes", False: "no"}
    return (f"bf16 cells on {cpu.get('model', 'unknown')}: "
            + ", ".join(f"{f} {yes.get(flags.get(f), '?')}" for f in ("avx512_bf16", "amx_bf16", "amx_tile"))
            + f"; oneDNN ISA {onednn.get('isa', 'n/a')}; torch bf16 matmul {torch.get('bf16_matmul_kernel') or 'n/a'}"
            + f"; OpenBLAS core {blas.get('core', 'n/a')}")


def comparison(runs):
    rows = []
    for (shape, strategy, dtype, transport), docs in sorted(pairs(runs, r"cmp_(\w+?)_(latent|expanded)_"
                                                                       r"(double|float|bf16)_([\w-]+?)_(mlacp|peer)"
                                                                       r"\.json").items()):
        mlacp, peer = docs.get("mlacp", {"status": "failed"}), docs.get("peer", {"status": "failed"})
        t_m, t_p = ms(mlacp), ms(peer)
        rows.append({
            "shape": shape, "strategy": strategy, "dtype": dtype, "transport": transport,
            "config": mlacp.get("config") or peer.get("config"),
            "mlacp_ms": t_m, "peer_ms": t_p, "peer_over_mlacp": t_p / t_m if t_m and t_p else None,
            "model_ms": predicted_ms(mlacp),
            "mlacp_fraction_of_gemm_rate": mlacp.get("roofline", {}).get("fraction_of_gemm_rate"),
            "mlacp_gemm_rate_flops_per_s": mlacp.get("roofline", {}).get("gemm_rate_flops_per_s"),
            "peer_fraction_of_torch_gemm_rate": peer.get("roofline", {}).get("fraction_of_gemm_rate"),
            "mlacp_status": mlacp.get("status"), "peer_status": peer.get("status"),
            "iters": mlacp.get("iters") or peer.get("iters"), "mlacp": mlacp, "peer": peer})
    if not rows:
        return rows
    print("\nmlacp-mla-block --no-reference vs the PyTorch peer (DeepSpeed-Ulysses style, gloo), forward + backward "
          "per iteration,\nmedian over iterations of the max over ranks; peer/mlacp > 1: mlacp is faster")
    print(f"{'shape':15s}{'strategy':10s}{'dtype':8s}{'transport':10s}{'mlacp ms':>10s}{'peer ms':>10s}"
          f"{'peer/mlacp':>12s}{'mlacp GEMM frac':>17s}{'peer torch-GEMM frac':>22s}{'model ms':>10s}")
    for r in rows:
        print(f"{r['shape']:15s}{r['strategy']:10s}{r['dtype']:8s}{r['transport']:10s}"
              f"{cell(r['mlacp_ms'], '.1f', r['mlacp'])}{cell(r['peer_ms'], '.1f', r['peer'])}"
              f"{cell(r['peer_over_mlacp'], '.2f', width=12)}{cell(r['mlacp_fraction_of_gemm_rate'], '.3f', width=17)}"
              f"{cell(r['peer_fraction_of_torch_gemm_rate'], '.3f', width=22)}{cell(r['model_ms'], '.1f')}")
    print("model ms: the performance model's prediction of the mlacp run (mlacp-mla-block --machine, the machine "
          "calibrated by mlacp-plan --calibrate on the same transport in this run)")
    print("GEMM frac: (FLOPs per rank / GEMM rate) / time, the GEMM ([B*s, D] x [D, H*dqk]) measured in the same run "
          "(mlacp: compat::gemm; peer: torch), in the row's dtype")
    if any(r["dtype"] == "bf16" for r in rows) and (runs / "cpu_bf16_caps.json").exists():
        print(bf16_caps_line(load(runs / "cpu_bf16_caps.json")))
    return rows


def sweep(runs):
    rows = []
    found = pairs(runs, r"sweep_S(\d+)_(latent|expanded)_(double|float|bf16)_(mlacp|peer)\.json")
    for (seq, strategy, dtype), docs in sorted(found.items(), key=lambda kv: (kv[0][2], int(kv[0][0]))):
        row = {"S": int(seq), "strategy": strategy, "dtype": dtype}
        for tool in ("mlacp", "peer"):
            doc = docs.get(tool, {"status": "failed"})
            t = ms(doc)
            flops = doc.get("roofline", {}).get("total_flops")
            if flops is None and doc.get("roofline"):
                flops = doc["roofline"]["forward_flops"] + doc["roofline"]["backward_flops"]
            row[tool] = {"status": doc.get("status"), "ms": t,
                         "gflop_per_s": flops / t * 1e-6 if t and flops else None,
                         "peak_rss_mib": doc["peak_rss_bytes"] / 2**20 if doc.get("peak_rss_bytes") else None,
                         "iters": doc.get("iters"), "warmup": doc.get("warmup"), "run": doc}
        rows.append(row)
    if not rows:
        return rows
    print("\nscaling sweep, P = 2, latent, shm (per rank: FLOP rate = mla_flops / time; peak RSS max over ranks, for an "
          "OOM run up to the failure;\nOOM = the peer's S x S scores did not fit the per-rank address-space limit)")
    print(f"{'S':>6s} {'dtype':7s}{'mlacp ms':>11s}{'GFLOP/s':>9s}{'RSS MiB':>9s}{'peer ms':>11s}{'GFLOP/s':>9s}"
          f"{'RSS MiB':>9s}{'iters':>7s}")
    for r in rows:
        m, p = r["mlacp"], r["peer"]
        print(f"{r['S']:6d} {r['dtype']:7s}{cell(m['ms'], '.1f', m['run'], 11)}{cell(m['gflop_per_s'], '.2f', width=9)}"
              f"{cell(m['peak_rss_mib'], '.0f', width=9)}{cell(p['ms'], '.1f', p['run'], 11)}"
              f"{cell(p['gflop_per_s'], '.2f', width=9)}{cell(p['peak_rss_mib'], '.0f', width=9)}"
              f"{m['iters'] or p['iters'] or 0:7d}")
    return rows


def main(runs_dir, out_dir):
    runs, out = Path(runs_dir), Path(out_dir)
    caps = runs / "cpu_bf16_caps.json"
    for name, rows in (("peer_comparison.json", comparison(runs)), ("peer_sweep.json", sweep(runs))):
        if rows:
            doc = {"rows": rows}
            if name == "peer_comparison.json" and caps.exists():
                doc["cpu_bf16_caps"] = load(caps)
            (out / name).write_text(json.dumps(doc, indent=1) + "\n")
            print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
