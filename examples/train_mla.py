#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""A few SGD steps of one mlacp.MlaAttention layer from PyTorch, under Ulysses context parallelism.

    mpirun -n 2 python3 examples/train_mla.py          # PYTHONPATH holding the mlacp package (build/python)

Every rank holds all weights (the same, from the seed) and its token shard of x and of the target; the loss is the
mean squared error of y against the target over the whole sequence. Weight gradients are each rank's partial sums:
all_reduce_grads sums them over the ranks, so every rank takes the same SGD step. Rank 0 prints the loss per step;
the run exits non-zero unless the loss fell.
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
    args = parser.parse_args()

    comm = MPI.COMM_WORLD
    mesh = mlacp.Mesh(comm)
    config = mlacp.MlaConfig(batch=2, seq=64, hidden=32, heads=4, nope=8, rope=4, vdim=8, latent=16,
                             strategy=args.strategy)
    layer = mlacp.MlaAttention(config, mesh, dtype=torch.float32, seed=0, bias=True)
    optimizer = torch.optim.SGD(layer.parameters(), lr=args.lr)

    # The same full-sequence data on every rank (one seed); each rank keeps its contiguous token shard.
    generator = torch.Generator().manual_seed(1)
    x_full = torch.randn(config.batch, config.seq, config.hidden, generator=generator)
    target_full = 0.1 * torch.randn(config.batch, config.seq, config.hidden, generator=generator)
    s = config.seq // mesh.size
    x = x_full[:, mesh.rank * s:(mesh.rank + 1) * s].contiguous()
    target = target_full[:, mesh.rank * s:(mesh.rank + 1) * s].contiguous()

    losses = []
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        y = layer(x)
        # This rank's share of the global mean: the global loss is the sum of the ranks' shares.
        local_loss = ((y - target)**2).sum() / target_full.numel()
        local_loss.backward()
        mlacp.all_reduce_grads(layer)
        optimizer.step()
        loss = comm.allreduce(local_loss.item())
        losses.append(loss)
        if mesh.rank == 0:
            print(f"step {step}: loss {loss:.6f}", flush=True)

    if mesh.rank == 0:
        fell = losses[-1] < losses[0]
        print(f"loss fell from {losses[0]:.6f} to {losses[-1]:.6f}" if fell else
              f"loss did not fall: {losses[0]:.6f} -> {losses[-1]:.6f}", flush=True)
    return 0 if losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
