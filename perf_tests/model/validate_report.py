#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The performance model's validation report, from the JSON files scripts/validate-model.sh leaves:

    environment.txt                                  the CPU (lscpu), the load at the start and the end, the settings
    loads.txt                                        the 1-minute load average before each round
    machine_<link>_r<round>.json                     the round's calibration on that testbed (mlacp-plan --calibrate)
    calibration_<link>_r<round>.txt                  its printed report (the ping-pong rate between the nodes)
    run_<link>_r<round>_<shape>_<dtype>_<wire>_q<Rq>_<strategy>_C<ring>_<layout>.json
                                                     a measured run with the model's prediction from that round's
                                                     calibration (mlacp-mla-block --machine ... --json)

For every case: the median over the rounds of the measured forward + backward time (each run: the median of its
iterations, max over ranks) against the median of the predictions, the error, and beside it the rounds' own spread
(the slowest round over the fastest, and the interquartile range over the median): an error within the spread is
the measurement's noise as much as the model's. For every group (the choices of strategy, U, C and layout for one
(link, shape, dtype, wire, q-LoRA)): Kendall's tau between the predicted and the measured order, and the model's first
choice against the measured best (its regret). The link rates the calibration measured on every testbed, and the
predicted memory against the peak Kokkos bytes. Targets (issue 32): median |error| <= 10%, worst <= 25%, first choice
within 5% of the measured best in >= 80% of the groups. Writes validation.md, validation.json and validation.png
(predicted vs measured) to --out.

    perf_tests/model/validate_report.py perf_results/model/validation --out perf_results/model
"""
import argparse
import glob
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

TARGET_MEDIAN, TARGET_WORST, TARGET_HIT, WITHIN = 0.10, 0.25, 0.80, 0.05
RUN = re.compile(r"run_(?P<link>[^_]+)_r(?P<round>\d+)_(?P<shape>[^_]+)_(?P<dtype>[^_]+)_(?P<wire>[^_]+)_q(?P<q>\d+)_"
                 r"(?P<strategy>latent|expanded)_C(?P<ring>\d+)_(?P<layout>[a-z]+)\.json$")
MACHINE = re.compile(r"machine_(?P<link>[^_]+)_r(?P<round>\d+)\.json$")


def load(path):
    with open(path) as f:
        return json.load(f)


def quartiles(xs):
    xs = sorted(xs)
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def kendall_tau(xs, ys):
    """Kendall's tau-b (ties in either order count for neither side)."""
    concordant = discordant = ties_x = ties_y = 0
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denominator = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return (concordant - discordant) / denominator if denominator > 0 else float("nan")


def predict_without_lag(plan_tool, run, machine_path, link, cache):
    """The model's time for one run from its round's machine file with sync_s = 0 (mlacp-plan restricted to the run's
    strategy, ring, layout and wire dtype)."""
    if machine_path not in cache:
        m = load(machine_path)
        m["sync_s"] = 0.0
        fd, path = tempfile.mkstemp(suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump(m, f)
        cache[machine_path] = path
    c = run["config"]
    nodes, per_node = (1, 2) if link == "shm" else (2, 1)
    cmd = [plan_tool, "--batch", str(c["B"]), "--seq", str(c["S"]), "--hidden", str(c["D"]), "--heads", str(c["H"]),
           "--nope", str(c["dn"]), "--rope", str(c["dr"]), "--vdim", str(c["dv"]), "--latent", str(c["R"]),
           "--q-lora", str(c["Rq"]), "--dtype", run["dtype"], "--nodes", str(nodes), "--ranks-per-node",
           str(per_node), "--strategy", run["strategy"], "--ring", str(run["ring_size"]), "--machine",
           cache[machine_path]]
    if run["ring_size"] > 1:
        cmd += ["--layout", run["ring_layout"]]
    if run.get("wire_dtype", "same") != "same":
        cmd += ["--wire-dtype", run["wire_dtype"]]
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "plan.json")
        out = subprocess.run(cmd + ["--json", out_path], capture_output=True, text=True)
        if out.returncode != 0 or not os.path.exists(out_path):
            sys.exit("validate_report: %s failed (%d)\n%s%s" % (" ".join(cmd), out.returncode, out.stdout, out.stderr))
        return load(out_path)["rows"][0]["total_s"]


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def choice_name(r):
    return "%s U=%d C=%d%s" % (r["strategy"], 2 // r["ring"] if r["ring"] <= 2 else 1, r["ring"],
                               " " + r["layout"] if r["ring"] > 1 else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs")
    ap.add_argument("--out", default=None)
    ap.add_argument("--cpu", default=None, help="the CPU's name for the report (default: lscpu's model name)")
    ap.add_argument("--plan", default=None, help="mlacp-plan: also predict every run from its round's machine file "
                    "with the synchronisation lag sync_s set to 0, to show how much of the error is that term")
    ap.add_argument("--previous", default=None, help="the previous validation.json, for a one-line comparison "
                    "(default: --out's validation.json when it is an older layout)")
    a = ap.parse_args()
    out = a.out or a.runs
    cpu = a.cpu or cpu_name()
    env_path = os.path.join(a.runs, "environment.txt")
    environment = open(env_path).read().strip().splitlines() if os.path.exists(env_path) else []
    # The 1-minute load average before each round (loads.txt): the other work on the machine while it measured.
    loads = []
    loads_path = os.path.join(a.runs, "loads.txt")
    if os.path.exists(loads_path):
        loads = [float(line.rsplit(":", 1)[1]) for line in open(loads_path) if ":" in line]
    if loads:
        environment.append("1-minute load average before each of the %d rounds: median %.2f, min %.2f, max %.2f "
                           "(2 cores; the ranks take both)" % (len(loads), statistics.median(loads), min(loads),
                                                               max(loads)))

    # The earlier validations, newest first: the one this run replaces (validation.json where it is) and those it
    # listed, so that the report keeps the history of the model's accuracy.
    previous = []
    prev_path = a.previous or os.path.join(out, "validation.json")
    if os.path.exists(prev_path):
        p = load(prev_path)
        if "groups" in p:
            started = next((e for e in p.get("environment", []) if e.startswith("started")), "")
            previous.append(dict(median_abs_error=p.get("median_abs_error"), worst_abs_error=p.get("worst_abs_error"),
                                 first_choice_hit_rate=p.get("first_choice_hit_rate"), cpu=p.get("cpu"),
                                 setup="one rank per core, %s" % (started or "an earlier model")))
            earlier = p.get("previous")
            previous += earlier if isinstance(earlier, list) else [earlier] if earlier else []
        else:
            previous.append(dict(median_abs_error=p.get("median_abs_error"), worst_abs_error=p.get("worst_abs_error"),
                                 first_choice_hit_rate=p.get("first_choice_hit_rate"), cpu=p.get("cpu"),
                                 setup="4 ranks on 2 cores (2 x 2 and 4 x 1 nodes x ranks), float"))

    cases = {}
    skipped = []
    no_lag_cache = {}
    for path in sorted(glob.glob(os.path.join(a.runs, "run_*.json"))):
        m = RUN.search(os.path.basename(path))
        if not m:
            continue
        try:
            j = load(path)
        except (OSError, ValueError):
            skipped.append(os.path.basename(path))
            continue
        if j.get("status") != "ok" or "predicted" not in j:
            skipped.append(os.path.basename(path))
            continue
        ring = int(m["ring"])
        key = (m["link"], m["shape"], m["dtype"], m["wire"], int(m["q"]), m["strategy"], ring,
               m["layout"] if ring > 1 else "-")
        c = cases.setdefault(key, dict(measured=[], predicted=[], hidden=[], memory_predicted=[],
                                       memory_measured=[], rounds=[], no_lag=[]))
        if a.plan:
            machine = os.path.join(a.runs, "machine_%s_r%s.json" % (m["link"], m["round"]))
            c["no_lag"].append(predict_without_lag(a.plan, j, machine, m["link"], no_lag_cache))
        c["rounds"].append(int(m["round"]))
        c["measured"].append(j["time_median_s"])
        c["predicted"].append(j["predicted"]["total_s"])
        c["hidden"].append(j["predicted"]["hidden_fraction"])
        c["memory_predicted"].append(j["predicted"]["memory_bytes"])
        c["memory_measured"].append(j.get("peak_view_bytes", 0))
    if not cases:
        sys.exit("validate_report: no run_*.json with a prediction in %s" % a.runs)

    # The link each testbed achieved: the calibrated beta of the level the two ranks talk over (inter-node between
    # two simulated nodes, intra-node in shared memory), as Gbit/s; and the other calibrated figures that matter.
    links = {}
    for path in sorted(glob.glob(os.path.join(a.runs, "machine_*.json"))):
        m = MACHINE.search(os.path.basename(path))
        if not m:
            continue
        j = load(path)
        level = j.get("intra", {}) if m["link"] == "shm" else j.get("inter", {})
        beta, alpha = level.get("beta_s_per_byte", 0), level.get("alpha_s", 0)
        entry = links.setdefault(m["link"], dict(gbit=[], alpha_us=[], sync_us=[], overlap=[], pingpong_gbit=[]))
        # The calibration's own cross-node ping-pong of 4 MiB (its printed report, calibration_<link>_r<round>.txt).
        text_path = os.path.join(a.runs, "calibration_%s_r%s.txt" % (m["link"], m["round"]))
        if os.path.exists(text_path):
            for line in open(text_path):
                pp = re.search(r"cross-node ping-pong: \d+ bytes at ([0-9.]+) GB/s", line)
                if pp:
                    entry["pingpong_gbit"].append(8 * float(pp.group(1)))
        if beta > 0:
            entry["gbit"].append(8 / beta / 1e9)
        entry["alpha_us"].append(alpha * 1e6)
        entry["sync_us"].append(j.get("sync_s", 0) * 1e6)
        entry["overlap"].append(j.get("overlap_efficiency", float("nan")))

    rows = []
    for key in sorted(cases):
        c = cases[key]
        measured, predicted = statistics.median(c["measured"]), statistics.median(c["predicted"])
        q1, q3 = quartiles(c["measured"])
        mem_m = statistics.median(c["memory_measured"])
        rows.append(dict(link=key[0], shape=key[1], dtype=key[2], wire=key[3], q_lora=key[4], strategy=key[5],
                         ring=key[6], layout=key[7], rounds=len(c["measured"]), measured_s=measured,
                         predicted_s=predicted, error=(predicted - measured) / measured,
                         spread=max(c["measured"]) / min(c["measured"]), iqr=(q3 - q1) / measured,
                         best_s=min(c["measured"]), hidden=statistics.median(c["hidden"]),
                         memory_predicted=statistics.median(c["memory_predicted"]), memory_measured=mem_m,
                         measured_rounds_s=c["measured"],
                         predicted_no_lag_s=statistics.median(c["no_lag"]) if c["no_lag"] else None))
    for r in rows:
        r["choice"] = choice_name(r)
        # The error is within the measurement's noise when the prediction lies inside the rounds' own range.
        r["within_rounds"] = min(r["measured_rounds_s"]) <= r["predicted_s"] <= max(r["measured_rounds_s"])
    errors = [abs(r["error"]) for r in rows]
    median_err, worst_err = statistics.median(errors), max(errors)
    worst = max(rows, key=lambda r: abs(r["error"]))
    iqrs = [r["iqr"] for r in rows]
    spreads = [r["spread"] for r in rows]

    groups = {}
    for r in rows:
        groups.setdefault((r["link"], r["shape"], r["dtype"], r["wire"], r["q_lora"]), []).append(r)
    group_rows = []
    for g, members in sorted(groups.items()):
        best = min(members, key=lambda r: r["measured_s"])
        pick = min(members, key=lambda r: r["predicted_s"])
        regret = pick["measured_s"] / best["measured_s"] - 1
        # The measured gap between the pick and the best against their own rounds' spread: a regret smaller than
        # the larger of the two cases' interquartile ranges is not resolved by this measurement.
        noise = max(pick["iqr"], best["iqr"])
        tau = kendall_tau([r["predicted_s"] for r in members], [r["measured_s"] for r in members])
        group_rows.append(dict(group=dict(link=g[0], shape=g[1], dtype=g[2], wire=g[3], q_lora=g[4]),
                               choices=len(members), tau=tau, pick=pick["choice"], best=best["choice"],
                               regret=regret, ok=regret <= WITHIN, noise_iqr=noise,
                               resolved=regret > noise or regret <= WITHIN))
    hit = sum(g["ok"] for g in group_rows) / len(group_rows)
    taus = [g["tau"] for g in group_rows if not math.isnan(g["tau"])]
    regrets = [g["regret"] for g in group_rows]

    mem_ratio = [r["memory_predicted"] / r["memory_measured"] for r in rows if r["memory_measured"] > 0]

    # The same figures with the calibrated synchronisation lag left out of every collective (--plan).
    no_lag = None
    if all(r["predicted_no_lag_s"] is not None for r in rows):
        errs = [abs(r["predicted_no_lag_s"] - r["measured_s"]) / r["measured_s"] for r in rows]
        hits, taus_nl = [], []
        for g, members in groups.items():
            best = min(members, key=lambda r: r["measured_s"])
            pick = min(members, key=lambda r: r["predicted_no_lag_s"])
            hits.append(pick["measured_s"] / best["measured_s"] - 1 <= WITHIN)
            t = kendall_tau([r["predicted_no_lag_s"] for r in members], [r["measured_s"] for r in members])
            if not math.isnan(t):
                taus_nl.append(t)
        no_lag = dict(median_abs_error=statistics.median(errs), worst_abs_error=max(errs),
                      first_choice_hit_rate=sum(hits) / len(hits),
                      median_tau=statistics.median(taus_nl) if taus_nl else None)

    def fmt_group(g):
        x = g["group"]
        return "%s | %s | %s | %s | %s" % (x["link"], x["shape"], x["dtype"], x["wire"], x["q_lora"] or "-")

    def verdict(value, target, smaller=True):
        ok = value <= target if smaller else value >= target
        return "met" if ok else "missed"

    lines = ["# Performance model validation: one rank per core", "",
             "CPU (lscpu): %s. P = 2 ranks, each pinned to its own core: two simulated nodes of one rank joined by a "
             "tc-limited link (scripts/netns-cluster.sh at 500 Mbit/s, 2 Gbit/s, 10 Gbit/s) or one node of two ranks "
             "(shm: shared memory). Each row: the median over its rounds of the measured forward + backward time "
             "(mlacp-mla-block, the median of its iterations, max over ranks) and of the model's prediction from "
             "that round's calibration; the rounds interleave calibration and measurement." % cpu, ""]
    if environment:
        lines += ["Run:"] + ["- " + line for line in environment] + [""]
    shown_previous = [x for x in previous if x and x.get("median_abs_error") is not None]
    if shown_previous:
        lines += ["Earlier validations, newest first:", ""]
        for x in shown_previous:
            lines.append("- %s, %s: median |error| %.1f%%, worst %.1f%%, first choice within 5%% in %.0f%% of the "
                         "groups%s." % (x.get("setup", "?"), x.get("cpu", "?"), 100 * x["median_abs_error"],
                                        100 * x["worst_abs_error"], 100 * x["first_choice_hit_rate"],
                                        " (it measured the OS scheduler more than the model)"
                                        if x.get("setup", "").startswith("4 ranks") else ""))
        lines.append("")
    lines += ["## Summary", "",
              "| figure | value | target | |", "|---|---|---|---|",
              "| median \\|error\\| over %d cases | %.1f%% | <= %.0f%% | %s |" % (
                  len(rows), 100 * median_err, 100 * TARGET_MEDIAN, verdict(median_err, TARGET_MEDIAN)),
              "| worst \\|error\\| (%s, %s) | %.1f%% | <= %.0f%% | %s |" % (
                  "/".join(str(worst[k]) for k in ("link", "shape", "dtype", "wire")), worst["choice"],
                  100 * worst_err, 100 * TARGET_WORST, verdict(worst_err, TARGET_WORST)),
              "| first choice within 5%% of the measured best | %d of %d groups (%.0f%%) | >= %.0f%% | %s |" % (
                  sum(g["ok"] for g in group_rows), len(group_rows), 100 * hit, 100 * TARGET_HIT,
                  verdict(hit, TARGET_HIT, smaller=False)),
              "| first choice's regret, median / worst | %.1f%% / %.1f%% | | |" % (
                  100 * statistics.median(regrets), 100 * max(regrets)),
              "| Kendall tau within a group, median / min | %s | | |" % (
                  "%.2f / %.2f" % (statistics.median(taus), min(taus)) if taus else "-"),
              "| the rounds' own spread: relative IQR, median / worst | %.1f%% / %.1f%% | | |" % (
                  100 * statistics.median(iqrs), 100 * max(iqrs)),
              "| the rounds' own spread: slowest / fastest round, median / worst | %.2f / %.2f | | |" % (
                  statistics.median(spreads), max(spreads)),
              "| cases whose prediction lies within their rounds' range | %d of %d | | |" % (
                  sum(r["within_rounds"] for r in rows), len(rows)),
              "| memory predicted / peak Kokkos bytes, min / median / max | %.3f / %.3f / %.3f | >= 0.95 | %s |" % (
                  min(mem_ratio), statistics.median(mem_ratio), max(mem_ratio),
                  verdict(min(mem_ratio), 0.95, smaller=False)) if mem_ratio else "| memory | - | | |", ""]
    if no_lag:
        lag_us = statistics.median(v for e in links.values() for v in e["sync_us"])
        lines += ["Without the calibrated synchronisation lag (sync_s, median %.0f us here, which the model adds to "
                  "every collective): median |error| %.1f%%, worst %.1f%%, first choice within 5%% in %.0f%% of the "
                  "groups, Kendall tau median %.2f (mlacp-plan on each round's machine file with sync_s = 0)." % (
                      lag_us, 100 * no_lag["median_abs_error"], 100 * no_lag["worst_abs_error"],
                      100 * no_lag["first_choice_hit_rate"], no_lag["median_tau"] if no_lag["median_tau"] is not None
                      else float("nan")), ""]
    noisy = [r for r in rows if abs(r["error"]) > TARGET_WORST and r["iqr"] > TARGET_MEDIAN]
    if noisy:
        lines += ["Where noise exceeds a target: %d case(s) miss the worst-case target while their own rounds' "
                  "relative IQR is above the median target (%.0f%%), so this measurement cannot settle them: %s." % (
                      len(noisy), 100 * TARGET_MEDIAN, "; ".join(
                          "%s %s %s: error %+.0f%%, IQR %.0f%%, rounds max/min %.2f" % (
                              r["link"], r["shape"], r["choice"], 100 * r["error"], 100 * r["iqr"], r["spread"])
                          for r in noisy)), ""]
    if statistics.median(iqrs) > TARGET_MEDIAN:
        lines += ["The median case's rounds spread by %.0f%% (IQR): more than the %.0f%% median-error target "
                  "itself." % (100 * statistics.median(iqrs), 100 * TARGET_MEDIAN), ""]
    unresolved = [g for g in group_rows if not g["resolved"]]
    if unresolved:
        lines += ["%d group(s) miss the 5%% first-choice target by less than their cases' own IQR (the measurement "
                  "does not resolve the order): %s." % (len(unresolved), "; ".join(
                      "%s: regret %.0f%%, IQR %.0f%%" % (fmt_group(g).replace(" | ", "/"), 100 * g["regret"],
                                                         100 * g["noise_iqr"]) for g in unresolved)), ""]

    lines += ["## Links", "",
              "The rate each testbed achieved: the calibrated beta of the level the two ranks talk over (inter-node; "
              "intra-node for shm), over the rounds' calibrations; beside it the rate of the calibration's own 4 MiB "
              "ping-pong between the nodes.", "",
              "| link | rounds | Gbit/s median (min - max) | ping-pong Gbit/s median | alpha us median | sync lag us "
              "median | overlap efficiency median |", "|---|---|---|---|---|---|---|"]
    order = {"500mbit": 0, "2gbit": 1, "10gbit": 2, "shm": 3}
    for link in sorted(links, key=lambda k: order.get(k, 9)):
        e = links[link]
        g = e["gbit"]
        pp = e["pingpong_gbit"]
        lines.append("| %s | %d | %s | %s | %.1f | %.0f | %.2f |" % (
            link, len(e["alpha_us"]), "%.2f (%.2f - %.2f)" % (statistics.median(g), min(g), max(g)) if g else "-",
            "%.2f" % statistics.median(pp) if pp else "-",
            statistics.median(e["alpha_us"]), statistics.median(e["sync_us"]), statistics.median(e["overlap"])))
    lines += ["", "## Groups", "",
              "A group: the choices of strategy, U, C and layout for one (link, shape, dtype, wire, q-LoRA). Regret: "
              "the measured time of the model's first choice over the measured best, minus 1. Noise: the larger "
              "relative IQR of the two.", "",
              "| link | shape | dtype | wire | Rq | choices | tau | model's first | measured best | regret | noise | "
              "within 5% |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for g in group_rows:
        lines.append("| %s | %d | %.2f | %s | %s | %.1f%% | %.0f%% | %s |" % (
            fmt_group(g), g["choices"], g["tau"], g["pick"], g["best"], 100 * g["regret"], 100 * g["noise_iqr"],
            "yes" if g["ok"] else "no"))
    lines += ["", "## Cases", "",
              "| link | shape | dtype | wire | Rq | choice | rounds | measured ms | predicted ms | error | rounds "
              "max/min | IQR | hidden | predicted ms, sync_s = 0 | memory predicted / measured MiB |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %s | %s | %s | %s | %s | %d | %.2f | %.2f | %+.1f%% | %.2f | %.1f%% | %.0f%% | %s | "
                     "%.1f / %.1f |" % (
                         r["link"], r["shape"], r["dtype"], r["wire"], r["q_lora"] or "-", r["choice"], r["rounds"],
                         r["measured_s"] * 1e3, r["predicted_s"] * 1e3, 100 * r["error"], r["spread"],
                         100 * r["iqr"], 100 * r["hidden"],
                         "%.2f" % (r["predicted_no_lag_s"] * 1e3) if r["predicted_no_lag_s"] is not None else "-",
                         r["memory_predicted"] / 2**20, r["memory_measured"] / 2**20))
    if skipped:
        lines += ["", "Skipped (no measurement or no prediction): " + ", ".join(skipped)]
    text = "\n".join(lines) + "\n"

    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "validation.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "validation.json"), "w") as f:
        json.dump(dict(cpu=cpu, environment=environment, targets=dict(median_abs_error=TARGET_MEDIAN,
                                                                      worst_abs_error=TARGET_WORST,
                                                                      first_choice_hit_rate=TARGET_HIT),
                       median_abs_error=median_err, worst_abs_error=worst_err, first_choice_hit_rate=hit,
                       median_regret=statistics.median(regrets), worst_regret=max(regrets),
                       median_tau=statistics.median(taus) if taus else None, min_tau=min(taus) if taus else None,
                       median_round_iqr=statistics.median(iqrs), median_round_spread=statistics.median(spreads),
                       memory_ratio=dict(min=min(mem_ratio), median=statistics.median(mem_ratio), max=max(mem_ratio))
                       if mem_ratio else None,
                       without_sync_lag=no_lag,
                       links={k: v for k, v in links.items()}, groups=group_rows, rows=rows, skipped=skipped,
                       previous=previous), f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6.5, 6))
        colors = {"500mbit": "tab:red", "2gbit": "tab:orange", "10gbit": "tab:green", "shm": "tab:blue"}
        markers = {("latent", 1): "o", ("expanded", 1): "s", ("latent", 2): "^", ("expanded", 2): "D"}
        for r in rows:
            lo_r, hi_r = min(r["measured_rounds_s"]) * 1e3, max(r["measured_rounds_s"]) * 1e3
            y = r["predicted_s"] * 1e3
            ax.plot([lo_r, hi_r], [y, y], "-", c=colors.get(r["link"], "k"), lw=0.6, alpha=0.6)
            ax.scatter(r["measured_s"] * 1e3, y, marker=markers.get((r["strategy"], r["ring"]), "x"),
                       c=colors.get(r["link"], "k"), s=22)
        lo = min(min(r["best_s"], r["predicted_s"]) for r in rows) * 1e3 * 0.8
        hi = max(max(max(r["measured_rounds_s"]), r["predicted_s"]) for r in rows) * 1e3 * 1.25
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        ax.plot([lo, hi], [lo * 1.25, hi * 1.25], "k:", lw=0.6)
        ax.plot([lo, hi], [lo / 1.25, hi / 1.25], "k:", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel("measured forward + backward (ms; median, bar: the rounds' range)")
        ax.set_ylabel("predicted (ms)")
        ax.set_title("mlacp model, P = 2, one rank per core: o latent flat, s expanded flat, ^ latent ring, "
                     "D expanded ring\nred 0.5, orange 2, green 10 Gbit/s, blue shm; dotted +-25%%\n%s" % cpu,
                     fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "validation.png"), dpi=120)
    except ImportError:
        print("validate_report: matplotlib not found, no plot", file=sys.stderr)
    for path in no_lag_cache.values():
        os.unlink(path)
    print(text)


if __name__ == "__main__":
    main()
