#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp's attention core beside torch's math attention: joins mlacp-perf-attention's JSON and attention_torch.py's.

usage: attention_report.py MLACP_JSON TORCH_JSON [OUT_JSON]

Rows are joined by (dtype, head shape, S, h). mlacp's side is its flash core with the default tiles: the first
"flash-blas" row of each key (mlacp-perf-attention writes the tiles in --tiles order, whose default and quick lists
start with 0x0, the default tiles; a run with --path team has "flash-team" rows, used where there is no flash-blas
row). Per row: both tools' forward and backward medians (ms), torch/mlacp = torch's forward + backward over mlacp's,
mlacp's fraction of its GEMM rate, torch's fraction of torch's own GEMM rate, and torch's fraction of mlacp's GEMM
rate (the same FLOPs / mlacp's rate / torch's time), so that both tools stand against one rate. Both count the FLOPs
over the S(S+1)/2 visible causal pairs. A missing or failed row (or file) prints "-", an out-of-memory one "OOM".
Writes OUT_JSON when given.
"""
import json
import sys


def load(path):
    """The document, or None (with a note) when the file is missing or not JSON: the other side still prints."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        print(f"attention_report: {path}: {error}; its columns print '-'")
        return None


def key(row):
    return (row.get("dtype"), row.get("head_shape"), row.get("seq"), row.get("heads"))


def mlacp_rows(doc):
    """{key: row} of the default-tile flash row per key, in the file's order."""
    found = {}
    for preferred in ("flash-blas", None):
        for row in (doc or {}).get("results", []):
            core = row.get("core", "")
            if (core == preferred if preferred else core.startswith("flash-")) and key(row) not in found:
                found[key(row)] = row
    order = [key(r) for r in (doc or {}).get("results", [])]
    return dict(sorted(found.items(), key=lambda kv: order.index(kv[0])))


def torch_rows(doc):
    found = {}
    for row in (doc or {}).get("results", []):
        found.setdefault(key(row), row)
    return found


def total_s(row):
    if not row or row.get("status", "ok") != "ok":
        return None
    f, b = row.get("forward_s"), row.get("backward_s")
    return f + b if f is not None and b is not None else None


def cell(value, fmt, width, row=None):
    if value is not None:
        return f"{value:{width}{fmt}}"
    if row is not None and row.get("status") == "OOM":
        return f"{'OOM':>{width}}"
    return f"{'-':>{width}}"


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    mlacp_doc, torch_doc = load(argv[0]), load(argv[1])
    mlacp, torch = mlacp_rows(mlacp_doc), torch_rows(torch_doc)
    keys = list(mlacp) + [k for k in torch if k not in mlacp]
    rows = []
    for k in keys:
        m, t = mlacp.get(k), torch.get(k)
        dtype, head_shape, seq, heads = k
        m_total, t_total = total_s(m), total_s(t)
        flops = (m or {}).get("flops") or (t or {}).get("flops")
        m_rate = (m or {}).get("gemm_rate_flops")
        row = {"dtype": dtype, "head_shape": head_shape, "seq": seq, "heads": heads,
               "mlacp_core": m.get("core") if m else None,
               "mlacp_tiles": f"{m['query_tile']}x{m['key_tile']}" if m and "query_tile" in m else None,
               "flops": flops,
               "mlacp_forward_ms": m["forward_s"] * 1e3 if m_total else None,
               "mlacp_backward_ms": m["backward_s"] * 1e3 if m_total else None,
               "torch_status": t.get("status") if t else None,
               "torch_forward_ms": t["forward_s"] * 1e3 if t_total else None,
               "torch_backward_ms": t["backward_s"] * 1e3 if t_total else None,
               "torch_over_mlacp": t_total / m_total if m_total and t_total else None,
               "mlacp_gemm_rate_flops": m_rate,
               "torch_gemm_rate_flops": (t or {}).get("gemm_rate_flops"),
               "mlacp_fraction_of_mlacp_gemm_rate": (m or {}).get("fraction_of_gemm_rate") if m_total else None,
               "torch_fraction_of_torch_gemm_rate": (t or {}).get("fraction_of_gemm_rate") if t_total else None,
               "torch_fraction_of_mlacp_gemm_rate": flops / m_rate / t_total if flops and m_rate and t_total
               else None}
        if m and t and m.get("flops") and t.get("flops") and abs(m["flops"] - t["flops"]) > 1e-9 * m["flops"]:
            print(f"attention_report: warning: {dtype} {head_shape} S={seq} h={heads}: FLOP counts differ "
                  f"(mlacp {m['flops']:.6g}, torch {t['flops']:.6g})")
        rows.append((row, m, t))

    p_mlacp, p_torch = (mlacp_doc or {}).get("P"), (torch_doc or {}).get("P")
    print(f"mlacp's attention core (flash, default tiles) beside torch {(torch_doc or {}).get('torch', '?')}'s math "
          f"attention (matmul, masked_fill, softmax, matmul; autograd), B=1, per rank, P = {p_mlacp or '-'} (mlacp) / "
          f"{p_torch or '-'} (torch), "
          "median of max over ranks; torch/mlacp > 1: mlacp is faster")
    if p_mlacp is not None and p_torch is not None and p_mlacp != p_torch:
        print(f"attention_report: warning: the runs had different P (mlacp {p_mlacp}, torch {p_torch})")
    if torch_doc and torch_doc.get("cpu_model"):
        print(f"CPU: {torch_doc['cpu_model']}")
    print(f"{'dtype':8s}{'head shape':16s}{'S':>6s}{'h':>4s}{'tiles':>9s}{'mlacp fwd':>11s}{'mlacp bwd':>11s}"
          f"{'torch fwd':>11s}{'torch bwd':>11s}{'torch/mlacp':>13s}{'mlacp frac':>12s}{'torch frac':>12s}"
          f"{'torch frac':>12s}")
    print(f"{'':53s}{'ms':>11s}{'ms':>11s}{'ms':>11s}{'ms':>11s}{'':>13s}{'mlacp GEMM':>12s}{'torch GEMM':>12s}"
          f"{'mlacp GEMM':>12s}")
    for r, m, t in rows:
        print(f"{r['dtype'] or '-':8s}{r['head_shape'] or '-':16s}{r['seq'] or 0:6d}{r['heads'] or 0:4d}"
              f"{r['mlacp_tiles'] or '-':>9s}"
              f"{cell(r['mlacp_forward_ms'], '.2f', 11)}{cell(r['mlacp_backward_ms'], '.2f', 11)}"
              f"{cell(r['torch_forward_ms'], '.2f', 11, t)}{cell(r['torch_backward_ms'], '.2f', 11, t)}"
              f"{cell(r['torch_over_mlacp'], '.2f', 13)}{cell(r['mlacp_fraction_of_mlacp_gemm_rate'], '.3f', 12)}"
              f"{cell(r['torch_fraction_of_torch_gemm_rate'], '.3f', 12, t)}"
              f"{cell(r['torch_fraction_of_mlacp_gemm_rate'], '.3f', 12, t)}")
    rates = {}
    for r, _, _ in rows:
        entry = rates.setdefault(r["dtype"], {"mlacp": None, "torch": None})
        entry["mlacp"] = entry["mlacp"] or r["mlacp_gemm_rate_flops"]
        entry["torch"] = entry["torch"] or r["torch_gemm_rate_flops"]
    print("frac: (FLOPs over the S(S+1)/2 visible pairs / GEMM rate) / (fwd + bwd); GEMM = a square 512^3 GEMM of the "
          "row's dtype measured in each run (mlacp: compat::gemm; torch: torch.mm), GFLOP/s: "
          + "; ".join(f"{d} mlacp {cell(v['mlacp'] and v['mlacp'] / 1e9, '.2f', 0)} torch "
                      f"{cell(v['torch'] and v['torch'] / 1e9, '.2f', 0)}" for d, v in rates.items()))
    if len(argv) == 3:
        doc = {"mlacp_json": argv[0], "torch_json": argv[1], "P": {"mlacp": p_mlacp, "torch": p_torch},
               "torch": (torch_doc or {}).get("torch"), "cpu_model": (torch_doc or {}).get("cpu_model"),
               "gemm_rate_flops": rates, "rows": [r for r, _, _ in rows]}
        with open(argv[2], "w") as out:
            json.dump(doc, out, indent=1)
            out.write("\n")
        print(f"wrote {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
