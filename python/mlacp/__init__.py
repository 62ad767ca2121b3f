# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""mlacp from PyTorch: Multi-head Latent Attention under Ulysses context parallelism, with the backward's
collectives overlapped with compute.

    from mpi4py import MPI
    import torch, mlacp

    mesh = mlacp.Mesh(MPI.COMM_WORLD)
    config = mlacp.MlaConfig(batch=2, seq=256, hidden=128, heads=4, nope=16, rope=8, vdim=16, latent=32)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float64, seed=0)
    y = layer(x_local)              # x_local [B, layer.local_seq, D]: this rank's tokens
    y.backward(dy_local)            # mlacp's overlapped backward
    mlacp.all_reduce_grads(layer)   # weight gradients summed over the mesh

Run under MPI: mpirun -n 2 python3 train.py
"""
import atexit as _atexit

# mpi4py first: it initialises MPI (and its C API is what the extension reads the communicator from).
from mpi4py import MPI as _MPI  # noqa: F401

from . import _mlacp
from ._mlacp import (Bf16Compute, CommunicationError, Error, InvalidArgument, MlaConfig, MlaRequiresGrad, MlaStrategy,
                     OutOfMemoryError, ReduceScatterAlgorithm, RingLayout, UsageError, WireDtype, events, names,
                     overlap_policy, set_overlap_policy, set_wait_timeout, wait_timeout)
from .attention import MlaAttention
from .deepseek import from_deepseek_state_dict, to_deepseek_state_dict
from .gradients import all_reduce_grads
from .mesh import Mesh
from .plan import Plan, plan, read_machine
from .token_map import TokenMap

__version__ = _mlacp.__version__

# Kokkos is finalised at exit, after every layer and output is gone (registered after mpi4py's import, so it runs
# before MPI is finalised).
_atexit.register(_mlacp._finalize_kokkos)

__all__ = [
    "Bf16Compute", "CommunicationError", "Error", "InvalidArgument", "Mesh", "MlaAttention", "MlaConfig", "MlaRequiresGrad",
    "MlaStrategy", "OutOfMemoryError", "Plan", "ReduceScatterAlgorithm", "RingLayout", "TokenMap", "UsageError",
    "WireDtype",
    "all_reduce_grads", "events", "from_deepseek_state_dict", "names", "overlap_policy", "plan", "read_machine", "set_overlap_policy",
    "set_wait_timeout", "to_deepseek_state_dict", "wait_timeout"
]
