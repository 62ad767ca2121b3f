# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp.plan: the performance model's planner (the table ``mlacp-plan`` prints), and mlacp.read_machine."""
import json
import os
import re

from . import _mlacp

_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20,
               "gib": 2**30, "tib": 2**40}


def _bytes(value):
    """A byte count: a number, or a string with an optional unit as mlacp-plan's --memory-per-rank takes it
    ("80GiB", "512MiB", "1.5e9")."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9.]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*", value)
        unit = match.group(2).lower() if match else None
        if unit not in _BYTE_UNITS:
            raise _mlacp.InvalidArgument(f"mlacp.plan: memory_per_rank={value!r}; expected a byte count, a number "
                                         f"with an optional unit (e.g. '80GiB', '512MiB', 1.5e9)")
        return float(match.group(1)) * _BYTE_UNITS[unit]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"mlacp.plan: memory_per_rank is a {type(value).__name__}; expected a number of bytes or a "
                        f"string such as '80GiB'")
    return float(value)


class Plan(list):
    """The rows of a plan, ranked (a list of dicts): the choices that fit the memory budget by predicted forward +
    backward time, then those that do not (by memory). ``text`` is the table mlacp-plan prints, ``json`` what its
    --json writes, ``machine`` the machine's name, ``budget`` the memory budget applied (bytes; 0: none) and
    ``best`` the first row that fits (None when none does)."""

    def __init__(self, result):
        super().__init__(result["rows"])
        self.text = result["text"]
        self.json = result["json"]
        self.machine = result["machine"]
        self.budget = result["budget"]

    @property
    def best(self):
        return next((row for row in self if row["fits"]), None)


def plan(config=None, *, machine, dtype="float", nodes=1, ranks_per_node=1, memory_per_rank=0, q_lora=0,
         strategy=None, ring=0, layout=None, **dims):
    """Every (strategy, U x C, layout) that can run an MLA layer on ``nodes`` x ``ranks_per_node`` ranks, ranked by
    the performance model's predicted forward + backward time on ``machine`` (mlacp/model/planner.hpp; the same
    table as ``mlacp-plan``).

    The layer is an ``mlacp.MlaConfig`` or its dimensions as keywords (``batch``, ``seq``, ``hidden``, ``heads``,
    ``nope``, ``rope``, ``vdim``, ``latent``, optionally ``cu_seqlens``); its strategy and ring layout are ignored
    (the plan enumerates them). ``dtype`` is "double", "float" or "bf16". ``machine`` is a machine file's path (what
    ``mlacp-plan --calibrate`` writes) or its contents as a dict (``mlacp.read_machine``). ``memory_per_rank`` is the
    budget in bytes (a number or a string such as "80GiB"; 0: the machine's ``memory_per_rank_bytes``, 0 there: no
    limit). ``q_lora`` > 0 models a low-rank query projection of rank Rq; ``strategy`` ("latent" / "expanded"),
    ``ring`` (C; 0: any) and ``layout`` ("zigzag" / "contiguous") restrict the choices.

    Returns a ``Plan``: a list with one dict per choice, ranked, with the keys ``choice`` (its description),
    ``strategy``, ``ulysses`` (U), ``ring`` (C), ``layout`` (None when C = 1), ``forward_s``, ``backward_s``,
    ``total_s``, ``compute_s``, ``communication_s`` (the collectives' modelled times, summed), ``exposed_s`` (what
    compute waited for them), ``hidden_fraction`` (of the communication, behind compute), ``bytes_intra`` and ``bytes_inter`` (one
    rank's collective bytes per forward + backward within and between nodes), ``memory_bytes`` (per rank),
    ``fits`` and ``why_not`` ("" when it fits). Raises ``mlacp.InvalidArgument`` naming the value when the request
    cannot be planned (the layer, the cluster, the machine).
    """
    if config is None:
        config = _mlacp.MlaConfig(**dims)
    elif dims:
        raise TypeError(f"mlacp.plan: pass an MlaConfig or the dimensions as keywords, not both (got "
                        f"{', '.join(sorted(dims))} with {config!r})")
    elif not isinstance(config, _mlacp.MlaConfig):
        raise TypeError(f"mlacp.plan: config is a {type(config).__name__}; expected an mlacp.MlaConfig")
    if not isinstance(dtype, str):
        raise TypeError(f"mlacp.plan: dtype is a {type(dtype).__name__}; expected 'double', 'float' or 'bf16'")
    if isinstance(machine, dict):
        machine_path, machine_json = "", json.dumps(machine)
    elif isinstance(machine, (str, os.PathLike)):
        machine_path, machine_json = os.fspath(machine), ""
        if not machine_path:
            raise _mlacp.InvalidArgument("mlacp.plan: machine=''; expected a machine file's path or its dict")
    else:
        raise TypeError(f"mlacp.plan: machine is a {type(machine).__name__}; expected a machine file's path or "
                        f"its contents as a dict")
    return Plan(_mlacp._plan(config, dtype, nodes, ranks_per_node, machine_path, machine_json,
                             _bytes(memory_per_rank), q_lora, strategy, ring, layout))


def read_machine(path):
    """A machine file (what ``mlacp-plan --calibrate`` writes) as a dict, read and checked as mlacp.plan reads it
    (the members of mlacp::model::MachineParams); raises ``mlacp.InvalidArgument`` naming the path and the key when
    it cannot be used."""
    return json.loads(_mlacp._read_machine(os.fspath(path)))
