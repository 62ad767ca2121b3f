#!/usr/bin/python3
"""PNG timeline of one overlapped MLA backward from mlacp-perf-block's --timeline JSON.

One panel per strategy; per rank two lanes: "compute" (the compute phases; nested phases drawn thinner on top of
the phase that contains them) and "comm" (each collective from its launch to the end of its wait, the part spent
blocked in wait() hatched). A collective bar that lies under compute bars is communication hidden by compute.

    /usr/bin/python3 scripts/plot_timeline.py perf_results/block_timeline.json perf_results/block_timeline.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402


def intervals(events):
    """(compute, comm): compute = [(name, t0, t1, depth)], comm = [(name, t_launch, t_wait_begin, t_wait_end)]."""
    compute, comm, stack, launched, waiting = [], [], [], {}, {}
    for e in events:
        kind, name, t = e["kind"], e["name"], e["t"]
        if kind == "compute_begin":
            stack.append((name, t))
        elif kind == "compute_end":
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] == name:
                    compute.append((name, stack[i][1], t, i))
                    del stack[i]
                    break
        elif kind == "launch":
            launched[name] = t
        elif kind == "wait_begin":
            waiting[name] = t
        elif kind == "wait_end" and name in launched:
            comm.append((name, launched.pop(name), waiting.pop(name, t), t))
    return compute, comm


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_timeline.py TIMELINE.json OUT.png")
    doc = json.load(open(sys.argv[1]))
    timelines = doc["timelines"]
    if not timelines:
        sys.exit("plot_timeline: no timeline in " + sys.argv[1])
    names = sorted({e["name"] for tl in timelines for r in tl["ranks"] for e in r["events"]})
    palette = plt.get_cmap("tab20")
    color = {n: palette(i % 20) for i, n in enumerate(names)}
    nranks = max(len(tl["ranks"]) for tl in timelines)
    fig, axes = plt.subplots(len(timelines), 1, figsize=(15, 1.2 + 1.3 * nranks * len(timelines)), squeeze=False)
    for ax, tl in zip(axes[:, 0], timelines):
        t0 = min(e["t"] for r in tl["ranks"] for e in r["events"])
        labels, used = [], set()
        for r in tl["ranks"]:
            rank = r["rank"]
            compute, comm = intervals(r["events"])
            y_comp, y_comm = 2 * rank + 1, 2 * rank
            for name, a, b, depth in sorted(compute, key=lambda c: c[3]):
                h = 0.8 - 0.25 * min(depth, 2)
                ax.barh(y_comp, (b - a) * 1e3, left=(a - t0) * 1e3, height=h, color=color[name], edgecolor="black",
                        linewidth=0.4)
                used.add(name)
            # Collectives in flight at the same time get separate sub-rows of the lane.
            ends = []
            placed = []
            for name, a, wb, we in sorted(comm, key=lambda c: c[1]):
                slot = next((i for i, end in enumerate(ends) if end <= a), len(ends))
                if slot == len(ends):
                    ends.append(we)
                else:
                    ends[slot] = we
                placed.append((slot, name, a, wb, we))
            rows = max(1, len(ends))
            h = 0.8 / rows
            for slot, name, a, wb, we in placed:
                y = y_comm - 0.4 + h * (slot + 0.5)
                ax.barh(y, (we - a) * 1e3, left=(a - t0) * 1e3, height=h * 0.9, color=color[name],
                        edgecolor="black", linewidth=0.4, alpha=0.85)
                ax.barh(y, (we - wb) * 1e3, left=(wb - t0) * 1e3, height=h * 0.9, fill=False, hatch="////",
                        edgecolor="black", linewidth=0.4)
                used.add(name)
            labels += [(y_comm, f"rank {rank} comm"), (y_comp, f"rank {rank} compute")]
        ax.set_yticks([y for y, _ in labels])
        ax.set_yticklabels([lab for _, lab in labels])
        ax.set_xlabel("time since the backward started [ms]")
        ax.set_title(f"{tl['strategy']} strategy, overlapped backward, P = {len(tl['ranks'])} "
                     f"({doc.get('transport', '?')}, rate {doc.get('rate', '?')})")
        ax.grid(axis="x", alpha=0.3)
        handles = [Patch(facecolor=color[n], edgecolor="black", label=n) for n in names if n in used]
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="////", label="blocked in wait()"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print("wrote " + sys.argv[2])


if __name__ == "__main__":
    main()
