# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""One host thread at a time per mesh and communicator (issue 19, defect 9): forward releases the GIL, and a second
Python thread entering a layer on the same communicator while another thread is inside raises mlacp.UsageError
instead of racing on the layer's buffers and on the order of the collectives."""
import threading
import time

import pytest
import torch
from conftest import small_config

import mlacp


def test_second_thread_on_one_communicator_raises(comm, mesh):
    if comm.size == 1:
        pytest.skip("needs two ranks: the first thread is held inside by the others' late arrival")
    layer = mlacp.MlaAttention(small_config(), mesh, dtype=torch.float64, seed=1)
    # A second layer on a second mesh borrowing the same communicator shares the guard.
    other = mlacp.MlaAttention(small_config(), mlacp.Mesh(comm), dtype=torch.float64, seed=1)
    c = layer.config
    x = torch.randn(c.batch, c.seq // comm.size, c.hidden, dtype=torch.float64)
    results = {}

    def first():
        try:
            results["y"] = layer(x)
        except Exception as e:  # noqa: BLE001 (reported below)
            results["error"] = e

    # Rank 0's first thread enters and waits in the agreement for the others, who come 3 s later; meanwhile its main
    # thread tries both layers.
    if comm.rank != 0:
        time.sleep(3.0)
    thread = threading.Thread(target=first)
    thread.start()
    if comm.rank == 0:
        time.sleep(0.5)
        for attempt in (layer, other):
            with pytest.raises(mlacp.UsageError, match="another thread is inside mlacp on this communicator"):
                attempt(x)
    thread.join()
    assert "error" not in results, results.get("error")
    assert results["y"].shape == x.shape
    comm.Barrier()
