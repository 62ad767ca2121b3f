#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The report of scripts/compare_speed.sh: for each measured cell (perf-block's overlapped and blocking times per
strategy and transport, perf-overlap's pair and blocking times per pair and transport, mla-block's median iteration
at the DeepSeek-like shape), the median over the rounds of the "before" and the "after" build, after / before, and
each build's own range over the rounds (max / min), so that a change can be read against the noise."""
import glob
import os
import re
import statistics
import sys


def cells_of(path):
    text = open(path, errors="replace").read()
    base = os.path.basename(path)
    out = {}
    if base.startswith("block_"):
        transport = base.split("_")[1]
        for m in re.finditer(r"^(latent|expanded)\s+([\d.]+)ms\s+([\d.]+)ms", text, re.M):
            out[f"perf-block {transport} {m.group(1)} overlapped"] = float(m.group(2))
            out[f"perf-block {transport} {m.group(1)} blocking"] = float(m.group(3))
    elif base.startswith("overlap_"):
        transport = base.split("_")[1]
        body = text.split("Where the overlapped pair's time goes")[0]
        for line in body.splitlines():
            m = re.match(r"^(.{54})\s*([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)ms", line)
            if m:
                out[f"perf-overlap {transport} {m.group(1).strip()} pair"] = float(m.group(4))
    elif base.startswith("mla_block_"):
        strategy = base.split("_")[2]
        m = re.search(r"iteration time \(max over ranks\): median ([\d.]+) ms", text)
        if m:
            out[f"mla-block deepseek-like {strategy}"] = float(m.group(1))
    return out


def main():
    out_dir = sys.argv[1]
    samples = {"before": {}, "after": {}}
    for path in sorted(glob.glob(os.path.join(out_dir, "*.txt"))):
        m = re.search(r"_(before|after)_r\d+\.txt$", path)
        if not m:
            continue
        for cell, value in cells_of(path).items():
            samples[m.group(1)].setdefault(cell, []).append(value)
    cpu = open(os.path.join(out_dir, "cpu.txt")).read().strip() if os.path.exists(os.path.join(out_dir, "cpu.txt")) else ""
    print(f"# Speed before and after, interleaved\n\n{cpu}\n")
    print("| cell | before ms (median) | after ms (median) | after / before | before range | after range |")
    print("|---|---|---|---|---|---|")
    ratios = []
    for cell in sorted(samples["before"]):
        b, a = samples["before"][cell], samples["after"].get(cell)
        if not a:
            continue
        mb, ma = statistics.median(b), statistics.median(a)
        rb = max(b) / min(b) if min(b) > 0 else float("nan")
        ra = max(a) / min(a) if min(a) > 0 else float("nan")
        ratio = ma / mb if mb > 0 else float("nan")
        ratios.append(ratio)
        print(f"| {cell} | {mb:.2f} | {ma:.2f} | {ratio:.3f} | {rb:.2f} | {ra:.2f} |")
    if ratios:
        print(f"\n{len(ratios)} cells; after / before: median {statistics.median(ratios):.3f}, "
              f"min {min(ratios):.3f}, max {max(ratios):.3f}")


if __name__ == "__main__":
    main()
