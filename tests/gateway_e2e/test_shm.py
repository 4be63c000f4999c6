"""System shared memory through the gateway: every worker sees it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.worker_e2e._bundles import assert_close
from tests.worker_e2e._harness import WorkerProcess, infer_input, model_stats, rows, status_of

pytestmark = pytest.mark.slow

REGION_BYTES = 1024
X = rows(3, 16, seed=61)
X_OFFSET = 128
OUT_OFFSET = 256
OUT_BYTES = 3 * 4 * 4


@pytest.fixture(scope="module")
def direct(workers: list[WorkerProcess]) -> Iterator[list[Any]]:
    """One ``tritonclient.grpc`` client per session worker (bypassing the gateway)."""
    clients = [grpcclient.InferenceServerClient(worker.url) for worker in workers]
    try:
        yield clients
    finally:
        for each in clients:
            each.close()


def _regions(client: Any) -> set[str]:
    return set(client.get_system_shared_memory_status().regions)


@pytest.fixture
def regions(client: Any) -> Iterator[tuple[Any, Any]]:
    """``gw_in`` (holding ``X`` at ``X_OFFSET``) and ``gw_out``, registered through the gateway."""
    tag = f"rs_gw_{os.getpid()}"
    handle_in = shm.create_shared_memory_region("gw_in", f"/{tag}_in", REGION_BYTES)
    handle_out = shm.create_shared_memory_region("gw_out", f"/{tag}_out", REGION_BYTES)
    try:
        shm.set_shared_memory_region(handle_in, [X], offset=X_OFFSET)
        client.register_system_shared_memory("gw_in", f"/{tag}_in", REGION_BYTES)
        client.register_system_shared_memory("gw_out", f"/{tag}_out", REGION_BYTES)
        yield handle_in, handle_out
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle_in)
        shm.destroy_shared_memory_region(handle_out)


def test_register_infer_status_unregister(
    client: Any, direct: list[Any], regions: tuple[Any, Any]
) -> None:
    _, handle_out = regions
    assert _regions(client) == {"gw_in", "gw_out"}
    assert all(_regions(each) == {"gw_in", "gw_out"} for each in direct)
    status = client.get_system_shared_memory_status("gw_in")
    assert list(status.regions) == ["gw_in"]
    assert status.regions["gw_in"].byte_size == REGION_BYTES

    expected = direct[0].infer("mlp", [infer_input("x", X, "FP32")]).as_numpy("logits")
    before = [model_stats(each, "mlp").inference_count for each in direct]
    for _ in range(4):  # round robin: both workers read and write the regions
        handle_out_clear = np.zeros(OUT_BYTES // 4, np.float32)
        shm.set_shared_memory_region(handle_out, [handle_out_clear], offset=OUT_OFFSET)
        tensor = grpcclient.InferInput("x", list(X.shape), "FP32")
        tensor.set_shared_memory("gw_in", X.nbytes, offset=X_OFFSET)
        output = grpcclient.InferRequestedOutput("logits")
        output.set_shared_memory("gw_out", 512, offset=OUT_OFFSET)
        result = client.infer("mlp", [tensor], outputs=[output])
        (out,) = result.get_response().outputs
        assert out.parameters["shared_memory_region"].string_param == "gw_out"
        assert not any(result.get_response().raw_output_contents)  # the data is in the region
        got = shm.get_contents_as_numpy(handle_out, np.float32, [3, 4], offset=OUT_OFFSET)
        assert_close(got, expected)
    after = [model_stats(each, "mlp").inference_count for each in direct]
    assert [a - b for a, b in zip(after, before, strict=True)] == [6, 6]

    client.unregister_system_shared_memory("gw_out")
    assert _regions(client) == {"gw_in"}
    assert all(_regions(each) == {"gw_in"} for each in direct)


def test_unregister_all_clears_every_worker(client: Any, direct: list[Any]) -> None:
    key = f"/rs_gw_all_{os.getpid()}"
    handle = shm.create_shared_memory_region("gw_all", key, 64)
    try:
        client.register_system_shared_memory("gw_all", key, 64)
        assert all("gw_all" in _regions(each) for each in direct)
        client.unregister_system_shared_memory()
        assert _regions(client) == set()
        assert all(_regions(each) == set() for each in direct)
    finally:
        shm.destroy_shared_memory_region(handle)


def test_register_of_a_missing_key_fails_everywhere(client: Any, direct: list[Any]) -> None:
    key = f"/rs_gw_missing_{os.getpid()}"
    with pytest.raises(InferenceServerException) as caught:
        client.register_system_shared_memory("gw_missing", key, 64)
    assert status_of(caught.value) == "FAILED_PRECONDITION", caught.value
    assert "gw_missing" not in _regions(client)
    assert all("gw_missing" not in _regions(each) for each in direct)


def test_empty_region_name_is_invalid_argument(client: Any) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.register_system_shared_memory("", "/rs_gw_empty", 64)
    assert status_of(caught.value) == "INVALID_ARGUMENT"
