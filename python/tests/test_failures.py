# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""A rank-local failure after the agreement reaches every rank (issue 19, defect 7): x edited in place on the last
rank only is caught there by torch's saved-tensor check; the other ranks, already waiting in mlacp's backward, raise
mlacp.CommunicationError naming that rank instead of waiting forever, and later calls on the mesh raise at once."""
import time

import pytest
import torch
from conftest import small_config

import mlacp


def test_in_place_edit_on_one_rank_reaches_every_rank(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    own = comm.Dup()  # the mesh this test breaks is the only one on its communicator
    mesh = mlacp.Mesh(own)
    layer = mlacp.MlaAttention(small_config(), mesh, dtype=torch.float64, seed=1)
    c = layer.config
    x = torch.randn(c.batch, c.seq // comm.size, c.hidden, dtype=torch.float64, requires_grad=True)
    y = layer(x)
    failing = comm.size - 1
    if comm.rank == failing:
        with torch.no_grad():
            x.add_(1.0)  # after the forward saved it: torch's version check refuses the backward on this rank
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    else:
        with pytest.raises(mlacp.CommunicationError, match=f"rank {failing} failed: mlacp.MlaAttention.backward: "):
            y.sum().backward()
    assert mesh.broken
    start = time.monotonic()
    with pytest.raises(mlacp.CommunicationError, match="the mesh is broken"):
        layer(torch.randn(c.batch, c.seq // comm.size, c.hidden, dtype=torch.float64))
    assert time.monotonic() - start < 1.0
    del y, layer, mesh
    comm.Barrier()
