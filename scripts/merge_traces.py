#!/usr/bin/python3
"""Joins the per-rank Chrome trace files that mlacp writes (MLACP_TRACE=trace.json or mlacp-perf-block --trace
trace.json give trace.rank0.json, trace.rank1.json, ...) into one file that Perfetto (ui.perfetto.dev) or
chrome://tracing opens with one process per rank.

Each rank's times are its steady clock, which every process of one machine shares. Files from different hosts are
shifted onto Unix time with the offset each file records ("otherData": "unix_minus_steady_us"), so that their ranks
line up to the accuracy of the hosts' clock synchronisation.

    /usr/bin/python3 scripts/merge_traces.py -o trace.json trace.rank*.json

Pure Python, no dependencies.
"""
import argparse
import json
import sys


def merge(docs):
    """One trace document of the per-rank documents `docs` (as json.load gives them)."""
    hosts = {d.get("otherData", {}).get("host") for d in docs}
    shift_to_unix = len(hosts) > 1
    events, ranks = [], []
    for d in docs:
        other = d.get("otherData", {})
        ranks.append(other.get("rank"))
        shift = float(other.get("unix_minus_steady_us", 0)) if shift_to_unix else 0.0
        for e in d["traceEvents"]:
            if shift and "ts" in e:
                e = dict(e, ts=e["ts"] + shift)
            events.append(e)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"producer": "mlacp merge_traces.py", "ranks": ranks,
                      "clock": "unix microseconds" if shift_to_unix else "steady_clock microseconds since its epoch"},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="per-rank trace files (trace.rank0.json ...)")
    parser.add_argument("-o", "--output", required=True, help="the merged trace file")
    args = parser.parse_args()
    docs = []
    for path in args.files:
        with open(path) as f:
            docs.append(json.load(f))
    pids = [e["pid"] for d in docs for e in d["traceEvents"] if e.get("name") == "process_name"]
    if len(pids) != len(set(pids)):
        sys.exit("merge_traces: the same rank appears in more than one file: %s" % sorted(pids))
    with open(args.output, "w") as f:
        json.dump(merge(docs), f)
    print("merge_traces: %d rank(s) -> %s" % (len(docs), args.output))


if __name__ == "__main__":
    main()
