#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The planner's tables at scale, on paper: DeepSeek-V3's attention (H=128, dn=128, dr=64, dv=128, R=512, q-LoRA
1536, D=7168, bf16) on a described GPU cluster (perf_tests/model/machines/dgx_h100.json: the figures and their source
are in the file) at P = 8 ... 1024 ranks and S = 32k ... 1M tokens. For every (P, S): the planner's first choice, the
best flat Ulysses choice of each strategy and the best ring, their predicted times and memory per rank, and whether
they fit the budget. These are predictions of the model, not measurements.

    perf_tests/model/at_scale.py --plan build/src/mlacp-plan [--machine FILE] [--out perf_results/model]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE = dict(batch=1, heads=128, nope=128, rope=64, vdim=128, latent=512, q_lora=1536, hidden=7168)


def plan(tool, machine, P, G, S, dtype):
    nodes = max(1, P // G)
    per_node = P // nodes
    cmd = [tool, "--batch", "1", "--heads", "128", "--nope", "128", "--rope", "64", "--vdim", "128", "--latent", "512",
           "--q-lora", "1536", "--hidden", "7168", "--seq", str(S), "--dtype", dtype, "--nodes", str(nodes),
           "--ranks-per-node", str(per_node), "--machine", machine]
    if dtype == "bf16":
        # Tensor cores: the bf16 path. (auto's first forward would time the float path too, and the memory model
        # prices that: both paths' workspaces at once.)
        cmd += ["--bf16-compute", "bf16"]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "plan.json")
        out = subprocess.run(cmd + ["--json", path], capture_output=True, text=True)
        # Exit 1: nothing fits the budget (the table still says what each choice needs).
        if out.returncode not in (0, 1) or not os.path.exists(path):
            sys.exit("mlacp-plan failed (%d): %s\n%s%s" % (out.returncode, " ".join(cmd), out.stdout, out.stderr))
        return json.load(open(path))


def best(rows, pred):
    fitting = [r for r in rows if pred(r) and r["fits"]]
    anyrow = [r for r in rows if pred(r)]
    return (fitting or [None])[0], min(anyrow, key=lambda r: r["total_s"]) if anyrow else None


def name(r):
    if r is None:
        return "-"
    s = "%s U=%d C=%d" % (r["strategy"], r["ulysses"], r["ring"])
    return s + (" " + r["layout"] if r["ring"] > 1 else "")


def cell(r):
    if r is None:
        return "-"
    t = r["total_s"]
    txt = ("%.0f ms" % (t * 1e3)) if t < 10 else ("%.1f s" % t)
    gib = r["memory_bytes"] / 2**30
    return "%s, %.0f GiB%s" % (txt, gib, "" if r["fits"] else " (does not fit)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", required=True, help="the mlacp-plan executable")
    ap.add_argument("--machine", default=os.path.join(HERE, "machines", "dgx_h100.json"))
    ap.add_argument("--ranks", default="8,64,256,1024")
    ap.add_argument("--seqs", default="32768,131072,524288,1048576")
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", default="perf_results/model")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    machine = json.load(open(a.machine))
    results = []
    lines = ["# DeepSeek-V3 attention at scale: the planner's predictions", "",
             "Machine: %s." % machine["name"], "", "Source of the figures: %s." % machine["source"], "",
             "Layer: B=1, H=128, dn=128, dr=64, dv=128, R=512, q-LoRA 1536, D=7168, %s; memory budget %.0f GB per rank."
             % (a.dtype, machine.get("memory_per_rank_bytes", 0) / 1e9), "",
             "Each cell: predicted forward + backward time and memory per rank. These are model predictions, not "
             "measurements.", "",
             "| P | S | first choice | flat latent | flat expanded | best latent ring | best expanded ring |",
             "|---|---|---|---|---|---|---|"]
    for P in [int(x) for x in a.ranks.split(",")]:
        for S in [int(x) for x in a.seqs.split(",")]:
            if S < P:
                continue
            p = plan(a.plan, a.machine, P, a.ranks_per_node, S, a.dtype)
            rows = p["rows"]
            first = rows[p["best"]] if p["best"] is not None else None
            _, flat_latent = best(rows, lambda r: r["strategy"] == "latent" and r["ring"] == 1)
            _, flat_expanded = best(rows, lambda r: r["strategy"] == "expanded" and r["ring"] == 1)
            ring_latent_fit, ring_latent = best(rows, lambda r: r["strategy"] == "latent" and r["ring"] > 1)
            ring_expanded_fit, ring_expanded = best(rows, lambda r: r["strategy"] == "expanded" and r["ring"] > 1)
            ring_latent = ring_latent_fit or ring_latent
            ring_expanded = ring_expanded_fit or ring_expanded
            results.append(dict(P=P, S=S, first=first, flat_latent=flat_latent, flat_expanded=flat_expanded,
                                ring_latent=ring_latent, ring_expanded=ring_expanded))
            lines.append("| %d | %dk | %s: %s | %s | %s | %s: %s | %s: %s |" % (
                P, S // 1024, name(first), cell(first), cell(flat_latent), cell(flat_expanded), name(ring_latent),
                cell(ring_latent), name(ring_expanded), cell(ring_expanded)))
    # Where the latent ring overtakes flat Ulysses, and where each flat strategy stops fitting.
    lines += ["", "## Reading the table", ""]
    for P in sorted({r["P"] for r in results}):
        row = [r for r in results if r["P"] == P]
        over = [r["S"] for r in row if r["ring_latent"] and r["flat_latent"] and r["ring_latent"]["fits"] and
                (not r["flat_latent"]["fits"] or r["ring_latent"]["total_s"] < r["flat_latent"]["total_s"])]
        lat_out = [r["S"] for r in row if r["flat_latent"] and not r["flat_latent"]["fits"]]
        exp_out = [r["S"] for r in row if r["flat_expanded"] and not r["flat_expanded"]["fits"]]
        lines.append("- P = %d: the latent ring is predicted faster than (or the only fit beside) flat latent Ulysses "
                     "from S = %s; flat latent stops fitting at S = %s; flat expanded at S = %s." % (
                         P, ("%dk" % (min(over) // 1024)) if over else "never (in this grid)",
                         ("%dk" % (min(lat_out) // 1024)) if lat_out else "never (in this grid)",
                         ("%dk" % (min(exp_out) // 1024)) if exp_out else "never (in this grid)"))
    text = "\n".join(lines) + "\n"
    open(os.path.join(a.out, "at_scale.md"), "w").write(text)
    json.dump(dict(machine=machine, results=results), open(os.path.join(a.out, "at_scale.json"), "w"), indent=1)
    print(text)


if __name__ == "__main__":
    main()
