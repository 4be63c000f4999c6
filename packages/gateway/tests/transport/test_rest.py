"""KServe V2 REST on the gateway's HTTP port, over real sockets: a real gateway, gRPC workers.

The workers are small grpc.aio servers on 127.0.0.1 answering the inference service's probe,
metadata and ``ModelInfer`` calls (``y = x * factor``, the factor naming the worker), so a
test sees which worker served a request and can make one fail with a chosen status. Requests
are encoded and answers decoded with the stock ``tritonclient.http`` (JSON and binary data).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient

from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.protocol import inference_service_handler
from reactantserver.core.rest import RestCallError
from reactantserver.gateway.config import gateway_config_from_mapping
from reactantserver.gateway.server import GatewayServer
from reactantserver.gateway.transport.rest import GatewayRestBackend

MODEL = "m"
Array = np.ndarray[Any, Any]


class FakeWorker:
    """A gRPC worker serving ``MODEL`` (``y = x * factor``); ``fail`` makes ModelInfer abort."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.fail: grpc.StatusCode | None = None
        self.infers = 0
        self.port = 0
        self._server: grpc.aio.Server | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        async def ready(request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
            return pb.ServerReadyResponse(ready=True)

        async def index(
            request: pb.RepositoryIndexRequest, context: Any
        ) -> pb.RepositoryIndexResponse:
            entry = pb.RepositoryIndexResponse.ModelIndex(name=MODEL, version="1", state="READY")
            return pb.RepositoryIndexResponse(models=[entry])

        async def metadata(
            request: pb.ModelMetadataRequest, context: Any
        ) -> pb.ModelMetadataResponse:
            if request.name != MODEL:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model '{request.name}'")
            tensor = pb.ModelMetadataResponse.TensorMetadata
            return pb.ModelMetadataResponse(
                name=MODEL,
                versions=["1"],
                platform="cpu",
                inputs=[tensor(name="x", datatype="FP32", shape=[-1, 2])],
                outputs=[tensor(name="y", datatype="FP32", shape=[-1, 2])],
            )

        async def infer(request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
            self.infers += 1
            if self.fail is not None:
                await context.abort(self.fail, f"worker {self.factor:g} says {self.fail.name}")
            (tensor,) = request.inputs
            x = np.frombuffer(request.raw_input_contents[0], np.float32)
            response = pb.ModelInferResponse(model_name=MODEL, model_version="1", id=request.id)
            response.outputs.add(name="y", datatype="FP32", shape=list(tensor.shape))
            response.raw_output_contents.append((x * np.float32(self.factor)).tobytes())
            return response

        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            [
                inference_service_handler(
                    {
                        "ServerReady": ready,
                        "RepositoryIndex": index,
                        "ModelMetadata": metadata,
                        "ModelInfer": infer,
                    }
                )
            ]
        )
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)


@contextlib.asynccontextmanager
async def gateway(factors: Sequence[float], **settings: Any) -> AsyncIterator[Any]:
    """A started gateway over one fake worker per factor; yields (base URL, server, workers)."""
    workers = [FakeWorker(f) for f in factors]
    try:
        for worker in workers:
            await worker.start()
        config = gateway_config_from_mapping(
            {
                "endpoints": [w.url for w in workers],
                "listen": {"grpc": "127.0.0.1:0", "metrics": "127.0.0.1:0"},
                "health": {"interval_seconds": 0.2},
                **settings,
            },
            {},
        )
        server = GatewayServer(config, version="9.9.9")
        await server.start()
        try:
            yield f"http://127.0.0.1:{server.http_port}", server, workers
        finally:
            await server.shut_down()
    finally:
        for worker in workers:
            await worker.stop()


Check = Callable[[aiohttp.ClientSession, str, GatewayServer, list[FakeWorker]], Awaitable[None]]


def run(factors: Sequence[float], check: Check, **settings: Any) -> None:
    async def main() -> None:
        async with (
            gateway(factors, **settings) as (base, server, workers),
            aiohttp.ClientSession() as session,
        ):
            await check(session, base, server, workers)

    asyncio.run(main())


def infer_body(x: Array, *, binary: bool) -> tuple[bytes, dict[str, str]]:
    """A ``tritonclient.http`` request body for ``MODEL`` and its headers."""
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("y", binary_data=binary)]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        [tensor], outputs=outputs
    )
    headers = {"Content-Type": "application/octet-stream"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    return body, headers


async def infer(
    session: aiohttp.ClientSession, base: str, x: Array, *, binary: bool = True
) -> tuple[int, Any]:
    """POST one inference; ``(status, y)`` on success, ``(status, error text)`` otherwise."""
    body, headers = infer_body(x, binary=binary)
    async with session.post(f"{base}/v2/models/{MODEL}/infer", data=body, headers=headers) as r:
        raw = await r.read()
        if r.status != 200:
            assert r.headers["Content-Type"].startswith("application/json")
            return r.status, json.loads(raw)["error"]
        length = r.headers.get("Inference-Header-Content-Length")
        result = httpclient.InferenceServerClient.parse_response_body(
            raw, header_length=None if length is None else int(length)
        )
        return r.status, result.as_numpy("y")


X = np.array([[1.0, 2.0], [3.0, -4.0]], np.float32)


def test_health_and_server_metadata_are_answered_by_the_gateway() -> None:
    async def check(
        session: aiohttp.ClientSession, base: str, server: GatewayServer, _: list[FakeWorker]
    ) -> None:
        for path in ("/v2/health/live", "/v2/health/ready"):
            async with session.get(base + path) as r:
                assert r.status == 200, path
        async with session.get(f"{base}/v2") as r:
            meta = await r.json()
        assert meta["name"] == "ReactantServer"
        assert meta["version"] == "9.9.9"
        assert "system_shared_memory" in meta["extensions"]
        async with session.get(f"{base}/healthz") as r:  # the probe paths stay
            assert (r.status, await r.text()) == (200, "ok")

    run([2.0], check)


def test_infer_json_and_binary_round_robin_over_both_workers() -> None:
    async def check(
        session: aiohttp.ClientSession, base: str, server: GatewayServer, workers: list[FakeWorker]
    ) -> None:
        seen = set()
        for i in range(4):
            status, y = await infer(session, base, X, binary=i % 2 == 0)
            assert status == 200, y
            assert y.dtype == np.float32
            factor = float(y[0, 0])
            np.testing.assert_array_equal(y, X * np.float32(factor))
            seen.add(factor)
        assert seen == {2.0, 3.0}
        assert [w.infers for w in workers] == [2, 2]
        # Counted like gRPC requests (the same Proxy.infer).
        text = server.metrics.render().decode()
        assert (
            'reactantserver_gateway_requests_total{model="m",rpc="ModelInfer",status="OK"} 4.0'
            in text
        )

    run([2.0, 3.0], check)


def test_infer_fails_over_on_unavailable() -> None:
    async def check(
        session: aiohttp.ClientSession, base: str, server: GatewayServer, workers: list[FakeWorker]
    ) -> None:
        workers[0].fail = grpc.StatusCode.UNAVAILABLE
        for _ in range(3):
            status, y = await infer(session, base, X)
            assert status == 200, y
            np.testing.assert_array_equal(y, X * np.float32(3.0))
        assert workers[1].infers == 3

    run([2.0, 3.0], check)


@pytest.mark.parametrize(
    ("code", "http"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (grpc.StatusCode.INTERNAL, 500),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
        (grpc.StatusCode.UNAVAILABLE, 503),
    ],
)
def test_worker_status_reaches_the_client_as_http(code: grpc.StatusCode, http: int) -> None:
    async def check(
        session: aiohttp.ClientSession, base: str, server: GatewayServer, workers: list[FakeWorker]
    ) -> None:
        workers[0].fail = code
        status, error = await infer(session, base, X)
        assert status == http
        assert f"says {code.name}" in error
        workers[0].fail = None
        assert (await infer(session, base, X))[0] == 200

    run([2.0], check)


def test_unknown_model_is_404_and_metadata_is_forwarded() -> None:
    async def check(
        session: aiohttp.ClientSession, base: str, server: GatewayServer, _: list[FakeWorker]
    ) -> None:
        body, headers = infer_body(X, binary=False)
        async with session.post(f"{base}/v2/models/nope/infer", data=body, headers=headers) as r:
            assert r.status == 404
            assert "nope" in (await r.json())["error"]
        async with session.get(f"{base}/v2/models/nope") as r:
            assert r.status == 404
        async with session.get(f"{base}/v2/models/{MODEL}") as r:
            assert r.status == 200
            meta = await r.json()
        assert meta["name"] == MODEL
        assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]

    run([2.0], check)


def test_inbound_cap_is_shared_with_grpc() -> None:
    async def check(
        session: aiohttp.ClientSession, base: str, server: GatewayServer, _: list[FakeWorker]
    ) -> None:
        server.proxy.inflight = 1  # one gRPC request in flight at the cap of 1
        status, error = await infer(session, base, X)
        assert status == 429
        assert "limit of 1" in error
        server.proxy.inflight = 0
        assert (await infer(session, base, X))[0] == 200

    run([2.0], check, grpc={"max_concurrent_requests_per_worker": 1})


def test_backend_refuses_streaming_and_unknown_methods() -> None:
    async def check(
        session: aiohttp.ClientSession, base: str, server: GatewayServer, _: list[FakeWorker]
    ) -> None:
        backend = GatewayRestBackend(server.service)
        for method in ("ModelStreamInfer", "NoSuchMethod", "CudaSharedMemoryStatus"):
            with pytest.raises(RestCallError) as caught:
                await backend.call(method, pb.ServerLiveRequest(), None)
            assert caught.value.code == grpc.StatusCode.UNIMPLEMENTED, method
        live = await backend.call("ServerLive", pb.ServerLiveRequest(), None)
        assert live == pb.ServerLiveResponse(live=True)

    run([2.0], check)


def test_a_rest_listener_of_its_own_serves_rest_and_probes_but_no_metrics() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        rest_port = probe.getsockname()[1]
    listen = {"http": f"127.0.0.1:{rest_port}", "grpc": "127.0.0.1:0", "metrics": "127.0.0.1:0"}

    async def check(
        session: aiohttp.ClientSession, base: str, server: GatewayServer, _: list[FakeWorker]
    ) -> None:
        assert server.http_port == rest_port != server.metrics_port
        assert base == f"http://127.0.0.1:{rest_port}"
        status, y = await infer(session, base, np.ones((2, 4), np.float32))
        assert status == 200, y
        for path, code in (("/v2/health/ready", 200), ("/readyz", 200), ("/metrics", 404)):
            async with session.get(f"{base}{path}") as reply:
                assert reply.status == code, path
        metrics = f"http://127.0.0.1:{server.metrics_port}"
        for path, code in (("/metrics", 200), ("/status", 200), ("/v2/health/ready", 404)):
            async with session.get(f"{metrics}{path}") as reply:
                assert reply.status == code, path

    run([1.0], check, listen=listen)
