#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""This CPU's bf16 capability, printed beside scripts/bench.sh's bf16 cells and written to its JSON summary.

usage: cpu_bf16_caps.py [--json FILE] [--binary PATH] [--no-torch]

What it reports (each probe on its own: one that cannot run says why, and the script still exits 0):
  * the CPU model (lscpu, else /proc/cpuinfo) and whether its flags include avx512_bf16, amx_bf16 and amx_tile
    (the bf16 dot-product and tile instructions bf16 GEMMs use), with avx512f / avx512bw / avx2 for context;
  * the instruction set oneDNN dispatches to: dnnl_get_effective_cpu_isa() of libdnnl.so.2 (the library mlacp's
    bf16 GEMM and Debian's torch both use; mlacp-perf-bf16-gemm prints the same value), which honours
    ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA (ONEDNN_MAX_CPU_ISA=AVX2 emulates a CPU without bf16 instructions);
  * the kernel torch's bf16 matmul runs: a small bf16 torch.mm in a subprocess under ONEDNN_VERBOSE=1, whose
    "exec" line names the oneDNN implementation (e.g. brg:avx512_core_bf16); none means torch did not call oneDNN;
  * OpenBLAS' core (openblas_get_corename via ctypes on libopenblas.so.0: the BLAS TPL of mlacp's float GEMMs) and
    whether that OpenBLAS exports a bf16 GEMM (sbgemm_).
--binary PATH (e.g. build-release/src/mlacp-mla-block) adds the oneDNN and BLAS libraries that binary links (ldd).
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import re
import subprocess
import sys

FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f", "avx512bw", "avx2")
# Reported whether set or not; every other ONEDNN_* / DNNL_* / OPENBLAS_* variable is reported where set (an
# OPENBLAS_CORETYPE in the environment overrides the core OpenBLAS would pick for the CPU).
ENVIRONMENT = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
# dnnl_cpu_isa_t of oneDNN 2.x (dnnl_types.h); the names are those mlacp::onednn_cpu_isa() prints.
DNNL_ISA = {0x0: "all", 0x1: "sse41", 0x3: "avx", 0x7: "avx2", 0x407: "avx2_vnni", 0xf: "avx512_mic",
            0x1f: "avx512_mic_4ops", 0x27: "avx512_core", 0x67: "avx512_core_vnni", 0xe7: "avx512_core_bf16",
            0x3e7: "avx512_core_amx"}

TORCH_PROBE = """
import torch
torch.set_num_threads(1)
a = torch.rand(64, 64, dtype=torch.bfloat16)
torch.mm(a, a)
print("torch_version", torch.__version__)
print("mkldnn_available", torch.backends.mkldnn.is_available())
"""


def cpu_info():
    model, flags = None, set()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30, check=False).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        model = m.group(1).strip() if m else None
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    present = {flag: flag in flags for flag in FLAGS}
    return {"model": model or "unknown", "logical_cpus": os.cpu_count(), "flags": present,
            "bf16_instructions": present["avx512_bf16"] or present["amx_bf16"]}


def linked_libraries(binary):
    """{soname: resolved path} of the oneDNN / BLAS / OpenBLAS libraries `binary` links (ldd), and why not where
    ldd cannot tell (None when it can)."""
    try:
        run = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        return {}, str(error)
    if run.returncode != 0:
        return {}, (run.stderr.strip() or run.stdout.strip() or f"ldd exit code {run.returncode}")[:200]
    libs = {}
    for line in run.stdout.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(\S+)", line)
        if m and re.search(r"dnnl|blas|mkl", m.group(1)):
            libs[m.group(1)] = os.path.realpath(m.group(2)) if os.path.exists(m.group(2)) else m.group(2)
    return libs, None


def load(names):
    """The first of `names` (sonames or paths) that ctypes loads, and its name; (None, reasons) when none does."""
    reasons = []
    for name in names:
        try:
            return ctypes.CDLL(name), name
        except OSError as error:
            reasons.append(str(error))
    return None, "; ".join(reasons) or "not found"


def onednn(libs):
    lib, name = load([p for so, p in libs.items() if "dnnl" in so] + ["libdnnl.so.2", "libdnnl.so.3"])
    if lib is None:
        return {"available": False, "error": name}

    class Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                    ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint), ("gpu_runtime", ctypes.c_uint)]

    lib.dnnl_version.restype = ctypes.POINTER(Version)
    v = lib.dnnl_version().contents
    lib.dnnl_get_effective_cpu_isa.restype = ctypes.c_int
    isa = lib.dnnl_get_effective_cpu_isa()
    return {"available": True, "library": name, "version": f"{v.major}.{v.minor}.{v.patch}",
            "isa": DNNL_ISA.get(isa, hex(isa))}


def openblas(libs):
    lib, name = load([p for so, p in libs.items() if "openblas" in so] + ["libopenblas.so.0", "libopenblas.so"])
    if lib is None:
        return {"available": False, "error": name}
    doc = {"available": True, "library": name}
    for field, symbol in (("core", "openblas_get_corename"), ("config", "openblas_get_config")):
        try:
            getattr(lib, symbol).restype = ctypes.c_char_p
            doc[field] = getattr(lib, symbol)().decode()
        except AttributeError:
            doc[field] = None
    doc["sbgemm"] = hasattr(lib, "sbgemm_")  # OpenBLAS built with BUILD_BFLOAT16: a bf16-in, float-out GEMM
    return doc


def torch_matmul():
    """torch's version and the oneDNN kernel of a 64 x 64 bf16 matmul (ONEDNN_VERBOSE=1 in a fresh process, as
    oneDNN reads it once)."""
    env = dict(os.environ, ONEDNN_VERBOSE="1", OMP_NUM_THREADS="1")
    try:
        run = subprocess.run([sys.executable, "-c", TORCH_PROBE], capture_output=True, text=True, env=env, timeout=120,
                             check=False)
    except (OSError, subprocess.SubprocessError) as error:
        return {"available": False, "error": str(error)}
    if run.returncode != 0:
        tail = (run.stderr.strip().splitlines() or ["exit code %d" % run.returncode])[-1]
        return {"available": False, "error": tail[:200]}
    doc = {"available": True, "bf16_matmul_kernel": None, "onednn_isa": None}
    for line in run.stdout.splitlines():
        fields = line.split(",")
        if line.startswith("torch_version "):
            doc["version"] = line.split()[1]
        elif line.startswith("mkldnn_available "):
            doc["mkldnn_available"] = line.split()[1] == "True"
        elif line.startswith("onednn_verbose,info,cpu,isa:") or line.startswith("dnnl_verbose,info,cpu,isa:"):
            doc["onednn_isa"] = line.split("isa:", 1)[1].strip()
        elif len(fields) > 4 and fields[1] == "exec" and fields[3] == "matmul" and "bf16" in line:
            # onednn_verbose,exec,cpu,matmul,<implementation>,<prop kind>,<memory descriptors>,...
            doc["bf16_matmul_kernel"] = doc["bf16_matmul_kernel"] or fields[4]
    return doc


def summary_lines(caps):
    cpu = caps["cpu"]
    flags = cpu["flags"]
    yes = {True: "yes", False: "no"}
    lines = [f"CPU bf16 capability: {cpu['model']} ({cpu['logical_cpus']} logical CPUs)",
             "  flags: " + ", ".join(f"{f} {yes[flags[f]]}" for f in ("avx512_bf16", "amx_bf16", "amx_tile"))
             + " (" + ", ".join(f"{f} {yes[flags[f]]}" for f in ("avx512f", "avx512bw", "avx2")) + ")"]
    d = caps["onednn"]
    lines.append(f"  oneDNN {d['version']} ({d['library']}): dispatches to {d['isa']}" if d["available"]
                 else f"  oneDNN: not loadable ({d['error']})")
    t = caps.get("torch")
    if t is not None:
        if t["available"]:
            kernel = t["bf16_matmul_kernel"] or "none (torch did not call oneDNN)"
            lines.append(f"  torch {t.get('version')} bf16 matmul: {kernel} (mkldnn available: "
                         f"{yes.get(t.get('mkldnn_available'), '?')})")
        else:
            lines.append(f"  torch: probe failed ({t['error']})")
    b = caps["openblas"]
    lines.append(f"  OpenBLAS core {b['core']} ({b['config']}); bf16 GEMM (sbgemm): {yes[b['sbgemm']]}"
                 if b["available"] else f"  OpenBLAS: not loadable ({b['error']})")
    if caps.get("binary"):
        linked = ", ".join(f"{k} -> {v}" for k, v in caps["linked"].items()) or "no oneDNN/BLAS shared library"
        lines.append(f"  {caps['binary']}: " + (f"ldd failed ({caps['ldd_error']})" if caps.get("ldd_error")
                                                 else f"links {linked}"))
    lines.append("  environment: " + " ".join(f"{k}={v if v is not None else '(unset)'}"
                                             for k, v in caps["environment"].items()))
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="FILE", help="write the result as JSON")
    p.add_argument("--binary", metavar="PATH", help="also report the oneDNN / BLAS libraries this binary links")
    p.add_argument("--no-torch", action="store_true", help="skip the torch probe")
    args = p.parse_args(argv)
    linked, ldd_error = linked_libraries(args.binary) if args.binary else ({}, None)
    environment = {k: os.environ.get(k) for k in ENVIRONMENT}
    environment.update({k: v for k, v in sorted(os.environ.items()) if re.match(r"(ONEDNN|DNNL|OPENBLAS)_", k)})
    caps = {"cpu": cpu_info(), "environment": environment}
    for key, probe in (("onednn", onednn), ("torch", torch_matmul), ("openblas", openblas)):
        if key == "torch" and args.no_torch:
            continue
        try:
            caps[key] = probe(linked) if probe is not torch_matmul else probe()
        except (OSError, AttributeError, ValueError) as error:  # a library without the symbol, an odd answer
            caps[key] = {"available": False, "error": f"{type(error).__name__}: {error}"}
    if args.binary:
        caps["binary"], caps["linked"] = args.binary, linked
        if ldd_error:
            caps["ldd_error"] = ldd_error
    print("\n".join(summary_lines(caps)), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(caps, out, indent=1)
            out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
