"""Fault: a registered shared-memory region removed by its client.

The client registers regions with the static worker, then takes one away behind the server's
back. Unlinked and unmapped (``destroy_shared_memory_region``), the object lives on in the
worker's own mapping until it is unregistered, so requests through it still get a clean answer
(a response, or ``FAILED_PRECONDITION`` / ``INVALID_ARGUMENT``); shrunk to nothing
(``ftruncate``), the registered range no longer exists and requests get ``INVALID_ARGUMENT``
instead of a crash. Either way the worker survives, unregistering still works, later requests
name the region as unregistered and the other regions are unaffected.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.worker_e2e._bundles import assert_close, load_weights, mlp_reference
from tests.worker_e2e._harness import WorkerProcess, rows, status_of

pytestmark = pytest.mark.slow

REGION_BYTES = 4096
X = rows(3, 16, seed=22)
OUT_OFFSET = 1024
CLEAN = {"OK", "FAILED_PRECONDITION", "INVALID_ARGUMENT"}


@pytest.fixture
def regions(client: Any) -> Iterator[dict[str, Any]]:
    """Registered regions ``keep``, ``gone`` and ``shrunk``, each holding ``X`` at offset 0."""
    tag = f"rs_fault_{os.getpid()}"
    handles = {}
    try:
        for name in ("keep", "gone", "shrunk"):
            handle = shm.create_shared_memory_region(name, f"/{tag}_{name}", REGION_BYTES)
            handles[name] = handle
            shm.set_shared_memory_region(handle, [X])
            client.register_system_shared_memory(name, f"/{tag}_{name}", REGION_BYTES)
        yield handles
    finally:
        client.unregister_system_shared_memory()
        for handle in handles.values():  # the test pops the ones it destroyed
            shm.destroy_shared_memory_region(handle)


def _infer(client: Any, region: str) -> str:
    """``"OK"`` (checked against NumPy) or the status of an ``mlp`` request through ``region``."""
    given = grpcclient.InferInput("x", list(X.shape), "FP32")
    given.set_shared_memory(region, X.nbytes)
    wanted = grpcclient.InferRequestedOutput("logits")
    wanted.set_shared_memory(region, 3 * 4 * 4, offset=OUT_OFFSET)
    try:
        client.infer("mlp", [given], outputs=[wanted])
    except InferenceServerException as error:
        return status_of(error)
    return "OK"


def _outcomes(client: Any, worker: WorkerProcess, region: str) -> str:
    outcome = _infer(client, region)
    assert outcome in CLEAN, outcome
    assert worker.proc is not None
    assert worker.proc.poll() is None, worker.log_tail(4000)
    assert client.is_server_live()
    assert client.is_server_ready()
    # The rest of the registry is untouched.
    assert _infer(client, "keep") == "OK"
    client.unregister_system_shared_memory(region)
    assert set(client.get_system_shared_memory_status(as_json=True)["regions"]) >= {"keep"}
    assert region not in client.get_system_shared_memory_status(as_json=True)["regions"]
    assert _infer(client, region) == "FAILED_PRECONDITION"
    return outcome


def test_region_removed_while_registered(
    worker: WorkerProcess, client: Any, regions: dict[str, Any], capsys: Any
) -> None:
    expected = mlp_reference(load_weights(worker.repo / "mlp"), X)
    for name, handle in list(regions.items()):
        assert _infer(client, name) == "OK"
        logits = shm.get_contents_as_numpy(handle, np.float32, [3, 4], offset=OUT_OFFSET)
        assert_close(logits, expected)
    key = f"/dev/shm/rs_fault_{os.getpid()}"
    shm.destroy_shared_memory_region(regions.pop("gone"))  # munmap + shm_unlink
    assert not os.path.exists(f"{key}_gone")
    gone = _outcomes(client, worker, "gone")
    os.truncate(f"{key}_shrunk", 0)
    shrunk = _outcomes(client, worker, "shrunk")
    with capsys.disabled():
        print(f"\n[faults] shm region unlinked+unmapped -> {gone}; truncated -> {shrunk}")
    assert shrunk == "INVALID_ARGUMENT"
    assert _infer(client, "keep") == "OK"
