#!/usr/bin/python3
"""Checks train_mla's per-step losses: the reference run (P = 1, the first file) falls, and every other run (P = 2,
4, ...) has the same number of steps and matches it step by step within a relative tolerance (float rounding: the
ranks sum the same terms in another order).

    /usr/bin/python3 examples/check_losses.py losses_np1.txt losses_np2.txt losses_np4.txt [--rtol 1e-4]

Each file has one line per step: "step loss". Pure Python.
"""
import argparse
import sys


def read(path):
    with open(path) as f:
        return [float(line.split()[1]) for line in f if line.strip()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("reference")
    parser.add_argument("others", nargs="*")
    parser.add_argument("--rtol", type=float, default=1e-5)
    parser.add_argument("--min-drop", type=float, default=0.5, help="the last loss must be below this fraction of the first")
    args = parser.parse_args()
    failures = []
    ref = read(args.reference)
    if len(ref) < 2:
        failures.append("%s: %d step(s); expected at least 2" % (args.reference, len(ref)))
    else:
        rising = [i for i in range(1, len(ref)) if not ref[i] < ref[i - 1]]
        if rising:
            failures.append("%s: the loss does not fall at step(s) %s: %s" % (args.reference, rising, ref))
        if not ref[-1] < args.min_drop * ref[0]:
            failures.append("%s: the last loss %.6e is not below %g x the first %.6e"
                            % (args.reference, ref[-1], args.min_drop, ref[0]))
    for path in args.others:
        losses = read(path)
        if len(losses) != len(ref):
            failures.append("%s: %d steps; the reference has %d" % (path, len(losses), len(ref)))
            continue
        for step, (a, b) in enumerate(zip(losses, ref)):
            if abs(a - b) > args.rtol * abs(b):
                failures.append("%s: step %d loss %.9e differs from the reference %.9e by %.2e (relative; tolerance %g)"
                                % (path, step, a, b, abs(a - b) / abs(b), args.rtol))
    for f in failures:
        print("check_losses: FAIL " + f)
    if failures:
        sys.exit(1)
    print("check_losses: OK: %d steps, loss %.6e -> %.6e, %d run(s) match the reference within %g"
          % (len(ref), ref[0], ref[-1], len(args.others), args.rtol))


if __name__ == "__main__":
    main()
