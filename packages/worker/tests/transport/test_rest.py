"""KServe V2 REST on the worker's HTTP port: a real WorkerServer, the stock clients on both ports.

The server runs on its own event loop in a background thread; ``tritonclient.http`` talks to
its HTTP port and ``tritonclient.grpc`` to its gRPC port, and the answers must be identical.
The full surface against a worker subprocess (shared memory, hooks, the gateway) is in
``tests/rest_e2e``.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import grpc
import jax
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from packages.worker.tests.conftest import BundleMaker, Tensor
from reactantserver.core.config import worker_config_from_mapping
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.rest import RestCallError
from reactantserver.worker.server import WorkerServer
from reactantserver.worker.transport.inference import InferenceService
from reactantserver.worker.transport.rest import WorkerRestBackend

_T = TypeVar("_T")
Array = np.ndarray[Any, Any]

MODEL = "pair"
X = Tensor("x", "f32", "nk", {"k": 3})
W = np.array([0.5, -2.0, 3.25], np.float32)


def _pair(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    return x * w, x + w


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Served:
    """A WorkerServer on a background event loop (``call`` runs a coroutine there)."""

    def __init__(self, server: WorkerServer, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.server.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.server.grpc_port}"

    def call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)


@pytest.fixture
def served(make_bundle: BundleMaker, tmp_path: Path) -> Iterator[Served]:
    bundle = make_bundle(
        MODEL,
        _pair,
        inputs=[X],
        outputs=[Tensor("y", "f32", "nk", {"k": 3}), Tensor("z", "f32", "nk", {"k": 3})],
        weights=[("w", W)],
        batch_sizes=[1, 4],
    )
    config = worker_config_from_mapping(
        {
            "model_dirs": [str(bundle.parent)],
            "cache_dir": str(tmp_path / "cache"),
            "model_control_mode": "static",
            "endpoints": {"host": "127.0.0.1", "port": _free_port(), "metrics_port": _free_port()},
        },
        {},
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="rest-test-loop", daemon=True)
    thread.start()

    async def start() -> WorkerServer:
        server = WorkerServer(config, version="9.9.9")
        await server.start()
        await server.wait_booted()
        return server

    try:
        server = asyncio.run_coroutine_threadsafe(start(), loop).result(120)
        try:
            yield Served(server, loop)
        finally:
            asyncio.run_coroutine_threadsafe(server.shut_down(), loop).result(60)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def post(
    served: Served, path: str, body: bytes, headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """``(status, headers, body)`` of a plain ``POST`` (or ``GET`` with ``body == b""``)."""
    request = urllib.request.Request(
        f"http://{served.http}{path}",
        data=body or None,
        headers=dict(headers or {}),
        method="POST" if body else "GET",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read()


def error_of(status: int, headers: Mapping[str, str], body: bytes) -> str:
    """The JSON ``{"error"}`` body of a failed request."""
    assert headers["Content-Type"].startswith("application/json"), headers
    message: str = json.loads(body)["error"]
    return message


def rows(n: int) -> Array:
    return np.random.default_rng(n).standard_normal((n, 3)).astype(np.float32)


def test_rest_answers_equal_grpc_answers(served: Served) -> None:
    x = rows(3)
    with (
        httpclient.InferenceServerClient(served.http) as rest,
        grpcclient.InferenceServerClient(served.grpc) as rpc,
    ):
        assert rest.is_server_live()
        assert rest.is_server_ready()
        assert rest.is_model_ready(MODEL)
        assert not rest.is_model_ready("nope")
        assert rest.get_server_metadata()["version"] == "9.9.9"
        meta = rest.get_model_metadata(MODEL)
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
        assert rest.get_model_config(MODEL)["name"] == MODEL

        g_in = grpcclient.InferInput("x", [3, 3], "FP32")
        g_in.set_data_from_numpy(x)
        expected = rpc.infer(MODEL, [g_in])
        for binary in (False, True):
            h_in = httpclient.InferInput("x", [3, 3], "FP32")
            h_in.set_data_from_numpy(x, binary_data=binary)
            outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in "zy"]
            got = rest.infer(MODEL, [h_in], outputs=outputs, request_id=f"r{binary}")
            assert [o["name"] for o in got.get_response()["outputs"]] == ["z", "y"]
            assert got.get_response()["id"] == f"r{binary}"
            for name in "yz":
                np.testing.assert_array_equal(got.as_numpy(name), expected.as_numpy(name))
        np.testing.assert_array_equal(expected.as_numpy("y"), x * W)

        stats = rest.get_inference_statistics(MODEL)["model_stats"][0]
        assert stats["inference_count"] == 3 * 3
        index = rest.get_model_repository_index()
        assert index == [{"name": MODEL, "version": "1", "state": "READY"}]


def test_compressed_bodies_and_a_body_larger_than_aiohttp_default(served: Served) -> None:
    x = rows(2)
    with httpclient.InferenceServerClient(served.http) as rest:
        for algorithm in ("gzip", "deflate"):
            tensor = httpclient.InferInput("x", [2, 3], "FP32")
            tensor.set_data_from_numpy(x)
            got = rest.infer(
                MODEL,
                [tensor],
                request_compression_algorithm=algorithm,
                response_compression_algorithm=algorithm,
            )
            np.testing.assert_array_equal(got.as_numpy("y"), x * W)
        # 2 MiB of request id: over aiohttp's 1 MiB default, well under gRPC's 512 MiB.
        tensor = httpclient.InferInput("x", [2, 3], "FP32")
        tensor.set_data_from_numpy(x)
        long_id = "i" * (2 << 20)
        assert rest.infer(MODEL, [tensor], request_id=long_id).get_response()["id"] == long_id
    status, headers, body = post(
        served,
        f"/v2/models/{MODEL}/infer",
        gzip.compress(b'{"inputs": [{"name": "x"'),
        {"Content-Encoding": "gzip"},
    )
    assert status == 400
    assert error_of(status, headers, body)


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v2/models/nope/infer", {"inputs": []}, 404),
        ("/v2/models/pair/infer", b"{not json", 400),
        (
            "/v2/models/pair/infer",
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]},
            400,
        ),
        (
            "/v2/models/pair/infer",
            {"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 3], "data": [1] * 3}]},
            400,
        ),
        ("/v2/repository/models/pair/load", {}, 400),  # static mode: FAILED_PRECONDITION
        ("/v2/cudasharedmemory/region/r/unregister", {}, 400),  # UNIMPLEMENTED
        ("/v2/nowhere", {}, 404),
    ],
)
def test_errors_are_json_with_the_mapped_status(
    served: Served, path: str, body: Any, status: int
) -> None:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    got = post(served, path, payload)
    assert got[0] == status, got
    assert error_of(*got)
    good = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    status_ok, _, answer = post(served, f"/v2/models/{MODEL}/infer", json.dumps(good).encode())
    assert status_ok == 200, answer
    y = json.loads(answer)["outputs"][0]
    assert (y["name"], y["data"]) == ("y", [0.5, -4.0, 9.75])


def test_backend_runs_the_grpc_handlers_and_refuses_streaming(served: Served) -> None:
    backend = WorkerRestBackend(InferenceService(served.server.state))

    async def check() -> None:
        ready = await backend.call("ModelReady", pb.ModelReadyRequest(name=MODEL), None)
        assert ready == pb.ModelReadyResponse(ready=True)
        for method in ("ModelStreamInfer", "NoSuchMethod", "CudaSharedMemoryStatus"):
            with pytest.raises(RestCallError) as caught:
                await backend.call(method, pb.ServerLiveRequest(), None)
            assert caught.value.code == grpc.StatusCode.UNIMPLEMENTED, method
        with pytest.raises(RestCallError) as caught:
            await backend.call("ModelMetadata", pb.ModelMetadataRequest(name="nope"), None)
        assert caught.value.code == grpc.StatusCode.NOT_FOUND
        request = pb.ModelInferRequest(model_name=MODEL)
        request.inputs.add(name="x", datatype="FP32", shape=[1, 3])
        request.raw_input_contents.append(np.ones((1, 3), np.float32).tobytes())
        with pytest.raises(RestCallError) as caught:  # a zero budget: deadline at decode
            await backend.call("ModelInfer", request, 0.0)
        assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED

    served.call(check())


def test_rest_errors_raise_in_tritonclient(served: Served) -> None:
    with httpclient.InferenceServerClient(served.http) as rest:
        with pytest.raises(InferenceServerException) as caught:
            rest.get_model_metadata("nope")
        assert "nope" in str(caught.value.message())
        with pytest.raises(InferenceServerException):
            rest.unload_model(MODEL)  # static mode
