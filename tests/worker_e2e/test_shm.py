"""System shared memory in and out."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from ._bundles import assert_close, mlp_reference
from ._harness import infer_input, raw_request, rows, status_of

pytestmark = pytest.mark.slow

REGION_BYTES = 1024
X = rows(3, 16, seed=21)
X_OFFSET = 128
OUT_OFFSET = 256
OUT_BYTES = 3 * 4 * 4


@pytest.fixture
def regions(client: Any) -> Iterator[tuple[Any, Any]]:
    """Two registered regions, ``e2e_in`` (holding ``X`` at ``X_OFFSET``) and ``e2e_out``."""
    tag = f"rs_e2e_{os.getpid()}"
    handle_in = shm.create_shared_memory_region("e2e_in", f"/{tag}_in", REGION_BYTES)
    handle_out = shm.create_shared_memory_region("e2e_out", f"/{tag}_out", REGION_BYTES)
    try:
        shm.set_shared_memory_region(handle_in, [X], offset=X_OFFSET)
        client.register_system_shared_memory("e2e_in", f"/{tag}_in", REGION_BYTES)
        client.register_system_shared_memory("e2e_out", f"/{tag}_out", REGION_BYTES)
        yield handle_in, handle_out
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle_in)
        shm.destroy_shared_memory_region(handle_out)


def _shm_input(region: str = "e2e_in", nbytes: int = X.nbytes, offset: int = X_OFFSET) -> Any:
    tensor = grpcclient.InferInput("x", list(X.shape), "FP32")
    tensor.set_shared_memory(region, nbytes, offset=offset)
    return tensor


def _shm_output(region: str = "e2e_out", nbytes: int = 512, offset: int = OUT_OFFSET) -> Any:
    output = grpcclient.InferRequestedOutput("logits")
    output.set_shared_memory(region, nbytes, offset=offset)
    return output


def _fails(client: Any, inputs: list[Any], outputs: list[Any] | None = None) -> str:
    with pytest.raises(InferenceServerException) as caught:
        client.infer("mlp", inputs, outputs=outputs)
    message = str(caught.value.message())
    assert "\n" not in message
    return f"{status_of(caught.value)}: {message}"


def _good(client: Any, weights: dict[str, Any]) -> None:
    got = client.infer("mlp", [infer_input("x", X, "FP32")]).as_numpy("logits")
    assert_close(got, mlp_reference(weights["mlp"], X))


def test_status_lists_the_registered_regions(client: Any, regions: tuple[Any, Any]) -> None:
    del regions
    status = client.get_system_shared_memory_status()
    by_name = dict(status.regions)
    assert set(by_name) == {"e2e_in", "e2e_out"}
    assert by_name["e2e_in"].key.endswith("_in")
    assert (by_name["e2e_in"].offset, by_name["e2e_in"].byte_size) == (0, REGION_BYTES)
    one = client.get_system_shared_memory_status("e2e_out")
    assert list(one.regions) == ["e2e_out"]
    assert list(client.get_system_shared_memory_status("no_such_region").regions) == []


def test_inputs_and_outputs_in_shared_memory(
    client: Any, regions: tuple[Any, Any], weights: dict[str, Any]
) -> None:
    _, handle_out = regions
    want = mlp_reference(weights["mlp"], X)
    result = client.infer("mlp", [_shm_input()], outputs=[_shm_output()])
    response = result.get_response()
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("logits", "FP32", [3, 4])
    parameters = output.parameters
    assert parameters["shared_memory_region"].string_param == "e2e_out"
    assert parameters["shared_memory_offset"].int64_param == OUT_OFFSET
    assert parameters["shared_memory_byte_size"].int64_param == OUT_BYTES
    assert list(response.raw_output_contents) == [b""]  # index-aligned, data in the region
    got = shm.get_contents_as_numpy(handle_out, np.float32, [3, 4], offset=OUT_OFFSET)
    assert_close(got, want)

    # SHM input, raw output
    raw_out = client.infer("mlp", [_shm_input()]).as_numpy("logits")
    assert_close(raw_out, want)


def test_shared_memory_errors_while_others_succeed(
    client: Any, stub: Any, regions: tuple[Any, Any], weights: dict[str, Any]
) -> None:
    del regions
    cases = {
        "input out of bounds": ([_shm_input(offset=REGION_BYTES - 64)], None, "INVALID_ARGUMENT"),
        "input size is not the tensor size": ([_shm_input(nbytes=64)], None, "INVALID_ARGUMENT"),
        "output region too small": ([_shm_input()], [_shm_output(nbytes=16)], "INVALID_ARGUMENT"),
        "output out of bounds": (
            [_shm_input()],
            [_shm_output(offset=REGION_BYTES - 8)],
            "INVALID_ARGUMENT",
        ),
        "unregistered input region": ([_shm_input("nope_in")], None, "FAILED_PRECONDITION"),
        "unregistered output region": (
            [infer_input("x", X, "FP32")],
            [_shm_output("nope_out")],
            "FAILED_PRECONDITION",
        ),
    }
    for case, (inputs, outputs, status) in cases.items():
        outcome = _fails(client, inputs, outputs)
        assert outcome.startswith(status + ":"), (case, outcome)
        if "unregistered" in case:
            assert "nope_" in outcome, (case, outcome)
        _good(client, weights)

    # missing shared_memory_byte_size (tritonclient always sets it, so build it by hand)
    request = raw_request("mlp", [("x", "FP32", X.shape, None)])
    request.inputs[0].parameters["shared_memory_region"].string_param = "e2e_in"
    request.inputs[0].parameters["shared_memory_offset"].int64_param = X_OFFSET
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    error: Any = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    _good(client, weights)


def test_register_errors(client: Any) -> None:
    tag = f"rs_e2e_{os.getpid()}_reg"
    handle = shm.create_shared_memory_region("e2e_reg", f"/{tag}", REGION_BYTES)
    try:
        bad = {
            "missing object": ("e2e_bad", f"/{tag}_missing", 0, 64),
            "beyond the object": ("e2e_bad", f"/{tag}", 0, REGION_BYTES + 1),
            "offset beyond the object": ("e2e_bad", f"/{tag}", REGION_BYTES, 64),
            "path traversal": ("e2e_bad", "/../etc/passwd", 0, 64),
            "empty key": ("e2e_bad", "", 0, 64),
        }
        for case, (name, key, offset, size) in bad.items():
            with pytest.raises(InferenceServerException) as caught:
                client.register_system_shared_memory(name, key, size, offset=offset)
            assert status_of(caught.value) == "INVALID_ARGUMENT", (case, caught.value)
        assert list(client.get_system_shared_memory_status("e2e_bad").regions) == []
    finally:
        shm.destroy_shared_memory_region(handle)


def test_unregister_makes_the_region_unknown(client: Any, regions: tuple[Any, Any]) -> None:
    del regions
    assert client.infer("mlp", [_shm_input()]).as_numpy("logits").shape == (3, 4)
    client.unregister_system_shared_memory("e2e_in")
    client.unregister_system_shared_memory("e2e_in")  # idempotent
    assert list(client.get_system_shared_memory_status().regions) == ["e2e_out"]
    outcome = _fails(client, [_shm_input()])
    assert outcome.startswith("FAILED_PRECONDITION:"), outcome
    assert "e2e_in" in outcome
    client.unregister_system_shared_memory()  # empty name: all
    assert list(client.get_system_shared_memory_status().regions) == []
