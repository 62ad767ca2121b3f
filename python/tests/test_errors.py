# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Bad inputs raise the catalogued errors as mlacp exceptions with the library's messages, on every rank, also when
only one rank passed the bad input (no hang: ctest runs this under a timeout); the layer works afterwards."""
import pytest
import torch
from conftest import small_config

import mlacp


def last(comm):
    return comm.rank == comm.size - 1


@pytest.fixture()
def layer(mesh):
    return mlacp.MlaAttention(small_config(), mesh, dtype=torch.float64, seed=1)


def good_x(layer, comm):
    c = layer.config
    return torch.randn(c.batch, c.seq // comm.size, c.hidden, dtype=torch.float64, requires_grad=True)


def still_works(layer, comm):
    y = layer(good_x(layer, comm))
    y.sum().backward()
    assert torch.isfinite(layer.w_q.grad).all()


def test_exception_hierarchy():
    assert issubclass(mlacp.InvalidArgument, mlacp.Error) and issubclass(mlacp.InvalidArgument, ValueError)
    assert issubclass(mlacp.UsageError, mlacp.Error) and issubclass(mlacp.UsageError, RuntimeError)
    assert issubclass(mlacp.CommunicationError, mlacp.Error)


def test_wrong_shape_on_one_rank(comm, layer):
    c = layer.config
    s = c.seq // comm.size
    # One token more on one rank: the call's S (the sum of the shards) is past the configuration's seq, a maximum.
    x = torch.randn(c.batch, s + (1 if last(comm) else 0), c.hidden, dtype=torch.float64)
    with pytest.raises(mlacp.InvalidArgument, match=r"mlacp::MlaAttention::forward: x brings S = 17 tokens.* but the "
                       r"configuration bounds seq at 16"):
        layer(x)
    # A width other than D on one rank.
    x = torch.randn(c.batch, s, c.hidden + (1 if last(comm) else 0), dtype=torch.float64)
    with pytest.raises(mlacp.InvalidArgument, match=r"mlacp::MlaAttention::forward: x has shape \[2, \d+, 25\]; "
                       r"expected \[B, s, D\] = \[2, \d+, 24\] \(s: this rank.s tokens of S = 16 split as"):
        layer(x)
    still_works(layer, comm)


def test_wrong_dtype_on_one_rank(comm, layer):
    x = good_x(layer, comm).detach()
    if last(comm):
        x = x.float()
    with pytest.raises(mlacp.InvalidArgument,
                       match=r"x has dtype torch.float32; expected torch.float64 \(the dtype of the layer's"):
        layer(x)
    still_works(layer, comm)


def test_non_contiguous_on_one_rank(comm, layer):
    x = good_x(layer, comm).detach()
    if last(comm):
        x = x.transpose(1, 2).contiguous().transpose(1, 2)  # same shape and values, column-major strides
    with pytest.raises(mlacp.InvalidArgument, match=r"x is not contiguous \(shape \[2, \d+, 24\], strides"):
        layer(x)
    still_works(layer, comm)


def test_tensor_not_on_the_host_on_one_rank(comm, layer):
    """A tensor on another device than the CPU (a CUDA tensor on this CPU build; 'meta' is the device every torch
    build has) is refused."""
    x = good_x(layer, comm).detach()
    if last(comm):
        x = torch.empty(x.shape, dtype=x.dtype, device="meta")
    with pytest.raises(mlacp.InvalidArgument, match=r"x is on device meta; this build of mlacp runs on the host"):
        layer(x)
    still_works(layer, comm)


def test_wrong_number_of_dimensions(comm, layer):
    x = good_x(layer, comm).detach()
    if last(comm):
        x = x.reshape(-1)
    with pytest.raises(mlacp.InvalidArgument, match=r"x has 1 dimensions \(shape \[\d+\]\); expected 3"):
        layer(x)
    still_works(layer, comm)


def test_parameter_replaced_with_wrong_dtype(comm, layer):
    if last(comm):
        layer.w_kvb.data = layer.w_kvb.data.float()
    with pytest.raises(mlacp.InvalidArgument, match="parameter w_kvb has dtype torch.float32; expected torch.float64"):
        layer(good_x(layer, comm))


def test_parameter_replaced_on_one_rank_only(comm, layer):
    """The ranks rebuild the C++ layer together; a storage replaced on one rank only is refused on every rank."""
    if comm.size == 1:
        pytest.skip("needs two ranks")
    if last(comm):
        layer.w_o.data = layer.w_o.data.clone()
    with pytest.raises(mlacp.InvalidArgument, match="parameter storage replaced since the last call"):
        layer(good_x(layer, comm))


def test_bad_configuration(mesh):
    with pytest.raises(mlacp.InvalidArgument, match=r"mlacp::MlaConfig: rope = 3; expected an even"):
        mlacp.MlaAttention(small_config(rope=3), mesh, dtype=torch.float64)


def test_no_heads_or_no_tokens_refused(mesh):
    # Fewer heads or tokens than ranks run (test_mla_attention.py); no heads, or a negative seq bound, are refused.
    with pytest.raises(mlacp.InvalidArgument, match=r"heads = 0; expected a positive size"):
        mlacp.MlaAttention(small_config(heads=0), mesh, dtype=torch.float64)
    with pytest.raises(mlacp.InvalidArgument, match=r"seq = -1; expected 0 \(unset: a call brings any\) or a positive"):
        mlacp.MlaAttention(small_config(seq=-1), mesh, dtype=torch.float64)


def test_bad_dtype(mesh):
    with pytest.raises(mlacp.InvalidArgument,
                       match=r"dtype torch.int32; expected torch.float32, torch.float64 or torch.bfloat16"):
        mlacp.MlaAttention(small_config(), mesh, dtype=torch.int32)


def test_dtype_differs_across_ranks(comm, mesh):
    if comm.size == 1:
        pytest.skip("needs two ranks")
    dtype = torch.float32 if last(comm) else torch.float64
    with pytest.raises(mlacp.InvalidArgument, match=r"dtype \(bytes per value\)"):
        mlacp.MlaAttention(small_config(), mesh, dtype=dtype)


def test_bad_strategy_name():
    with pytest.raises(mlacp.InvalidArgument, match="sideways"):
        small_config(strategy="sideways")


def test_finite_check_on_one_rank(comm, mesh, layer):
    mesh.check_finite = True
    try:
        x = good_x(layer, comm).detach()
        if last(comm):
            x[0, 0, 0] = float("nan")
        with pytest.raises(mlacp.InvalidArgument, match=r"x holds 1 non-finite value\(s\)"):
            layer(x)
    finally:
        mesh.check_finite = False
    still_works(layer, comm)


def test_not_a_communicator():
    with pytest.raises(TypeError):
        mlacp.Mesh(42)
