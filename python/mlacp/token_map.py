# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp.TokenMap: which global tokens each rank of a two-level mesh holds, and the torch copies that follow it."""
import torch

from . import _mlacp


class TokenMap(_mlacp.TokenMap):
    """Which global tokens each rank (g, u) of a U x C mesh holds (issue 21): g is the rank's Ulysses group (its
    ``mesh.ring_rank``), u its rank in the group (``mesh.ulysses_rank``).

    The S tokens are split into C ring chunks, chunk g held by Ulysses group g. ``layout="contiguous"``: chunk g is
    part g of the S tokens split into C parts (the first S mod C parts one token longer). ``layout="zigzag"`` (the
    default; balanced causal work): the S tokens in 2C parts the same way, chunk g = parts g and 2C-1-g. Rank (g, u)
    holds part u of the chunk's tokens split into U parts, in chunk order, so one or two global ranges. With C = 1
    rank u holds part u of S split into U parts (flat Ulysses). x, dy, y and dx follow the map (``shard`` /
    ``unshard``); RoPE positions and ``cu_seqlens`` stay global.

    ``chunk(g)`` and ``ranges(g, u)`` are lists of (begin, count) over global tokens; ``count(g, u)``,
    ``chunk_size(g)``, ``chunk_counts(g)``, ``chunk_token(g, t)``, ``global_token(g, u, i)``, ``owner(t)`` (g, u,
    local index) and ``causal_pairs(g, cu_seqlens=[])`` (chunk g's attention work) describe it.
    """

    def __init__(self, seq, ulysses_size, ring_size, layout="zigzag"):
        super().__init__(seq, ulysses_size, ring_size, layout)

    @classmethod
    def of(cls, mesh, seq, layout="zigzag"):
        """The map of ``mesh`` (U = mesh.ulysses_size, C = mesh.ring_size) for S = ``seq`` tokens."""
        return cls(seq, mesh.ulysses_size, mesh.ring_size, layout)

    def _rank(self, where, g, u):
        if u is None:
            if not hasattr(g, "ring_rank"):
                raise TypeError(f"mlacp.TokenMap.{where}: expected a mesh or the ranks g and u, got g={g!r} alone")
            return g.ring_rank, g.ulysses_rank
        return g, u

    def indices(self, g, u=None):
        """Rank (g, u)'s global token indices, ascending: a torch.int64 tensor of count(g, u) entries (or of this
        rank's, for a mesh: ``indices(mesh)``)."""
        g, u = self._rank("indices", g, u)
        pieces = [torch.arange(begin, begin + count, dtype=torch.int64) for begin, count in self.ranges(g, u)]
        return torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int64)

    def _check(self, where, name, tensor, dim, expected):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"mlacp.TokenMap.{where}: {name} is a {type(tensor).__name__}; expected a torch.Tensor")
        if not -tensor.dim() <= dim < tensor.dim():
            raise _mlacp.InvalidArgument(f"mlacp.TokenMap.{where}: dim={dim} for {name} of shape "
                                         f"{tuple(tensor.shape)}; expected a dimension of it")
        dim %= tensor.dim()
        if tensor.shape[dim] != expected[0]:
            raise _mlacp.InvalidArgument(f"mlacp.TokenMap.{where}: {name}.shape[{dim}] = {tensor.shape[dim]}; "
                                         f"expected {expected[1]} {expected[0]} ({self.describe()})")
        return dim

    def shard(self, x, g, u=None, dim=1):
        """Rank (g, u)'s tokens of the global tensor ``x`` (S tokens in ``dim``), a new contiguous tensor with
        count(g, u) tokens in ``dim``, in ascending global order; ``shard(x, mesh)`` takes this rank's. Differentiable
        (narrow and cat)."""
        g, u = self._rank("shard", g, u)
        count = self.count(g, u)
        dim = self._check("shard", "x", x, dim, (self.seq, "the sequence length"))
        pieces = [x.narrow(dim, begin, n) for begin, n in self.ranges(g, u)]
        local = torch.cat(pieces, dim) if pieces else x.narrow(dim, 0, 0).clone()
        assert local.shape[dim] == count
        return local.contiguous()

    def unshard(self, local, *where, dim=1):
        """Writes rank (g, u)'s ``local`` tensor (count(g, u) tokens in ``dim``) into its tokens of the global tensor
        ``out`` (S tokens in ``dim``; its other tokens are left as they are) and returns ``out``:
        ``unshard(local, g, u, out)`` or, for this rank, ``unshard(local, mesh, out)``."""
        if len(where) == 2 and hasattr(where[0], "ring_rank"):
            (g, u), out = self._rank("unshard", where[0], None), where[1]
        elif len(where) == 3:
            g, u, out = where
        else:
            raise TypeError("mlacp.TokenMap.unshard: expected unshard(local, g, u, out) or unshard(local, mesh, out)")
        count = self.count(g, u)
        dim = self._check("unshard", "local", local, dim, (count, f"the token count of rank g={g}, u={u},"))
        self._check("unshard", "out", out, dim, (self.seq, "the sequence length"))
        if out.dim() != local.dim() or any(out.shape[d] != local.shape[d] for d in range(out.dim()) if d != dim):
            raise _mlacp.InvalidArgument(f"mlacp.TokenMap.unshard: out of shape {tuple(out.shape)} and local of shape "
                                         f"{tuple(local.shape)}; expected the same shape but in dim {dim}")
        at = 0
        for begin, n in self.ranges(g, u):
            out.narrow(dim, begin, n).copy_(local.narrow(dim, at, n))
            at += n
        return out
