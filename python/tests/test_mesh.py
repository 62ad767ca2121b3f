# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp.Mesh over an mpi4py communicator: its settings as properties, collective setters, and the communicator
borrowed (never freed by mlacp)."""
import gc

import pytest
import torch
from conftest import small_config
from mla_reference import gather, reference, relative_error, shard
from mpi4py import MPI

import mlacp


def test_properties(comm, mesh):
    assert (mesh.rank, mesh.size) == (comm.rank, comm.size)
    assert mesh.owns_communicator is False
    assert mesh.has_nccl is False
    assert mesh.checked is True
    assert mesh.check_finite is False and mesh.host_staging is False
    assert mesh.reduce_scatter_algorithm == mlacp.ReduceScatterAlgorithm.pairwise
    assert mesh.comm is comm
    assert f"size={comm.size}" in repr(mesh)


def test_borrowed_communicator_is_not_freed(comm):
    dup = comm.Dup()
    m = mlacp.Mesh(dup)
    assert m.size == comm.size
    del m
    gc.collect()
    assert dup != MPI.COMM_NULL
    assert dup.allreduce(1) == comm.size  # still a working communicator
    dup.Free()


def test_comm_null_is_refused():
    with pytest.raises(mlacp.InvalidArgument, match="COMM_NULL"):
        mlacp.Mesh(MPI.COMM_NULL)


def test_settings_change_the_run_not_the_numbers(comm):
    """Unchecked mode, MPI's own reduce-scatter and host staging: the same numbers as the reference."""
    mesh = mlacp.Mesh(comm.Dup())
    mesh.checked = False
    mesh.reduce_scatter_algorithm = mlacp.ReduceScatterAlgorithm.mpi
    mesh.host_staging = True
    assert not mesh.checked and mesh.host_staging
    assert mesh.reduce_scatter_algorithm == mlacp.ReduceScatterAlgorithm.mpi
    config = small_config(bias=True)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=4)
    generator = torch.Generator().manual_seed(8)
    x_full = torch.randn(config.batch, config.seq, config.hidden, generator=generator, dtype=torch.float64)
    dy_full = torch.randn(x_full.shape, generator=generator, dtype=torch.float64)
    x = shard(x_full, comm.rank, comm.size).requires_grad_()
    y = layer(x)
    y.backward(shard(dy_full, comm.rank, comm.size))
    mlacp.all_reduce_grads(layer)
    y_ref, dx_ref, grads_ref = reference(config, layer, x_full, dy_full)
    assert relative_error(gather(comm, y), y_ref) <= 1e-10
    assert relative_error(gather(comm, x.grad), dx_ref) <= 1e-10
    assert relative_error(layer.w_kvb.grad, grads_ref["w_kvb"]) <= 1e-10
    mesh.checked = True
    mesh.comm.Free()


def test_process_settings():
    panels, rows = mlacp.overlap_policy()
    mlacp.set_overlap_policy(4, 64)
    assert mlacp.overlap_policy() == (4, 64)
    mlacp.set_overlap_policy(panels, rows)
    with pytest.raises(mlacp.InvalidArgument, match="panels = 0"):
        mlacp.set_overlap_policy(0)
    assert mlacp.wait_timeout() >= 0
    assert mlacp.__version__.count(".") == 2
