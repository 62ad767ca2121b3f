# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""A rank-local failure reaches every rank (issue 19, defect 7): x edited in place on the last rank only is caught
there by torch's saved-tensor check. On a checked mesh the backward's agreement makes every rank raise that rank's
error (mlacp.UsageError) and the mesh stays usable; unchecked (no agreement), the failing rank reports it on the mesh
and the other ranks, already waiting in mlacp's backward, raise mlacp.CommunicationError naming it instead of waiting
forever, and later calls on the broken mesh raise at once."""
import time

import pytest
import torch
from conftest import small_config

import mlacp


def edit_in_place_on_the_last_rank(comm, checked):
    own = comm.Dup()  # a mesh this test may break is the only one on its communicator
    mesh = mlacp.Mesh(own)
    mesh.checked = checked
    layer = mlacp.MlaAttention(small_config(), mesh, dtype=torch.float64, seed=1)
    c = layer.config
    x = torch.randn(c.batch, c.seq // comm.size, c.hidden, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    # Every rank past the forward before the last one fails: a rank still waiting in the forward's O all-to-all when
    # the failure is reported would raise there (the report ends every wait on the mesh), outside what the test checks.
    comm.Barrier()
    failing = comm.size - 1
    if comm.rank == failing:
        with torch.no_grad():
            x.add_(1.0)  # after the forward saved it: torch's version check refuses the backward on this rank
    return mesh, layer, y, failing


def test_in_place_edit_on_one_rank_checked(comm):
    mesh, layer, y, failing = edit_in_place_on_the_last_rank(comm, True)
    named = f".*raised on rank {failing} of" if comm.size > 1 else ""
    with pytest.raises(mlacp.UsageError, match="modified by an inplace operation" + named):
        y.sum().backward()
    assert not mesh.broken
    x = torch.randn(layer.config.batch, layer.config.seq // comm.size, layer.config.hidden, dtype=torch.float64,
                    requires_grad=True)
    layer(x).sum().backward()  # the mesh still works
    comm.Barrier()


def count_agreements(monkeypatch):
    """Counts the Python side's agreements (mesh.agree -> _mlacp._agree), each with its `usage` flag."""
    calls = []
    agree = mlacp._mlacp._agree

    def counting(mesh, where, local_error, fields, context, usage):
        calls.append((where, usage))
        return agree(mesh, where, local_error, fields, context, usage)

    monkeypatch.setattr(mlacp._mlacp, "_agree", counting)
    return calls


def test_backward_runs_one_agreement(comm, mesh, monkeypatch):
    """The backward's verdicts (torch's saved-tensor check, a usage error, and the storage check, an invalid
    argument) travel in one agreement, whose kind is the failing rank's own: one small collective per backward."""
    assert mesh.checked
    layer = mlacp.MlaAttention(small_config(), mesh, dtype=torch.float64, seed=1)
    c = layer.config
    x = torch.randn(c.batch, layer.local_seq, c.hidden, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    calls = count_agreements(monkeypatch)
    y.sum().backward()
    assert calls == [("mlacp.MlaAttention.backward", False)]
    assert x.grad is not None
    # A failing backward agrees once too, and each verdict keeps its type on every rank.
    for spoil, error in ((lambda x, layer: x.add_(1.0), mlacp.UsageError),
                         (lambda x, layer: setattr(layer.w_kvb, "data", layer.w_kvb.data.clone()),
                          mlacp.InvalidArgument)):
        x = torch.randn(c.batch, layer.local_seq, c.hidden, dtype=torch.float64, requires_grad=True)
        y = layer(x)
        if comm.rank == comm.size - 1:
            with torch.no_grad():
                spoil(x, layer)
        del calls[:]
        with pytest.raises(error, match="mlacp.MlaAttention.backward: "):
            y.sum().backward()
        assert len(calls) == 1, calls
    assert not mesh.broken
    comm.Barrier()


def address_space_in_use():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def test_out_of_memory_on_one_rank(comm):
    """Issue 31: the last rank runs out of memory inside a forward (an address-space cap armed on it alone): it raises
    mlacp.OutOfMemoryError, also a MemoryError, naming the View and the bytes; the others raise
    mlacp.CommunicationError naming it, in seconds, instead of waiting for the watchdog."""
    import resource
    own = comm.Dup()  # the failure breaks this mesh, and only this one
    mesh = mlacp.Mesh(own)
    config = mlacp.MlaConfig(batch=2, seq=4096, hidden=64, heads=8, nope=48, rope=16, vdim=64, latent=64)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=1)
    x = torch.randn(config.batch, config.seq // comm.size, config.hidden, dtype=torch.float64)
    small = mlacp.MlaAttention(mlacp.MlaConfig(batch=1, seq=2 * comm.size, hidden=64, heads=8, nope=48, rope=16,
                                               vdim=64, latent=64), mesh, dtype=torch.float64, seed=1)
    with torch.no_grad():
        small(torch.randn(1, 2, 64, dtype=torch.float64))  # OpenBLAS' work buffer, before the cap
    failing = comm.size - 1
    previous = resource.getrlimit(resource.RLIMIT_AS)
    start = time.monotonic()
    error = None
    try:
        if comm.rank == failing:
            resource.setrlimit(resource.RLIMIT_AS, (address_space_in_use() + (48 << 20), previous[1]))
        with torch.no_grad():
            layer(x)
    except mlacp.Error as e:
        error = e
    finally:
        resource.setrlimit(resource.RLIMIT_AS, previous)
    assert time.monotonic() - start < 60
    if comm.rank == failing:
        assert isinstance(error, mlacp.OutOfMemoryError) and isinstance(error, MemoryError), repr(error)
        assert "could not allocate" in str(error) and " bytes)" in str(error) and "available" in str(error)
    else:
        assert isinstance(error, mlacp.CommunicationError), repr(error)
        assert f"rank {failing} failed" in str(error) and "could not allocate" in str(error)
    comm.Barrier()


def test_in_place_edit_on_one_rank_unchecked(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    mesh, layer, y, failing = edit_in_place_on_the_last_rank(comm, False)
    if comm.rank == failing:
        with pytest.raises(mlacp.UsageError, match="modified by an inplace operation"):
            y.sum().backward()
    else:
        with pytest.raises(mlacp.CommunicationError, match=f"rank {failing} failed: mlacp.MlaAttention.backward: "):
            y.sum().backward()
    assert mesh.broken
    start = time.monotonic()
    with pytest.raises(mlacp.CommunicationError, match="the mesh is broken"):
        layer(torch.randn(layer.config.batch, layer.config.seq // comm.size, layer.config.hidden,
                          dtype=torch.float64))
    assert time.monotonic() - start < 1.0
    comm.Barrier()

