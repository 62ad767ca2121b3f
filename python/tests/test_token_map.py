# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp.TokenMap (issue 21, item 4): the contiguous and zigzag formulas, coverage, indices, shard / unshard (also for
a mesh, and differentiable), MlaConfig.ring_layout, errors."""
import pytest
import torch
from conftest import small_config

import mlacp


def expected_chunks(seq, c, layout):
    """The formulas of docs/api.md (TokenMap): Partition(S, n) gives the first S mod n parts one token more."""
    def partition(total, n):
        q, m = divmod(total, n)
        counts = [q + (1 if r < m else 0) for r in range(n)]
        offsets = [sum(counts[:r]) for r in range(n)]
        return list(zip(offsets, counts))

    if layout == "contiguous":
        return [[p] for p in partition(seq, c)]
    parts = partition(seq, 2 * c)
    return [[parts[g], parts[2 * c - 1 - g]] for g in range(c)]


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("seq, u, c", [(16, 2, 2), (13, 2, 3), (3, 2, 2), (17, 3, 4), (0, 2, 2), (10, 4, 1)])
def test_formulas_and_coverage(seq, u, c, layout):
    tmap = mlacp.TokenMap(seq, u, c, layout)
    assert (tmap.seq, tmap.ulysses_size, tmap.ring_size) == (seq, u, c)
    assert tmap.layout == getattr(mlacp.RingLayout, layout)
    held = []
    for g, parts in enumerate(expected_chunks(seq, c, layout)):
        tokens = [t for begin, count in parts for t in range(begin, begin + count)]
        assert [t for b, n in tmap.chunk(g) for t in range(b, b + n)] == tokens
        assert tmap.chunk_size(g) == len(tokens)
        counts = tmap.chunk_counts(g)
        assert sum(counts) == len(tokens) and max(counts) - min(counts) <= 1
        at = 0
        for r in range(u):
            mine = tmap.indices(g, r)
            assert mine.dtype == torch.int64 and mine.tolist() == tokens[at:at + counts[r]]
            assert tmap.count(g, r) == counts[r] and len(tmap.ranges(g, r)) <= 2
            assert all(tmap.owner(t) == (g, r, i) for i, t in enumerate(mine.tolist()))
            at += counts[r]
            held += mine.tolist()
    assert sorted(held) == list(range(seq))


def test_one_ring_is_flat_ulysses():
    tmap = mlacp.TokenMap(10, 4, 1, "zigzag")
    assert [tmap.ranges(0, r) for r in range(4)] == [[(0, 3)], [(3, 3)], [(6, 2)], [(8, 2)]]


def test_the_readme_picture():
    zigzag = mlacp.TokenMap(16, 2, 2)
    assert [zigzag.ranges(g, u) for g in range(2) for u in range(2)] == [[(0, 4)], [(12, 4)], [(4, 4)], [(8, 4)]]
    contiguous = mlacp.TokenMap(16, 2, 2, mlacp.RingLayout.contiguous)
    assert [contiguous.ranges(g, u) for g in range(2) for u in range(2)] == [[(0, 4)], [(4, 4)], [(8, 4)], [(12, 4)]]
    assert "TokenMap(seq=16, ulysses=2, ring=2, zigzag)" in repr(zigzag)


def test_causal_pairs_balance():
    for c in (2, 4):
        work = {layout: [mlacp.TokenMap(4096, 2, c, layout).causal_pairs(g) for g in range(c)]
                for layout in ("contiguous", "zigzag")}
        assert sum(work["zigzag"]) == 4096 * 4097 // 2
        assert max(work["zigzag"]) / min(work["zigzag"]) <= 1.02
        assert max(work["contiguous"]) / min(work["contiguous"]) > 2 * c - 1.01
    tmap = mlacp.TokenMap(16, 2, 2)
    docs = [0, 3, 10, 16]
    start = lambda t: max(d for d in docs if d <= t)  # noqa: E731
    assert tmap.causal_pairs(0, docs) == sum(t - start(t) + 1 for b, n in tmap.chunk(0) for t in range(b, b + n))


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("dim", [1, 0, -2])
def test_shard_then_unshard_reproduces_the_tensor(layout, dim):
    tmap = mlacp.TokenMap(13, 3, 2, layout)
    x = torch.randn(13, 13, 4, dtype=torch.float64)
    out = torch.zeros_like(x)
    for g in range(2):
        for u in range(3):
            local = tmap.shard(x, g, u, dim=dim)
            assert local.is_contiguous() and local.shape[dim] == tmap.count(g, u)
            assert torch.equal(local, x.index_select(dim, tmap.indices(g, u)))
            assert tmap.unshard(local, g, u, out, dim=dim) is out
    assert torch.equal(out, x)


def test_shard_is_differentiable():
    tmap = mlacp.TokenMap(16, 2, 2)
    x = torch.randn(2, 16, 3, requires_grad=True)
    (tmap.shard(x, 0, 1) * 2).sum().backward()
    expected = torch.zeros(2, 16, 3)
    expected[:, 12:16] = 2
    assert torch.equal(x.grad, expected)


def test_errors_name_the_value():
    with pytest.raises(mlacp.InvalidArgument, match="seq = -1; expected seq >= 0"):
        mlacp.TokenMap(-1, 2, 2)
    with pytest.raises(mlacp.InvalidArgument, match="ring_size = 0; expected ring_size >= 1"):
        mlacp.TokenMap(8, 2, 0)
    with pytest.raises(mlacp.InvalidArgument, match="'ring'"):
        mlacp.TokenMap(8, 2, 2, "ring")
    tmap = mlacp.TokenMap(8, 2, 2)
    with pytest.raises(mlacp.InvalidArgument, match=r"g = 2; expected 0 <= g < 2"):
        tmap.ranges(2, 0)
    with pytest.raises(mlacp.InvalidArgument, match=r"u = 2; expected 0 <= u < 2"):
        tmap.shard(torch.zeros(1, 8), 0, 2)
    with pytest.raises(mlacp.InvalidArgument, match=r"x.shape\[1\] = 7; expected the sequence length 8"):
        tmap.shard(torch.zeros(1, 7), 0, 0)
    with pytest.raises(mlacp.InvalidArgument, match=r"local.shape\[1\] = 3; expected the token count"):
        tmap.unshard(torch.zeros(1, 3), 0, 0, torch.zeros(1, 8))
    with pytest.raises(mlacp.InvalidArgument, match=r"out.shape\[1\] = 9; expected the sequence length 8"):
        tmap.unshard(torch.zeros(1, 2), 0, 0, torch.zeros(1, 9))
    with pytest.raises(mlacp.InvalidArgument, match="expected the same shape but in dim 1"):
        tmap.unshard(torch.zeros(1, 2), 0, 0, torch.zeros(2, 8))
    with pytest.raises(TypeError, match="expected a mesh or the ranks g and u"):
        tmap.shard(torch.zeros(1, 8), 0)


def test_config_ring_layout():
    config = small_config()
    assert config.ring_layout == mlacp.RingLayout.zigzag
    config.ring_layout = "contiguous"
    assert config.ring_layout == mlacp.RingLayout.contiguous and "ring_layout='contiguous'" in repr(config)
    assert small_config(ring_layout=mlacp.RingLayout.contiguous).ring_layout == mlacp.RingLayout.contiguous
    assert mlacp.MlaConfig(config).ring_layout == mlacp.RingLayout.contiguous
    with pytest.raises(mlacp.InvalidArgument, match="'ring'"):
        config.ring_layout = "ring"


def test_shard_and_unshard_on_a_two_level_mesh(comm):
    if comm.size % 2:
        pytest.skip("needs an even number of ranks")
    mesh = mlacp.Mesh(comm, ring=2)
    tmap = mlacp.TokenMap.of(mesh, 19, "zigzag")
    assert (tmap.ulysses_size, tmap.ring_size) == (comm.size // 2, 2)
    x = torch.arange(2 * 19, dtype=torch.float64).reshape(2, 19)  # the same global tensor on every rank
    local = tmap.shard(x, mesh)
    assert torch.equal(local, x[:, tmap.indices(mesh)])
    mine = torch.zeros_like(x)
    tmap.unshard(local, mesh, mine)
    total = torch.tensor(comm.allreduce(mine.numpy()))  # every token written by exactly one rank
    assert torch.equal(total, x)
