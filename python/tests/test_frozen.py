# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""requires_grad=False on a parameter or on x: no gradient for it, the other gradients unchanged, and its work is
skipped (the layer's gradient flags; checked through mlacp's event recorder: the skipped GEMM phases and collectives
do not appear)."""
import pytest
import torch
from conftest import small_config

import mlacp


def backward_events(layer, x):
    """The names of the compute phases and collectives (launches) of one forward + backward."""
    mlacp.events.enable(True)
    mlacp.events.clear()
    try:
        layer(x).sum().backward()
        return {name for kind, name, _ in mlacp.events.snapshot() if kind in ("compute_begin", "launch")}
    finally:
        mlacp.events.enable(False)


def fresh(mesh, strategy, frozen=(), x_grad=True, comm=None):
    config = small_config(strategy=strategy, bias=True)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=9)
    for name in frozen:
        getattr(layer, name).requires_grad_(False)
    x = torch.randn(config.batch, config.seq // mesh.size, config.hidden, generator=torch.Generator().manual_seed(3),
                    dtype=torch.float64, requires_grad=x_grad)
    return layer, x


@pytest.mark.parametrize("strategy", ["latent", "expanded"])
def test_frozen_weight_gets_no_gradient_and_skips_its_gemm(mesh, strategy):
    full, x = fresh(mesh, strategy)
    full_events = backward_events(full, x)
    dx_full = x.grad.clone()
    frozen, x = fresh(mesh, strategy, frozen=("w_o", "w_kvb", "b_q"))
    frozen_events = backward_events(frozen, x)
    for name in ("w_o", "w_kvb", "b_q"):
        assert getattr(frozen, name).grad is None, name
    for name, p in full.named_parameters():
        if name not in ("w_o", "w_kvb", "b_q"):
            assert torch.equal(getattr(frozen, name).grad, p.grad), name
    assert torch.equal(x.grad, dx_full)
    assert "w_o wgrad" in full_events and "w_o wgrad" not in frozen_events
    if strategy == "latent":
        assert "w_kvb wgrad" in full_events and "w_kvb wgrad" not in frozen_events


@pytest.mark.parametrize("strategy", ["latent", "expanded"])
def test_only_the_output_projection_trains(mesh, strategy):
    """Everything before the output projection frozen, x without grad: only w_o's and b_o's gradients; no attention
    backward and, at P > 1, none of the inverse all-to-alls."""
    names = ("w_q", "b_q", "w_kva", "g_kv", "w_kvb", "b_kvb")
    full, x = fresh(mesh, strategy)
    full_events = backward_events(full, x)
    frozen, x = fresh(mesh, strategy, frozen=names, x_grad=False)
    frozen_events = backward_events(frozen, x)
    assert x.grad is None
    assert all(getattr(frozen, n).grad is None for n in names)
    assert torch.equal(frozen.w_o.grad, full.w_o.grad) and torch.equal(frozen.b_o.grad, full.b_o.grad)
    assert mlacp.names.attention_bprop in full_events and mlacp.names.attention_bprop not in frozen_events
    if mesh.size > 1:
        n = mlacp.names
        inverses = {n.do_a2a, n.dq_a2a, n.latent_reduce_scatter} if strategy == "latent" else {
            n.do_a2a, n.dq_a2a, n.dk_a2a, n.dv_a2a
        }
        assert inverses <= full_events and not inverses & frozen_events, (sorted(full_events), sorted(frozen_events))


def test_x_without_grad_skips_dx(mesh):
    full, x = fresh(mesh, "latent")
    full(x).sum().backward()
    layer, x = fresh(mesh, "latent", x_grad=False)
    layer(x).sum().backward()
    assert x.grad is None
    for name, p in layer.named_parameters():
        assert torch.equal(p.grad, getattr(full, name).grad), name


def test_nothing_needs_a_gradient(mesh):
    layer, x = fresh(mesh, "expanded", x_grad=False)
    for p in layer.parameters():
        p.requires_grad_(False)
    y = layer(x)
    assert not y.requires_grad and y.grad_fn is None
    with torch.no_grad():
        layer2, x2 = fresh(mesh, "expanded")
        y2 = layer2(x2)
    assert y2.grad_fn is None and torch.equal(y, y2)
