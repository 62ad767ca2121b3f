# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""pytest under mpirun: every rank runs the same tests in the same order. Fixtures: the communicator and a mesh."""
import os
import sys

import pytest
import torch
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(__file__))  # mla_reference

import mlacp  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def comm():
    return MPI.COMM_WORLD


@pytest.fixture(scope="session")
def mesh(comm):
    return mlacp.Mesh(comm)


def small_config(**overrides):
    """A shape every rank count of the tests (1, 2, 4) divides: S = 16, H = 4."""
    fields = dict(batch=2, seq=16, hidden=24, heads=4, nope=6, rope=4, vdim=5, latent=12)
    fields.update(overrides)
    return mlacp.MlaConfig(**fields)
