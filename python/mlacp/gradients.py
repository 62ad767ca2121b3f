# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""all_reduce_grads: sum the weight gradients (each rank's partial sums, docs/spec.md) over the mesh."""
import torch
from mpi4py import MPI

from .attention import MlaAttention, main_grad, publish_grad


def all_reduce_grads(module, mesh=None):
    """Sums the ``.grad`` of every parameter of ``module`` over the mesh (``mesh``, or the mesh of the first
    mlacp.MlaAttention inside ``module``), in place: one MPI Allreduce of all gradients packed together (through
    mpi4py on the mesh's communicator). Parameters without a gradient are left alone; every rank must have gradients
    for the same parameters, which is checked first (one small allgather) so that a difference raises ValueError on
    every rank instead of a hang. A bf16 parameter of an mlacp.MlaAttention is summed through its float
    ``main_grad`` (then .grad is its rounding again); other bf16 gradients are summed in float."""
    if mesh is None:
        mesh = next((m.mesh for m in module.modules() if isinstance(m, MlaAttention)), None)
        if mesh is None:
            raise ValueError("mlacp.all_reduce_grads: module holds no mlacp.MlaAttention; pass mesh=")
    comm = mesh.comm
    named = [(n, p.grad) for n, p in module.named_parameters() if p.grad is not None]
    signature = [(n, tuple(g.shape), str(g.dtype)) for n, g in named]
    signatures = comm.allgather(signature)
    if any(s != signature for s in signatures):
        differing = [r for r, s in enumerate(signatures) if s != signatures[0]]
        raise ValueError(f"mlacp.all_reduce_grads: the ranks hold gradients of different parameters (rank 0: "
                         f"{[s[0] for s in signatures[0]]}; ranks {differing} differ)")
    if not named or mesh.size == 1:
        return
    # bf16 parameters of mlacp layers: their float main_grad is the sum to reduce (in float), .grad its rounding.
    accumulated = list({
        id(p): p
        for m in module.modules() if isinstance(m, MlaAttention) for p in m.parameters(recurse=False)
        if p.grad is not None and p.dtype == torch.bfloat16
    }.values())
    ids = {id(p.grad) for p in accumulated}
    groups = {}
    for g in [main_grad(p) for p in accumulated] + [g for _, g in named if id(g) not in ids]:
        groups.setdefault(g.dtype, []).append(g)
    for dtype in sorted(groups, key=str):
        grads = groups[dtype]
        # NumPy (mpi4py's buffer) has no bfloat16: other bf16 gradients are summed in float and rounded once.
        flat = torch.cat([g.reshape(-1).float() if dtype == torch.bfloat16 else g.reshape(-1) for g in grads])
        comm.Allreduce(MPI.IN_PLACE, flat.numpy())
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    for p in accumulated:
        publish_grad(p)
