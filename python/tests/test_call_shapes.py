# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Any batch and sequence length per call (issue 34), from Python: one module with batch and seq unset serves calls
of different B, S and packing, each equal to a fresh module of that shape bit for bit (y, dx and every parameter's
gradient), and to the single-rank reference; a shard that is not the token map's is one error on every rank."""
import pytest
import torch
from conftest import small_config
from mla_reference import reference, relative_error

import mlacp

# (B, S, cu_seqlens): S that the rank counts divide and that they do not, packed and not, the first shape again.
CALLS = [(2, 11, None), (1, 16, [0, 5, 16]), (3, 6, None), (1, 13, [0, 1, 9, 13]), (2, 11, None)]


def run(module, x_full, dy_full, cu_seqlens):
    """One forward and backward on this rank's shard of x_full; y, dx and the parameters' gradients, full."""
    mesh = module.mesh
    tokens = module.token_map_for(x_full.shape[1])
    x = tokens.shard(x_full, mesh).detach().requires_grad_()
    module.zero_grad(set_to_none=True)
    y = module(x, cu_seqlens)
    y.backward(tokens.shard(dy_full, mesh))
    y_full = torch.zeros(x_full.shape, dtype=y.dtype)
    dx_full = torch.zeros(x_full.shape, dtype=y.dtype)
    tokens.unshard(y.detach(), mesh, y_full)
    tokens.unshard(x.grad, mesh, dx_full)
    return y_full, dx_full, {n: p.grad.clone() for n, p in module.named_parameters()}


def summed(comm, tensor):
    """The sum over the ranks (shards unsharded into zeros, weight gradients' partial sums)."""
    return torch.from_numpy(comm.allreduce(tensor.numpy()))


@pytest.mark.parametrize("strategy", ["latent", "expanded"])
def test_one_module_serves_every_shape_as_a_fresh_module(comm, mesh, strategy):
    config = small_config(batch=0, seq=0, heads=5, q_lora_rank=7, strategy=strategy, bias=True)
    config.max_documents = 4
    module = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=3)
    for i, (batch, seq, cu_seqlens) in enumerate(CALLS):
        generator = torch.Generator().manual_seed(10 + i)
        x_full = torch.randn(batch, seq, config.hidden, dtype=torch.float64, generator=generator)
        dy_full = torch.randn(batch, seq, config.hidden, dtype=torch.float64, generator=generator)
        y, dx, grads = run(module, x_full, dy_full, cu_seqlens)
        shaped = mlacp.MlaConfig(config)
        shaped.batch, shaped.seq = batch, seq
        fresh = mlacp.MlaAttention(shaped, mesh, dtype=torch.float64, seed=3)
        y_fresh, dx_fresh, grads_fresh = run(fresh, x_full, dy_full, cu_seqlens)
        assert torch.equal(y, y_fresh), (i, "y")
        assert torch.equal(dx, dx_fresh), (i, "dx")
        for name in grads:
            assert torch.equal(grads[name], grads_fresh[name]), (i, name)
        # And the single-rank, full-sequence reference of the same math.
        if cu_seqlens:
            shaped.cu_seqlens = cu_seqlens
        y_ref, dx_ref, grads_ref = reference(shaped, module, x_full, dy_full)
        assert relative_error(summed(comm, y), y_ref) < 1e-12, i
        assert relative_error(summed(comm, dx), dx_ref) < 1e-12, i
        for name in grads:
            assert relative_error(summed(comm, grads[name]), grads_ref[name]) < 1e-12, (i, name)


def test_a_shard_that_is_not_the_token_maps_raises_on_every_rank(comm, mesh):
    config = small_config(batch=0, seq=0)
    module = mlacp.MlaAttention(config, mesh, dtype=torch.float64)
    P, rank = comm.Get_size(), comm.Get_rank()
    if P == 1:
        pytest.skip("one rank holds every token")
    s = module.local_seq_for(4 * P) + (1 if rank == 0 else 0) - (1 if rank == P - 1 else 0)
    with pytest.raises(mlacp.InvalidArgument, match="of rank 0 holds"):
        module(torch.zeros(1, s, config.hidden, dtype=torch.float64))
    with pytest.raises(mlacp.InvalidArgument, match="differs across ranks"):
        module(torch.zeros(1 if rank == 0 else 2, module.local_seq_for(4 * P), config.hidden, dtype=torch.float64))
    y = module(torch.ones(1, module.local_seq_for(4 * P), config.hidden, dtype=torch.float64))
    assert y.shape == (1, module.local_seq_for(4 * P), config.hidden)
