#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""A few SGD steps of one mlacp.MlaAttention layer from PyTorch, under Ulysses context parallelism.

    mpirun -n 2 python3 examples/train_mla.py          # PYTHONPATH holding the mlacp package (build/python)
    mpirun -n 2 python3 examples/train_mla.py --dtype bf16 --steps 16 --losses losses_bf16.txt

Every rank holds all weights (the same, from the seed) and its token shard of x and of the target; the loss is the
mean squared error of y against the target over the whole sequence. Weight gradients are each rank's partial sums:
all_reduce_grads sums them over the ranks, so every rank takes the same SGD step. Rank 0 prints the loss per step;
the run exits non-zero unless the loss fell.

``--dtype bf16``: bfloat16 parameters (x and y in bf16), trained the mixed-precision way: mlacp accumulates each weight
gradient in float in the parameter's ``main_grad``, SGD updates float master copies of the weights from it and the
bf16 parameters are their rounding (``--no-master-weights``: SGD straight on the bf16 parameters and their bf16
``.grad``, where a small update rounds away: about 2.7% higher loss than float after 16 steps). ``--autocast``: float parameters and the
loop under ``torch.autocast("cpu", dtype=torch.bfloat16)`` (mlacp computes in bf16, the float gradients land in the
float parameters). ``--losses FILE``: rank 0 writes "step loss" per line, what check_losses.py compares.
"""
import argparse
import sys

import torch
from mpi4py import MPI

import mlacp


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--strategy", default="latent", choices=["latent", "expanded"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bf16"], help="the parameters' dtype")
    parser.add_argument("--no-master-weights", action="store_true",
                        help="with --dtype bf16: SGD on the bf16 parameters themselves, no float master copy")
    parser.add_argument("--autocast", action="store_true", help="float32 parameters, computed in bf16 under autocast")
    parser.add_argument("--losses", help="rank 0 writes the per-step losses here")
    args = parser.parse_args()
    dtype = {"float32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    if args.autocast and dtype != torch.float32:
        parser.error("--autocast runs float32 parameters in bf16; leave --dtype at float32")

    comm = MPI.COMM_WORLD
    mesh = mlacp.Mesh(comm)
    config = mlacp.MlaConfig(batch=2, seq=64, hidden=32, heads=4, nope=8, rope=4, vdim=8, latent=16,
                             strategy=args.strategy)
    layer = mlacp.MlaAttention(config, mesh, dtype=dtype, seed=0, bias=True)
    params = list(layer.parameters())
    # bf16 parameters: float master weights (what the optimizer updates), their gradients mlacp's float main_grad.
    master = [p.detach().float() for p in params] if dtype == torch.bfloat16 and not args.no_master_weights else None
    optimizer = torch.optim.SGD(master or params, lr=args.lr)

    # The same full-sequence data on every rank (one seed); each rank keeps its contiguous token shard.
    generator = torch.Generator().manual_seed(1)
    x_full = torch.randn(config.batch, config.seq, config.hidden, generator=generator)
    target_full = 0.1 * torch.randn(config.batch, config.seq, config.hidden, generator=generator)
    s = config.seq // mesh.size
    x = x_full[:, mesh.rank * s:(mesh.rank + 1) * s].to(dtype).contiguous()
    target = target_full[:, mesh.rank * s:(mesh.rank + 1) * s].contiguous()

    losses = []
    for step in range(args.steps):
        layer.zero_grad(set_to_none=True)  # the bf16 parameters' main_grad restarts with their .grad
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            y = layer(x)  # bf16 under autocast, as torch's own layers
            # This rank's share of the global mean (in float whatever y's dtype): the global loss is the sum of the
            # ranks' shares.
            local_loss = ((y.float() - target)**2).sum() / target_full.numel()
        local_loss.backward()
        mlacp.all_reduce_grads(layer)  # bf16 parameters: summed in float, in main_grad
        if master:
            for m, p in zip(master, params):
                m.grad = p.main_grad
        optimizer.step()
        if master:
            with torch.no_grad():
                for m, p in zip(master, params):
                    p.copy_(m)  # rounded to bf16 (in place: the layer keeps wrapping p's storage)
        loss = comm.allreduce(local_loss.item())
        losses.append(loss)
        if mesh.rank == 0:
            print(f"step {step}: loss {loss:.6f}", flush=True)

    if mesh.rank == 0 and args.losses:
        with open(args.losses, "w") as f:
            f.writelines(f"{step} {loss:.9e}\n" for step, loss in enumerate(losses))
    if mesh.rank == 0:
        fell = losses[-1] < losses[0]
        print(f"loss fell from {losses[0]:.6f} to {losses[-1]:.6f}" if fell else
              f"loss did not fall: {losses[0]:.6f} -> {losses[-1]:.6f}", flush=True)
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
