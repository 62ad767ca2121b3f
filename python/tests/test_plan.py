# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp.plan and mlacp.read_machine: the same table as ``mlacp-plan --json`` for the same inputs (the tool's path in
MLACP_PLAN_TOOL, the machine file in MLACP_PLAN_MACHINE; python/CMakeLists.txt sets both), and errors that name the
value."""
import json
import math
import os
import subprocess

import pytest

import mlacp

TOOL = os.environ.get("MLACP_PLAN_TOOL", "")
MACHINE = os.environ.get("MLACP_PLAN_MACHINE", "")

needs_files = pytest.mark.skipif(not (os.path.exists(TOOL) and os.path.exists(MACHINE)),
                                 reason="MLACP_PLAN_TOOL / MLACP_PLAN_MACHINE not set (run through ctest)")

# A small DeepSeek-like layer that 8 ranks (2 nodes x 4) can run every way.
DIMS = dict(batch=1, seq=4096, hidden=1024, heads=16, nope=64, rope=32, vdim=64, latent=256)
FLAGS = {"batch": "--batch", "seq": "--seq", "hidden": "--hidden", "heads": "--heads", "nope": "--nope",
         "rope": "--rope", "vdim": "--vdim", "latent": "--latent"}


def run_tool(tmp_path, dims=DIMS, dtype="float", nodes=2, ranks_per_node=4, extra=()):
    """mlacp-plan on the same inputs: (exit status, stdout + stderr, the --json document)."""
    out = tmp_path / "plan.json"
    argv = [TOOL, "--dtype", dtype, "--nodes", str(nodes), "--ranks-per-node", str(ranks_per_node), "--machine",
            MACHINE, "--json", str(out)]
    for key, value in dims.items():
        argv += [FLAGS[key], str(value)]
    argv += list(extra)
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    document = json.loads(out.read_text()) if out.exists() else None
    return done.returncode, done.stdout + done.stderr, document


def assert_same_rows(rows, document):
    """mlacp.plan's rows against mlacp-plan's --json rows (the same keys and numbers, its layout "none" where
    mlacp.plan's is None)."""
    expected = document["rows"]
    assert len(rows) == len(expected) > 0
    for row, other in zip(rows, expected):
        # Every number exactly: the JSON holds doubles at full precision.
        for key in ("strategy", "ulysses", "ring", "fits", "forward_s", "backward_s", "total_s", "compute_s",
                    "communication_s", "exposed_s", "hidden_fraction", "bytes_intra", "bytes_inter", "memory_bytes"):
            assert row[key] == other[key], (key, row, other)
        assert row["layout"] == (None if other["layout"] == "none" else other["layout"]), (row, other)
        assert row["why_not"] == other["why_not"], (row, other)


@needs_files
def test_same_table_as_the_tool(tmp_path):
    rows = mlacp.plan(**DIMS, dtype="float", nodes=2, ranks_per_node=4, machine=MACHINE)
    code, output, document = run_tool(tmp_path)
    assert code == 0, output
    assert_same_rows(rows, document)
    assert rows.best is rows[0] and rows[0]["fits"]
    assert output.startswith(rows.text)
    assert json.loads(rows.json) == document
    # The ranking: those that fit by total time.
    fitting = [row["total_s"] for row in rows if row["fits"]]
    assert fitting == sorted(fitting)
    for row in rows:
        assert row["ulysses"] * row["ring"] == 8
        assert math.isclose(row["total_s"], row["forward_s"] + row["backward_s"], rel_tol=1e-12)
        assert row["layout"] is None or row["ring"] > 1


@needs_files
def test_same_table_restricted_bf16_q_lora(tmp_path):
    config = mlacp.MlaConfig(**DIMS, cu_seqlens=[0, 1000, 4096])
    rows = mlacp.plan(config, dtype="bf16", nodes=2, ranks_per_node=4, machine=MACHINE, q_lora=384,
                      strategy="latent", layout="contiguous", memory_per_rank="8GiB")
    code, output, document = run_tool(tmp_path, dtype="bf16",
                                      extra=("--cu-seqlens", "0,1000,4096", "--q-lora", "384", "--strategy", "latent",
                                             "--layout", "contiguous", "--memory-per-rank", "8GiB"))
    assert code == 0, output
    assert_same_rows(rows, document)
    assert rows.budget == 8 * 2**30
    assert {row["strategy"] for row in rows} == {"latent"}
    assert {row["layout"] for row in rows if row["ring"] > 1} <= {"contiguous"}


@needs_files
def test_config_keywords_and_machine_dict_agree():
    by_keywords = mlacp.plan(**DIMS, dtype="double", nodes=1, ranks_per_node=4, machine=MACHINE)
    machine = mlacp.read_machine(MACHINE)
    assert machine["ranks_per_node"] == 4 and "float" in machine["gemm"]
    by_config = mlacp.plan(mlacp.MlaConfig(**DIMS), dtype="double", nodes=1, ranks_per_node=4, machine=machine)
    assert list(by_config) == list(by_keywords)
    ring2 = mlacp.plan(**DIMS, nodes=1, ranks_per_node=4, machine=MACHINE, ring=2)
    assert ring2 and all(row["ring"] == 2 and row["ulysses"] == 2 for row in ring2)


@needs_files
def test_memory_budget_nothing_fits(tmp_path):
    rows = mlacp.plan(**DIMS, nodes=2, ranks_per_node=4, machine=MACHINE, memory_per_rank=1024)
    assert rows.best is None
    assert rows and not any(row["fits"] for row in rows)
    assert all(row["why_not"] for row in rows)
    code, output, document = run_tool(tmp_path, extra=("--memory-per-rank", "1KiB"))
    assert code == 1, output
    assert "no choice fits the memory budget" in output
    assert_same_rows(rows, document)


@needs_files
@pytest.mark.parametrize("kwargs, named", [
    (dict(dtype="half"), "half"),
    (dict(strategy="sideways"), "sideways"),
    (dict(layout="spiral"), "spiral"),
    (dict(memory_per_rank="80 parsecs"), "80 parsecs"),
    (dict(memory_per_rank=-1.0), "memory_per_rank=-1"),
    (dict(nodes=0), "nodes=0"),
    (dict(ring=-2), "ring=-2"),
    (dict(machine="/nonexistent/machine.json"), "/nonexistent/machine.json"),
])
def test_errors_name_the_value(kwargs, named):
    arguments = dict(DIMS, nodes=2, ranks_per_node=4, machine=MACHINE)
    arguments.update(kwargs)
    with pytest.raises(mlacp.InvalidArgument, match=named):
        mlacp.plan(**arguments)


@needs_files
def test_invalid_layer_and_machine_raise():
    with pytest.raises(mlacp.InvalidArgument, match="heads"):
        mlacp.plan(**dict(DIMS, heads=0), nodes=2, ranks_per_node=4, machine=MACHINE)
    machine = mlacp.read_machine(MACHINE)
    machine["intra"]["alpha_s"] = "fast"
    with pytest.raises(mlacp.InvalidArgument, match="alpha_s"):
        mlacp.plan(**DIMS, nodes=2, ranks_per_node=4, machine=machine)
    with pytest.raises(mlacp.InvalidArgument, match="/nonexistent/machine.json"):
        mlacp.read_machine("/nonexistent/machine.json")
    with pytest.raises(TypeError):
        mlacp.plan(mlacp.MlaConfig(**DIMS), heads=4, machine=MACHINE)
