"""Inference over REST with the stock ``tritonclient.http``: JSON and binary tensors, subsets
and order of outputs, NCHW images, hooks, system shared memory and the ``timeout`` parameter.

Every answer must equal (exactly) what ``tritonclient.grpc`` gets from the same process for the
same inputs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.worker_e2e._harness import rows

from ._target import Target, error_body, grpc_input, http_input, request

pytestmark = pytest.mark.slow

Array = np.ndarray[Any, Any]
Inputs = Sequence[tuple[str, Array, str]]
#: (JSON in, JSON out), (binary in, binary out) and the two mixes.
ENCODINGS = [(False, False), (True, True), (False, True), (True, False)]


def _both(
    target: Target, model: str, inputs: Inputs, outputs: Sequence[str] | None, *, binary: bool
) -> tuple[Any, Any]:
    """The REST and the gRPC answers for the same request (the REST one decoded)."""
    return _both_mixed(target, model, inputs, outputs, binary_in=binary, binary_out=binary)


def _both_mixed(
    target: Target,
    model: str,
    inputs: Inputs,
    outputs: Sequence[str] | None,
    *,
    binary_in: bool,
    binary_out: bool,
) -> tuple[Any, Any]:
    with target.clients() as (rest, rpc):
        rest_outputs = None
        rpc_outputs = None
        if outputs is not None:
            rest_outputs = [httpclient.InferRequestedOutput(n, binary_out) for n in outputs]
            rpc_outputs = [grpcclient.InferRequestedOutput(n) for n in outputs]
        got = rest.infer(
            model,
            [http_input(n, a, t, binary=binary_in) for n, a, t in inputs],
            outputs=rest_outputs,
        )
        want = rpc.infer(model, [grpc_input(n, a, t) for n, a, t in inputs], outputs=rpc_outputs)
    return got, want


def _assert_same(got: Any, want: Any) -> None:
    """Same outputs, in the same order, with the same names, datatypes, shapes and values."""
    rest_outputs = got.get_response()["outputs"]
    rpc_outputs = want.get_response().outputs
    assert [(o["name"], o["datatype"], o["shape"]) for o in rest_outputs] == [
        (o.name, o.datatype, list(o.shape)) for o in rpc_outputs
    ]
    for output in rpc_outputs:
        rest_array, rpc_array = got.as_numpy(output.name), want.as_numpy(output.name)
        assert rest_array.dtype == rpc_array.dtype
        np.testing.assert_array_equal(rest_array, rpc_array)


@pytest.mark.parametrize(("binary_in", "binary_out"), ENCODINGS)
def test_mlp_json_and_binary(target: Target, binary_in: bool, binary_out: bool) -> None:
    x = rows(5, 16, seed=1)
    got, want = _both_mixed(
        target, "mlp", [("x", x, "FP32")], ["logits"], binary_in=binary_in, binary_out=binary_out
    )
    _assert_same(got, want)
    logits = got.get_response()["outputs"][0]
    assert ("data" in logits) is not binary_out
    assert ("binary_data_size" in logits.get("parameters", {})) is binary_out


def test_mlp_request_id_and_default_outputs(target: Target) -> None:
    x = rows(2, 16, seed=2)
    with target.clients() as (rest, _):
        got = rest.infer("mlp", [http_input("x", x, "FP32", binary=True)], request_id="rest-7")
    response = got.get_response()
    assert response["id"] == "rest-7"
    assert response["model_name"] == "mlp"
    assert [o["name"] for o in response["outputs"]] == ["logits"]


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("outputs", [None, ["dot"], ["dot", "sum"], ["sum", "dot"]])
def test_two_io_output_subset_and_order(
    target: Target, outputs: list[str] | None, binary: bool
) -> None:
    a, b = rows(4, 8, seed=4), rows(4, 8, seed=5)
    inputs = [("a", a, "FP32"), ("b", b, "FP32")]
    got, want = _both(target, "two_io", inputs, outputs, binary=binary)
    _assert_same(got, want)
    names = [o["name"] for o in got.get_response()["outputs"]]
    assert names == (outputs or ["sum", "dot"])


@pytest.mark.parametrize("binary", [False, True])
def test_cnn_nchw(target: Target, binary: bool) -> None:
    images = np.random.default_rng(3).random((5, 1, 28, 28), dtype=np.float32)
    got, want = _both(target, "cnn", [("image", images, "FP32")], None, binary=binary)
    _assert_same(got, want)
    assert got.as_numpy("logits").shape == (5, 10)


@pytest.mark.parametrize("binary", [False, True])
def test_model_with_hooks(target: Target, binary: bool) -> None:
    images = np.random.default_rng(6).integers(0, 256, (3, 28, 28, 3), dtype=np.uint8)
    got, want = _both(target, "classifier_hooks", [("image", images, "UINT8")], None, binary=binary)
    _assert_same(got, want)
    indices = got.as_numpy("indices")
    assert indices.dtype == np.int64
    assert indices.shape == (3, 3)


# -- system shared memory -----------------------------------------------------------------------

REGION_BYTES = 1024
X_OFFSET = 128
OUT_OFFSET = 256


@pytest.fixture
def regions(target: Target) -> Iterator[tuple[Any, Any]]:
    """Regions ``rest_in`` and ``rest_out`` registered over REST (unregistered after)."""
    tag = f"rs_rest_{os.getpid()}_{target.name}"
    handle_in = shm.create_shared_memory_region("rest_in", f"/{tag}_in", REGION_BYTES)
    handle_out = shm.create_shared_memory_region("rest_out", f"/{tag}_out", REGION_BYTES)
    try:
        with target.clients() as (rest, _):
            rest.register_system_shared_memory("rest_in", f"/{tag}_in", REGION_BYTES)
            rest.register_system_shared_memory("rest_out", f"/{tag}_out", REGION_BYTES)
            try:
                yield handle_in, handle_out
            finally:
                rest.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(handle_in)
        shm.destroy_shared_memory_region(handle_out)


def test_shared_memory_in_and_out(target: Target, regions: tuple[Any, Any]) -> None:
    handle_in, handle_out = regions
    x = rows(3, 16, seed=21)
    shm.set_shared_memory_region(handle_in, [x], offset=X_OFFSET)
    with target.clients() as (rest, rpc):
        status = {r["name"]: r for r in rest.get_system_shared_memory_status()}
        assert set(status) == {"rest_in", "rest_out"}
        assert (int(status["rest_in"]["byte_size"]), int(status["rest_in"]["offset"])) == (
            REGION_BYTES,
            0,
        )
        assert status["rest_in"]["key"].endswith("_in")
        assert [r["name"] for r in rest.get_system_shared_memory_status("rest_out")] == ["rest_out"]

        tensor = httpclient.InferInput("x", [3, 16], "FP32")
        tensor.set_shared_memory("rest_in", x.nbytes, offset=X_OFFSET)
        output = httpclient.InferRequestedOutput("logits", binary_data=True)
        output.set_shared_memory("rest_out", 512, offset=OUT_OFFSET)
        got = rest.infer("mlp", [tensor], outputs=[output])
        (described,) = got.get_response()["outputs"]
        assert described["name"] == "logits"
        assert described["parameters"]["shared_memory_region"] == "rest_out"
        # The data is in the region, not in the body.
        assert "data" not in described
        assert "binary_data_size" not in described["parameters"]
        logits = shm.get_contents_as_numpy(handle_out, np.float32, [3, 4], offset=OUT_OFFSET)

        want = rpc.infer("mlp", [grpc_input("x", x, "FP32")]).as_numpy("logits")
        np.testing.assert_array_equal(logits, want)

        rest.unregister_system_shared_memory("rest_in")
        assert [r["name"] for r in rest.get_system_shared_memory_status()] == ["rest_out"]
        with pytest.raises(InferenceServerException) as caught:
            rest.infer("mlp", [tensor])
        assert "rest_in" in str(caught.value.message())


def test_register_a_missing_object_is_400(target: Target) -> None:
    body = b'{"key": "/rs_rest_no_such_object", "offset": 0, "byte_size": 64}'
    answer = request(target, "/v2/systemsharedmemory/region/nope/register", body)
    assert answer.status == 400, answer
    error_body(answer)


# -- deadlines ----------------------------------------------------------------------------------


def test_timeout_parameter_is_a_deadline(target: Target) -> None:
    x = rows(1, 16, seed=9)
    with target.clients() as (rest, rpc):
        generous = rest.infer("mlp", [http_input("x", x, "FP32", binary=True)], timeout=30_000_000)
        want = rpc.infer("mlp", [grpc_input("x", x, "FP32")])
        np.testing.assert_array_equal(generous.as_numpy("logits"), want.as_numpy("logits"))
        with pytest.raises(InferenceServerException) as rpc_error:
            rpc.infer("mlp", [grpc_input("x", x, "FP32")], timeout=1)
        assert "DEADLINE_EXCEEDED" in str(rpc_error.value.status())
        with pytest.raises(InferenceServerException) as rest_error:
            rest.infer("mlp", [http_input("x", x, "FP32", binary=True)], timeout=1)
        assert "deadline" in str(rest_error.value.message()).lower()
        # ... and the same over plain HTTP: 504 with a JSON error body.
        tensor = {"name": "x", "datatype": "FP32", "shape": [1, 16], "data": x.ravel().tolist()}
        body = {"inputs": [tensor], "parameters": {"timeout": 1}}
        answer = request(target, "/v2/models/mlp/infer", json.dumps(body).encode())
        assert answer.status == 504, answer
        error_body(answer)
        # The nanosecond budget of ReactantServer's own clients, as a custom parameter.
        with pytest.raises(InferenceServerException) as ns_error:
            rest.infer(
                "mlp",
                [http_input("x", x, "FP32", binary=True)],
                parameters={"reactant_timeout_ns": 1},
            )
        assert "deadline" in str(ns_error.value.message()).lower()
        roomy = rest.infer(
            "mlp",
            [http_input("x", x, "FP32", binary=False)],
            parameters={"reactant_timeout_ns": 30_000_000_000},
        )
        np.testing.assert_array_equal(roomy.as_numpy("logits"), want.as_numpy("logits"))
