#!/usr/bin/python3
"""Checks the Chrome trace files mlacp wrote for N ranks (TRACE.json -> TRACE.rank0.json ...): each parses with
json.load, their merge (merge_traces.py) has one process per rank named "rank r", a "compute" track with compute
slices and "collective in flight #k" tracks with collective slices, every slice begins before it ends, slices of one
collective track do not overlap, each "wait" slice lies inside its collective, compute slices nest; with --recorded,
the trace holds exactly the recorded events of each rank (EVENTS.tsv -> EVENTS.rank0.tsv ...: kind TAB name per line)
in the recorded order; with --expect, each rank has a collective slice of that name.

    /usr/bin/python3 scripts/check_trace.py build/trace.json --ranks 2 [--recorded events.tsv] [--expect "dO a2a"]

Exit status 0 and "check_trace: OK ..." when every check passes; 1 and the failures otherwise.
"""
import argparse
import collections
import json
import os
import sys

sys.dont_write_bytecode = True  # nothing written next to the scripts
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from merge_traces import merge  # noqa: E402

EPS_US = 5e-4  # times are written in whole nanoseconds; a sum of two of them is exact to better than this


def rank_path(path, rank):
    """The file of `rank`: ".rank<rank>" before the extension (as mlacp::events::rank_path)."""
    head, tail = os.path.split(path)
    dot = tail.rfind(".")
    if dot > 0:
        return os.path.join(head, tail[:dot] + ".rank%d" % rank + tail[dot:])
    return path + ".rank%d" % rank


def boundaries(events):
    """The recorded events a rank's trace events stand for: {(kind, name): [time, ...] in time order}."""
    out = collections.defaultdict(list)
    for e in events:
        ph, cat, name, ts = e["ph"], e.get("cat"), e.get("name"), e.get("ts")
        if ph == "M":
            continue
        end = ts + e["dur"] if ph == "X" else None
        if cat == "compute":
            out[("compute_begin", name)].append(ts)
            if end is not None:
                out[("compute_end", name)].append(end)
        elif cat == "compute_end":
            out[("compute_end", name)].append(ts)
        elif cat == "launch":
            out[("launch", name)].append(ts)
        elif cat == "collective":
            if e["args"]["launched"]:
                out[("launch", name)].append(ts)
            if end is not None:
                out[("wait_end", name)].append(end)
        elif cat == "wait":
            out[("wait_begin", name[len("wait "):])].append(ts)
    for times in out.values():
        times.sort()
    return out


def check(args):
    failures = []
    docs = []
    for r in range(args.ranks):
        path = rank_path(args.trace, r)
        if not os.path.exists(path):
            failures.append("%s was not written" % path)
            continue
        with open(path) as f:
            docs.append(json.load(f))
    if failures:
        return failures
    merged = merge(docs)
    if args.merged:
        with open(args.merged, "w") as f:
            json.dump(merged, f)
        with open(args.merged) as f:
            merged = json.load(f)
    events = merged["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    if names != {r: "rank %d" % r for r in range(args.ranks)}:
        failures.append("processes %s; expected one per rank 0..%d named 'rank r'" % (names, args.ranks - 1))
    by_track = collections.defaultdict(list)
    for e in events:
        if e["ph"] != "M":
            by_track[(e["pid"], e["tid"])].append(e)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for (pid, tid) in by_track:
        if (pid, tid) not in threads:
            failures.append("rank %s: events on track %s, which has no thread_name" % (pid, tid))
    for r in range(args.ranks):
        if threads.get((r, 0)) != "compute":
            failures.append("rank %d: track 0 is %r; expected 'compute'" % (r, threads.get((r, 0))))
        collective_tracks = [tid for (pid, tid) in threads if pid == r and tid > 0]
        for tid in collective_tracks:
            if threads[(r, tid)] != "collective in flight #%d" % tid:
                failures.append("rank %d: track %d is %r" % (r, tid, threads[(r, tid)]))
        if not any(e["ph"] == "X" and e["cat"] == "compute" for e in by_track[(r, 0)]):
            failures.append("rank %d: no compute slice on the compute track" % r)
        collectives = [e for tid in collective_tracks for e in by_track[(r, tid)] if e["cat"] == "collective"]
        if not collectives:
            failures.append("rank %d: no collective slice" % r)
        for name in args.expect or []:
            if not any(e["name"] == name for e in collectives):
                failures.append("rank %d: no collective slice named %r" % (r, name))
    for (pid, tid), track in sorted(by_track.items()):
        for e in track:
            if not isinstance(e.get("ts"), (int, float)):
                failures.append("rank %s: event without a time: %s" % (pid, e))
            elif e["ph"] == "X" and not e["dur"] >= 0:
                failures.append("rank %s: slice %r ends before it begins (dur %s)" % (pid, e["name"], e["dur"]))
        slices = sorted((e for e in track if e["ph"] == "X"), key=lambda e: (e["ts"], -e["dur"]))
        if tid > 0:
            flights = [e for e in slices if e["cat"] == "collective"]
            for a, b in zip(flights, flights[1:]):
                if b["ts"] < a["ts"] + a["dur"] - EPS_US:
                    failures.append("rank %s track %s: %r and %r overlap" % (pid, tid, a["name"], b["name"]))
            for w in (e for e in slices if e["cat"] == "wait"):
                inside = [c for c in flights if c["name"] == w["name"][len("wait "):] and c["ts"] - EPS_US <= w["ts"]
                          and w["ts"] + w["dur"] <= c["ts"] + c["dur"] + EPS_US]
                if not inside:
                    failures.append("rank %s: %r lies outside its collective's slice" % (pid, w["name"]))
        else:
            stack = []
            for e in slices:
                while stack and stack[-1] <= e["ts"] + EPS_US:
                    stack.pop()
                if stack and e["ts"] + e["dur"] > stack[-1] + EPS_US:
                    failures.append("rank %s: compute slice %r crosses the end of the slice that contains its start"
                                    % (pid, e["name"]))
                stack.append(e["ts"] + e["dur"])
    if args.recorded:
        for r in range(args.ranks):
            path = rank_path(args.recorded, r)
            with open(path) as f:
                recorded = [tuple(line.rstrip("\n").split("\t", 1)) for line in f if line.strip()]
            have = boundaries([e for e in events if e["pid"] == r])
            expected_counts = collections.Counter(recorded)
            counts = {key: len(times) for key, times in have.items()}
            if counts != dict(expected_counts):
                failures.append("rank %d: the trace stands for %s; recorded %s" % (r, counts, dict(expected_counts)))
                continue
            used = collections.Counter()
            previous = None
            in_order = True
            for kind, name in recorded:
                t = have[(kind, name)][used[(kind, name)]]
                used[(kind, name)] += 1
                if previous is not None and t < previous[0] - EPS_US:
                    failures.append("rank %d: %s %r at %.3f us comes before %s %r at %.3f us, recorded after it"
                                    % (r, kind, name, t, previous[1], previous[2], previous[0]))
                    in_order = False
                    break
                previous = (t, kind, name)
            if in_order:
                print("check_trace: rank %d: %d recorded events, in order" % (r, len(recorded)))
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="the trace path without the rank (trace.json for trace.rank0.json ...)")
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--recorded", help="the recorded events' path without the rank (events.tsv)")
    parser.add_argument("--expect", action="append", help="a collective every rank's trace must show")
    parser.add_argument("--merged", help="also write the merged trace here (and read it back)")
    args = parser.parse_args()
    failures = check(args)
    for f in failures:
        print("check_trace: FAIL " + f)
    if failures:
        sys.exit(1)
    print("check_trace: OK %s, %d rank(s)" % (args.trace, args.ranks))


if __name__ == "__main__":
    main()
