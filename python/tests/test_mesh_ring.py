# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp.Mesh(comm, ring=C): the two-level mesh of issue 21 (C Ulysses groups of U = P / C consecutive ranks, U rings
of C ranks), ring="node", ring=1 as the flat mesh, bad rings refused on every rank, the MLA layer's refusal."""
import pytest
import torch
from conftest import small_config

import mlacp


def test_ring_one_is_the_flat_mesh(comm):
    mesh = mlacp.Mesh(comm, ring=1)
    assert (mesh.ring_size, mesh.ulysses_size) == (1, comm.size)
    assert (mesh.ulysses_rank, mesh.ring_rank) == (comm.rank, 0)
    assert mesh.ulysses_group is mesh
    with pytest.raises(mlacp.UsageError, match="flat"):
        mesh.ring_group


def test_two_rings_build_the_groups_and_the_rings(comm):
    if comm.size % 2 or comm.size < 2:
        pytest.skip("needs an even number of ranks")
    u = comm.size // 2
    mesh = mlacp.Mesh(comm, ring=2)
    assert (mesh.size, mesh.ring_size, mesh.ulysses_size) == (comm.size, 2, u)
    assert (mesh.ulysses_rank, mesh.ring_rank) == (comm.rank % u, comm.rank // u)
    assert mesh.ulysses_group.size == u and mesh.ring_group.size == 2
    assert mesh.ulysses_group.rank == comm.rank % u and mesh.ring_group.rank == comm.rank // u
    assert "ring=2" in repr(mesh)


def test_ring_node_on_one_machine_is_flat(comm):
    mesh = mlacp.Mesh(comm, ring="node")
    assert (mesh.ring_size, mesh.ulysses_size) == (1, comm.size)


@pytest.mark.parametrize("ring, message", [(0, "ring = 0; expected a positive ring size"), ("ring", "'node'")])
def test_bad_rings_are_refused(comm, ring, message):
    with pytest.raises(mlacp.InvalidArgument, match=message):
        mlacp.Mesh(comm, ring=ring)
    comm.Barrier()


def test_ring_not_dividing_p_is_refused_on_every_rank(comm):
    with pytest.raises(mlacp.InvalidArgument, match=f"does not divide the {comm.size} ranks"):
        mlacp.Mesh(comm, ring=comm.size + 1)
    comm.Barrier()


def test_mla_layer_refuses_a_two_level_mesh(comm):
    if comm.size < 2:
        pytest.skip("needs a ring of 2")
    mesh = mlacp.Mesh(comm, ring=2)
    with pytest.raises(mlacp.InvalidArgument, match="ring attention over a two-level mesh"):
        mlacp.MlaAttention(small_config(), mesh, dtype=torch.float64, seed=1)
    comm.Barrier()
