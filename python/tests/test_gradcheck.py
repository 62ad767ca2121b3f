# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""torch.autograd.gradcheck of the whole distributed layer in double at a tiny shape: x and every weight are
replicated inputs (every rank perturbs the same entry in lockstep), each rank runs its shard and y is gathered, so
the finite differences see the global function and the analytic side is mlacp's backward with the weight
gradients summed over the ranks."""
import pytest
import torch
from mla_reference import distributed_function

import mlacp


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("strategy", ["latent", "expanded"])
def test_gradcheck(comm, mesh, strategy, bias):
    config = mlacp.MlaConfig(batch=1, seq=8, hidden=6, heads=4, nope=2, rope=2, vdim=2, latent=3, bias=bias,
                             strategy=strategy)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=13)
    generator = torch.Generator().manual_seed(17)
    x = torch.randn(config.batch, config.seq, config.hidden, generator=generator, dtype=torch.float64)
    inputs = (x.requires_grad_(), *layer.parameters())
    assert torch.autograd.gradcheck(distributed_function(layer, comm), inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


class _ScaledGradient(torch.autograd.Function):
    """Identity whose backward is 1% off: a stand-in for a layer with a wrong weight gradient."""

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        return 1.01 * g


def test_gradcheck_catches_a_wrong_gradient(comm, mesh):
    """The check can fail at these tolerances: a w_o gradient 1% off is rejected."""
    config = mlacp.MlaConfig(batch=1, seq=8, hidden=6, heads=4, nope=2, rope=2, vdim=2, latent=3)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=13)
    x = torch.randn(config.batch, config.seq, config.hidden, generator=torch.Generator().manual_seed(17),
                    dtype=torch.float64, requires_grad=True)
    f = distributed_function(layer, comm)

    def off(x_full, w_q, w_kva, g_kv, w_kvb, w_o):
        return f(x_full, w_q, w_kva, g_kv, w_kvb, _ScaledGradient.apply(w_o))

    assert not torch.autograd.gradcheck(off, (x, *layer.parameters()), eps=1e-6, atol=1e-7, rtol=1e-5,
                                        raise_exception=False)
