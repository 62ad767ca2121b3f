#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Markdown tables from mlacp-perf-gemm-shapes JSON files (one per P).

    scripts/gemm_shapes_report.py perf_results/gemm_shapes/gemm_shapes_np1.json perf_results/gemm_shapes/gemm_shapes_np2.json

Prints, per file: the machine (CPU model and flags, square-GEMM rates), one summary row per configuration (layer time,
time / limit and the breakdown in units of the limit), then the GEMM shapes of every configuration (layer against
alone). Standard library only.
"""
import json
import sys


def ms(s):
    return f"{s * 1e3:.2f}"


def report(path):
    doc = json.load(open(path))
    out = [f"## P = {doc['P']} (`{path}`)", ""]
    out.append(f"CPU: {doc['cpu_model']} ({doc['cpu_flags']}); {doc['hardware_concurrency']:.0f} hardware threads; "
               f"{doc['mpi']}; Kokkos {doc['kokkos_execution_space']}; iterations per measurement: {doc['repeats']}.")
    rates = ", ".join(f"{r['dtype']} {r['shape']} {r['flops_per_s'] * 1e-9:.1f} GFLOP/s" for r in doc["square_rates"])
    out.append(f"Square-GEMM rate per rank: {rates}. Hook per gemm_with_progress call (2x2x2): "
               f"{doc['hook_ns_without_tool']:.0f} ns without a tool, {doc['hook_ns_with_region_callback']:.0f} ns "
               "with a region callback installed.")
    out += ["", "Breakdown per iteration and rank, in units of the limit (FLOPs / square rate); gap = profiled time / "
            "limit - 1, core excess = (core time - core FLOPs / square rate) / limit:", ""]
    out.append("| configuration | layer ms | limit ms | time/limit | GEMMs alone | GEMM overhead | attention core | "
               "memory-bound | waits | rest | core / square rate | gap | core excess |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in doc["results"]:
        b, lim = r["breakdown_s"], r["limit_s"]
        core_rate = r["attention_flops"] / b["attention_core"] / r["square_rate_flops_per_s"]
        cells = [r["name"], ms(r["layer"]["median_s"]), ms(lim), f"{r['time_over_limit']:.2f}"]
        cells += [f"{b[k] / lim:.3f}" for k in ("gemm_alone", "gemm_overhead", "attention_core", "memory_bound_kernels",
                                                  "waits", "rest")]
        cells.append(f"{core_rate:.2f}")
        # The gap: the profiled time over the limit, less 1; the core's excess: its time less its FLOPs at the rate.
        cells.append(f"{b['total_profiled'] / lim - 1:.3f}")
        cells.append(f"{(b['attention_core'] - r['attention_flops'] / r['square_rate_flops_per_s']) / lim:.3f}")
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "GEMM shapes (m x n x k of C = op(A) op(B), per iteration; alone = the same call alone, median):", ""]
    out.append("| configuration | GEMM | calls | layer ms | alone ms | layer/alone | GFLOP/s alone | alone/square |")
    out.append("|---|---|---|---|---|---|---|---|")
    for r in doc["results"]:
        for g in r["gemms"]:
            out.append(f"| {r['name']} | {g['gemm']} | {g['calls_per_iteration']:.0f} | {ms(g['layer_s'])} | "
                       f"{ms(g['alone_s'])} | {g['layer_over_alone']:.2f} | {g['alone_flops_per_s'] * 1e-9:.1f} | "
                       f"{g['alone_over_square']:.2f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("\n".join(report(p) for p in sys.argv[1:]))
