# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp.Mesh(comm, ring=C): the two-level mesh of issue 21 (C Ulysses groups of U = P / C consecutive ranks, U rings
of C ranks), ring="node", ring=1 as the flat mesh, bad rings refused on every rank, and ring attention through the
module against the reference (TokenMap shards)."""
import pytest
import torch
from conftest import small_config
from mla_reference import reference, relative_error, tolerance

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


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["double", "float"])
@pytest.mark.parametrize("strategy", ["latent", "expanded"])
def test_ring_layer_matches_reference(comm, strategy, dtype, layout):
    """Ring attention through the module: each rank holds its TokenMap tokens of x and dy (uneven S, a document
    crossing the chunks); y and dx are the reference's rows of those tokens, the weight gradients its sums."""
    if comm.size < 2 or comm.size % 2:
        pytest.skip("needs a ring of 2")
    mesh = mlacp.Mesh(comm, ring=2)
    config = small_config(strategy=strategy, bias=True, seq=19, ring_layout=layout, cu_seqlens=[0, 7, 8, 19])
    layer = mlacp.MlaAttention(config, mesh, dtype=dtype, seed=7)
    token_map = mlacp.TokenMap.of(mesh, config.seq, layout)
    index = token_map.indices(mesh.ring_rank, mesh.ulysses_rank)
    assert layer.local_seq == len(index) == token_map.count(mesh.ring_rank, mesh.ulysses_rank)
    assert layer.token_map.ranges(mesh.ring_rank, mesh.ulysses_rank) == token_map.ranges(mesh.ring_rank,
                                                                                        mesh.ulysses_rank)
    generator = torch.Generator().manual_seed(11)
    x_full = torch.randn(config.batch, config.seq, config.hidden, generator=generator, dtype=torch.float64).to(dtype)
    dy_full = torch.randn(x_full.shape, generator=generator, dtype=torch.float64).to(dtype)
    x_local = token_map.shard(x_full, mesh).requires_grad_()
    assert torch.equal(x_local, x_full[:, index])
    y_local = layer(x_local)
    y_local.backward(token_map.shard(dy_full, mesh))
    mlacp.all_reduce_grads(layer)
    y_ref, dx_ref, grads_ref = reference(config, layer, x_full, dy_full)
    errors = {"y": relative_error(y_local, y_ref[:, index]), "dx": relative_error(x_local.grad, dx_ref[:, index])}
    for name, p in layer.named_parameters():
        errors["d" + name] = relative_error(p.grad, grads_ref[name])
    assert max(errors.values()) <= tolerance(dtype), errors
    # unshard puts the rank's rows back in global order.
    out = torch.zeros_like(x_full)
    token_map.unshard(y_local.detach(), mesh, out)
    assert torch.equal(out[:, index], y_local.detach())
