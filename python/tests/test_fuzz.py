# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""The fuzzer's Python leg (issue 31): seeded random configurations through mlacp.MlaAttention, even and uneven
splits, both strategies, float and double, biases, q-LoRA, softmax scales, overlap on and off; some drawn valid (y, dx
and every weight gradient against the single-process PyTorch reference of docs/spec.md), some mutated (a size at 0 or
-1, an odd rope, a negative q-LoRA rank or scale, a malformed cu_seqlens, or the last rank with another value of a
field): each of those must raise the same mlacp error on every rank, never hang or abort.

MLACP_FUZZ_PY_CASES (default 12) cases from MLACP_FUZZ_SEED (default 1); a failure names its seed."""
import os
import random

import pytest
import torch
from mla_reference import reference, relative_error, tolerance

import mlacp

CASES = int(os.environ.get("MLACP_FUZZ_PY_CASES", "12"))
FIRST = int(os.environ.get("MLACP_FUZZ_SEED", "1"))
SIZES = ("batch", "seq", "hidden", "heads", "nope", "rope", "vdim", "latent")


def rows(n, size, rank):
    """docs/spec.md's split of n over size ranks: (offset, count) of rank's part (the first n mod size take one
    more)."""
    base, extra = divmod(n, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def draw(seed, size, rank):
    """The case of `seed` as rank `rank` sees it: (fields, dtype, what was mutated, whether it must be refused)."""
    rng = random.Random(seed * 7919 + size)
    fields = dict(batch=rng.randint(1, 2), seq=rng.randint(1, 3 * size + 2), hidden=rng.randint(2, 12),
                  heads=rng.randint(1, 2 * size), nope=rng.randint(1, 5), rope=2 * rng.randint(1, 2),
                  vdim=rng.randint(1, 5), latent=rng.randint(1, 8), strategy=rng.choice(["latent", "expanded"]),
                  bias=rng.random() < 0.5, overlap=rng.random() < 0.75, q_lora_rank=rng.choice([0, 0, 3]),
                  softmax_scale=rng.choice([0.0, 0.0, 0.3]))
    dtype = rng.choice([torch.float64, torch.float32])
    roll = rng.random()
    if roll < 0.2:
        name, value = rng.choice(SIZES), rng.choice([0, -1, -(2**31)])
        if name in ("batch", "seq") and value == 0:
            value = -1  # batch and seq are optional maxima: 0 is unset (any shape per call), not an error
        fields[name] = value
        return fields, dtype, f"{name} = {value}", True
    if roll < 0.3:
        kind = rng.randrange(4)
        if kind == 0:
            fields["rope"] = 3
        elif kind == 1:
            fields["q_lora_rank"] = -1
        elif kind == 2:
            fields["softmax_scale"] = -0.5
        else:
            fields["cu_seqlens"] = rng.choice([[1, fields["seq"]], [0, fields["seq"] + 1], [0]])
        return fields, dtype, ["odd rope", "q_lora_rank = -1", "softmax_scale < 0", "malformed cu_seqlens"][kind], True
    if roll < 0.45 and size > 1:
        name = rng.choice(SIZES + ("bias", "strategy", "q_lora_rank", "dtype"))
        if rank == size - 1:
            if name == "dtype":
                dtype = torch.float32 if dtype == torch.float64 else torch.float64
            elif name == "bias":
                fields["bias"] = not fields["bias"]
            elif name == "strategy":
                fields["strategy"] = "expanded" if fields["strategy"] == "latent" else "latent"
            elif name == "q_lora_rank":
                fields["q_lora_rank"] = 0 if fields["q_lora_rank"] else 2
            else:
                fields[name] += 2 if name == "rope" else 1
        return fields, dtype, f"rank {size - 1} with another {name}", True
    return fields, dtype, "", False


@pytest.mark.parametrize("case", range(FIRST, FIRST + CASES))
def test_fuzz_case(comm, mesh, case):
    fields, dtype, mutation, must_fail = draw(case, comm.size, comm.rank)
    where = (f"seed {case}: {fields} {dtype} {mutation or 'as drawn'}; reproduce: MLACP_FUZZ_SEED={case} "
             f"MLACP_FUZZ_PY_CASES=1 mpirun -n {comm.size} python3 -m pytest python/tests/test_fuzz.py")
    error = None
    try:
        config = mlacp.MlaConfig(**fields)
        layer = mlacp.MlaAttention(config, mesh, dtype=dtype, seed=case)
    except mlacp.Error as e:
        error = e
    kinds = comm.allgather(type(error).__name__ if error is not None else None)
    assert len(set(kinds)) == 1, f"ranks disagree on the outcome {kinds}; {where}"
    if error is not None:
        assert isinstance(error, mlacp.InvalidArgument), f"{error!r}; {where}"
        texts = comm.allgather(str(error).split("this rank passed")[0])
        assert len(set(texts)) == 1, f"not the same error on every rank: {texts}; {where}"
        return
    assert not must_fail, f"a mutation that must be refused ran; {where}"
    generator = torch.Generator().manual_seed(case)
    x_full = torch.randn(config.batch, config.seq, config.hidden, generator=generator, dtype=torch.float64).to(dtype)
    dy_full = torch.randn(x_full.shape, generator=generator, dtype=torch.float64).to(dtype)
    offset, count = rows(config.seq, comm.size, comm.rank)
    x_local = x_full.narrow(1, offset, count).contiguous().requires_grad_()
    y_local = layer(x_local)
    y_local.backward(dy_full.narrow(1, offset, count).contiguous())
    mlacp.all_reduce_grads(layer)
    y_ref, dx_ref, grads_ref = reference(config, layer, x_full, dy_full)
    errors = {"y": relative_error(y_local, y_ref.narrow(1, offset, count)),
              "dx": relative_error(x_local.grad, dx_ref.narrow(1, offset, count))}
    # A gradient that is zero in exact arithmetic (no token sees another) is measured against 1% of the largest.
    floor = max(float(g.norm()) for g in grads_ref.values()) * 1e-2
    for name, p in layer.named_parameters():
        got, want = p.grad.to(torch.float64), grads_ref[name]
        errors["d" + name] = float((got - want).norm() / max(float(want.norm()), floor, 1e-300))
    errors = {k: v for k, v in errors.items() if not v <= tolerance(dtype)}
    assert not errors, f"relative errors above {tolerance(dtype)}: {errors}; {where}"
