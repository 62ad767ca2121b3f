# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The parameter table (one list for C++ and Python), parameters changed between forward and backward (raised on
every rank before the C++ backward reads the old storage or writes a gradient of the wrong dtype), and the module's
read-only configuration."""
import copy

import pytest
import torch
from conftest import small_config

import mlacp
from mlacp.parameters import BIAS_NAMES, PARAMETER_NAMES, parameter_shapes, parameter_table


def last(comm):
    return comm.rank == comm.size - 1


def spec_shapes(c, bias):
    """docs/spec.md's "Weights" table, written out (w_q only without q-LoRA, w_qa, g_q, w_qb only with it)."""
    H, D, R, qk, kv, Rq = c.heads, c.hidden, c.latent, c.nope + c.rope, c.nope + c.vdim, c.q_lora_rank
    shapes = {"w_q": (H * qk, D), "b_q": (H * qk,), "w_kva": (R + c.rope, D), "g_kv": (R,), "w_kvb": (H * kv, R),
              "b_kvb": (H * kv,), "w_o": (D, H * c.vdim), "b_o": (D,), "w_qa": (Rq, D), "g_q": (Rq,),
              "w_qb": (H * qk, Rq)}
    q_lora = ("w_qa", "g_q", "w_qb")
    return {
        n: s
        for n, s in shapes.items()
        if (bias or not n.startswith("b_")) and (n != "w_q" if Rq else n not in q_lora)
    }


@pytest.mark.parametrize("q_lora_rank", [0, 8], ids=["dense", "qlora"])
@pytest.mark.parametrize("bias", [False, True])
def test_python_table_is_the_cpp_table(mesh, bias, q_lora_rank):
    c = small_config(bias=bias, q_lora_rank=q_lora_rank)
    rows = mlacp._mlacp.parameter_table(c)
    assert [r[0] for r in rows] == list(PARAMETER_NAMES) == [
        "w_q", "b_q", "w_kva", "g_kv", "w_kvb", "b_kvb", "w_o", "b_o", "w_qa", "g_q", "w_qb"
    ]
    assert BIAS_NAMES == ("b_q", "b_kvb", "b_o")
    assert parameter_shapes(c) == {r[0]: r[1] for r in rows if r[2]} == spec_shapes(c, bias)
    for row in parameter_table(c):
        assert row.present == (row.name in spec_shapes(c, bias))
        assert row.gradient == "accumulation"
        assert hasattr(mlacp.MlaRequiresGrad(), row.flag)
    layer = mlacp.MlaAttention(c, mesh, dtype=torch.float64, seed=2)
    assert {n: tuple(p.shape) for n, p in layer.named_parameters()} == spec_shapes(c, bias)
    assert [n for n, _ in layer.named_parameters()] == [r.name for r in parameter_table(c) if r.present]


def test_requires_grad_flags_follow_the_table():
    none = mlacp.MlaRequiresGrad.none()
    assert not none.x
    for row in parameter_table(small_config()):
        assert getattr(none, row.flag) is False and getattr(mlacp.MlaRequiresGrad(), row.flag) is True
        flags = mlacp.MlaRequiresGrad.none()
        setattr(flags, row.flag, True)
        assert [getattr(flags, r.flag) for r in parameter_table(small_config())] == [
            r.flag == row.flag for r in parameter_table(small_config())
        ]


def run_forward(layer, comm, dtype):
    c = layer.config
    x = torch.randn(c.batch, layer.local_seq, c.hidden, dtype=dtype, requires_grad=True)
    return x, layer(x)


# Each change swaps a parameter's storage under the Parameter that autograd saved; the C++ layer of the forward holds
# the old storage. `everywhere`: on every rank, else on the last rank only (the others must raise too).
CHANGES = {
    "half": (lambda layer: layer.half(), r"parameter w_q changed between forward and backward: its dtype changed "
             r"from torch.float32 to torch.float16"),
    "double": (lambda layer: layer.double(), r"parameter w_q changed between forward and backward: its dtype "
               r"changed from torch.float32 to torch.float64"),
    "clone": (lambda layer: setattr(layer.w_kvb, "data", layer.w_kvb.data.clone()),
              r"parameter w_kvb changed between forward and backward: its storage was replaced"),
    "reshape": (lambda layer: setattr(layer.g_kv, "data", torch.ones(layer.g_kv.shape[0] + 1)),
                r"parameter g_kv changed between forward and backward: its shape changed from \[12\] to \[13\]"),
}


@pytest.mark.parametrize("everywhere", [True, False])
@pytest.mark.parametrize("change", sorted(CHANGES))
def test_parameter_changed_between_forward_and_backward_raises_on_every_rank(comm, mesh, change, everywhere):
    layer = mlacp.MlaAttention(small_config(), mesh, dtype=torch.float32, seed=3)
    x, y = run_forward(layer, comm, torch.float32)
    spoil, message = CHANGES[change]
    if everywhere or last(comm):
        spoil(layer)
    with pytest.raises(mlacp.InvalidArgument, match=message):
        y.backward(torch.ones_like(y))
    # Nothing was written: no gradient reached a parameter or x.
    assert x.grad is None and all(p.grad is None for p in layer.parameters())
    if change in ("half", "reshape") or not everywhere:
        return  # fp16, a wrong shape and a storage replaced on one rank only are refused by the next forward
    # The next forward rebuilds the layer over the new storage and runs.
    dtype = layer.w_q.dtype
    x, y = run_forward(layer, comm, dtype)
    y.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == dtype and torch.isfinite(p.grad).all()
               for p in layer.parameters())


def test_x_changed_between_forward_and_backward_raises(comm, mesh):
    layer = mlacp.MlaAttention(small_config(), mesh, dtype=torch.float64, seed=4)
    x, y = run_forward(layer, comm, torch.float64)
    if last(comm):
        x.data = x.data.clone()
    with pytest.raises(mlacp.InvalidArgument, match=r"x changed between forward and backward: its storage was "
                       r"replaced"):
        y.backward(torch.ones_like(y))


def test_unchanged_parameters_still_run_and_in_place_updates_are_torchs(comm, mesh):
    layer = mlacp.MlaAttention(small_config(), mesh, dtype=torch.float64, seed=5)
    x, y = run_forward(layer, comm, torch.float64)
    y.sum().backward()
    assert x.grad is not None and layer.w_q.grad.dtype == torch.float64


@pytest.mark.parametrize("field,value", [("cu_seqlens", [0, 8, 16]), ("rope_base", 500.0), ("rms_eps", 1e-5),
                                         ("seq", 32), ("bias", True), ("strategy", "expanded")])
def test_config_is_read_only(mesh, field, value):
    layer = mlacp.MlaAttention(small_config(), mesh, dtype=torch.float64, seed=6)
    before = getattr(layer.config, field)
    with pytest.raises(AttributeError, match=f"config.{field} cannot be assigned: the configuration is fixed at "
                       "construction"):
        setattr(layer.config, field, value)
    assert getattr(layer.config, field) == before
    if field == "cu_seqlens":
        with pytest.raises(AttributeError, match=r"pass cu_seqlens= to forward"):
            layer.config.cu_seqlens = value
        with pytest.raises(AttributeError):
            layer.config.cu_seqlens.append(16)  # a tuple: no in-place edit either


def test_config_reads_like_a_config_and_copies_are_mutable(mesh):
    c = small_config(rope_base=500.0)
    layer = mlacp.MlaAttention(c, mesh, dtype=torch.float64, seed=6)
    assert isinstance(layer.config, mlacp.MlaConfig)
    assert layer.config.rope_base == 500.0 and layer.config.seq == c.seq and layer.config.qk_dim() == c.qk_dim()
    assert layer.config.describe() == c.describe() and layer.config.error(mesh.size) == ""
    with pytest.raises(AttributeError, match=r"config cannot be assigned: the configuration is fixed at construction"):
        layer.config = small_config()
    for changed in (mlacp.MlaConfig(layer.config), copy.copy(layer.config)):
        changed.rope_base = 10.0
        assert changed.rope_base == 10.0 and layer.config.rope_base == 500.0
    # The caller's config is the caller's: changing it after construction changes nothing in the module.
    c.rope_base = 1.0
    assert layer.config.rope_base == 500.0
