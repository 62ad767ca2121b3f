# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp.Mesh: the Ulysses group over an mpi4py communicator."""
import contextlib

from . import _mlacp


class Mesh(_mlacp.Mesh):
    """A Ulysses (context-parallel) group over an mpi4py communicator, e.g. ``MPI.COMM_WORLD``.

    The communicator is borrowed: mlacp never frees it (pass ``comm.Dup()`` to keep mlacp's collectives apart from
    yours). Construction is collective over it. Settings are properties: ``rank``, ``size``, ``checked`` (agreement
    of shapes across ranks, errors raised on every rank; setting it is collective), ``check_finite``,
    ``host_staging``, ``reduce_scatter_algorithm`` (setting it is collective).

    ``ring`` (issue 21) makes a two-level mesh of P = U x C ranks: ``ring=C`` (an int dividing P) forms C Ulysses
    groups of U = P / C consecutive ranks and U rings of C ranks (one rank of every group); ``ring="node"`` forms one
    Ulysses group per node (the ranks sharing memory, in rank order) and refuses nodes of different sizes. The default,
    1, is flat Ulysses. ``ulysses_size``, ``ring_size``, ``ulysses_rank``, ``ring_rank``, ``ulysses_group`` and
    ``ring_group`` (the sub-meshes; ``ring_group`` raises mlacp.UsageError when flat) describe it. On a two-level
    mesh mlacp.MlaAttention runs ring attention: the all-to-alls inside each Ulysses group, the keys (or, with the
    latent strategy, the latent payload) round the rings; its ``token_map`` says which tokens each rank holds
    (docs/api.md).

    One host thread at a time per communicator (every mesh over it): a second thread entering mlacp meanwhile
    raises mlacp.UsageError.
    """

    def __init__(self, comm, ring=1):
        super().__init__(comm, ring)
        self.comm = comm  # what all_reduce_grads reduces over

    def agree(self, where, local_error, fields=(), usage=False):
        """Raises mlacp.InvalidArgument (mlacp.UsageError with ``usage``) on every rank if any rank's ``local_error``
        is not empty (the lowest such rank's message), or if a (name, int) field differs across ranks; checked mesh
        only, else this rank's error alone. One small collective (the library's agreement)."""
        _mlacp._agree(self, where, local_error, list(fields), "", usage)

    @contextlib.contextmanager
    def _entered(self, where):
        """Marks this thread as inside mlacp on the mesh's communicator for the block (mlacp.UsageError when another
        thread is inside)."""
        guard = _mlacp._EntryGuard(self, where)
        try:
            yield
        finally:
            guard.release()
