#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Compares two runs of the test suite value by value: the directories that MLACP_TEST_DUMP_DIR named
(unit_tests/mla_test_data.hpp writes every tensor a test reads back through host_values()).

    MLACP_TEST_DUMP_DIR=/tmp/before ctest ...     # on the commit before a refactor
    MLACP_TEST_DUMP_DIR=/tmp/after  ctest ...     # on the refactor
    scripts/compare_test_dumps.py /tmp/before /tmp/after [--tolerance 1e-14] [--allow PATTERN ...]

A read is keyed by its test's name, the read's index within the test and the world size and rank; a key read more
than once (one test in several runs of one rank count) is compared as a multiset. Prints how many reads are
bit-identical, lists every other one with its largest relative difference, and exits 1 when one differs beyond
--tolerance (default 0: bit for bit) outside the tests that match an --allow pattern (those are held to
--allowed-tolerance, default 1e-14: reference kernels whose summation order changed)."""
import argparse
import collections
import fnmatch
import hashlib
import os
import struct
import sys

import numpy as np


def read_dir(path):
    reads = collections.defaultdict(list)
    for name in sorted(os.listdir(path)):
        if not name.startswith("values."):
            continue
        _, size, rank, _pid, _ = name.split(".")
        with open(os.path.join(path, name), "rb") as f:
            data = f.read()
        off = 0
        while off < len(data):
            (klen,) = struct.unpack_from("<Q", data, off)
            off += 8
            key = data[off:off + klen].decode()
            off += klen
            (n,) = struct.unpack_from("<Q", data, off)
            off += 8
            values = np.frombuffer(data, dtype="<f8", count=n, offset=off)
            off += 8 * n
            reads[(key, int(size), int(rank))].append(values)
    return reads


def digest(v):
    return hashlib.sha1(v.tobytes()).hexdigest()


def max_rel(a, b):
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    both_nan = np.isnan(a) & np.isnan(b)
    d = np.where(both_nan, 0.0, np.abs(a - b))
    scale = max(float(np.max(np.abs(b[~np.isnan(b)]))) if np.any(~np.isnan(b)) else 0.0, 1e-300)
    return float(np.max(d)) / scale


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--tolerance", type=float, default=0.0)
    ap.add_argument("--allow", action="append", default=[], help="test-name pattern (fnmatch) held to --allowed-tolerance")
    ap.add_argument("--allowed-tolerance", type=float, default=1e-14)
    args = ap.parse_args()
    before, after = read_dir(args.before), read_dir(args.after)
    identical = differ = failed = 0
    missing = sorted(set(before) ^ set(after))
    for key in sorted(set(before) & set(after)):
        a = sorted(after[key], key=digest)
        b = sorted(before[key], key=digest)
        if len(a) != len(b):
            missing.append(key)
            continue
        for va, vb in zip(a, b):
            if va.shape == vb.shape and va.tobytes() == vb.tobytes():
                identical += 1
                continue
            differ += 1
            rel = max_rel(va, vb)
            allowed = any(fnmatch.fnmatch(key[0].split("#")[0], p) for p in args.allow)
            limit = args.allowed_tolerance if allowed else args.tolerance
            bad = rel > limit
            failed += bad
            print(f"{'DIFFERS' if bad else 'within '} {key[0]} np={key[1]} rank={key[2]}: max relative {rel:.3e}"
                  f" (limit {limit:g})")
    for key in missing:
        print(f"MISSING {key[0]} np={key[1]} rank={key[2]}: read in one run only (or a different number of times)")
    print(f"{identical} reads bit-identical, {differ} differ ({failed} beyond their limit), {len(missing)} unmatched;"
          f" {len(before)} keys before, {len(after)} after")
    sys.exit(1 if failed or missing else 0)


if __name__ == "__main__":
    main()
