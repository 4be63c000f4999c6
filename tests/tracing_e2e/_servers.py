"""A real worker and two real gateways in this process, on one background event loop.

The spans are read in-process: every server hands its finished spans to one
``InMemorySpanExporter`` (``Tracing.export_to``), the one seam of these tests; the servers,
their ports and the clients (stock ``tritonclient``) are real. One gateway forwards over the
worker's forwarding lane, the other over gRPC.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
import numpy as np
import yaml
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from safetensors.numpy import save_file

from packages.worker.tests.conftest import Tensor, export_module
from reactantserver.core.config import worker_config_from_mapping
from reactantserver.gateway.config import gateway_config_from_mapping
from reactantserver.gateway.server import GatewayServer
from reactantserver.worker.server import WorkerServer

_T = TypeVar("_T")

MODEL = "scale"
X = Tensor("x", "f32", "nk", {"k": 3})
W = np.array([0.5, -2.0, 3.25], np.float32)
TRACING = {"mode": "opentelemetry", "exporter": "none"}


def _scale(x: Any, w: Any) -> Any:  # traced by jax.export in export_module
    return x * w


def write_bundle(root: Path) -> Path:
    """``root/scale``: ``y = x * w`` over rows of 3, compiled for batches of 1 and 4."""
    bundle = root / MODEL
    bundle.mkdir(parents=True)
    for batch in (1, 4):
        module = export_module(_scale, [X], [("w", W)], batch)
        (bundle / f"model.b{batch}.mlir").write_bytes(module)
    save_file({"w": W}, str(bundle / "weights.safetensors"), {"argument_order": json.dumps(["w"])})
    manifest = {
        "format_version": "3.0",
        "executable_inputs": [X.entry()],
        "executable_outputs": [Tensor("y", "f32", "nk", {"k": 3}).entry()],
        "batching": {"compiled_batch_sizes": [1, 4]},
    }
    (bundle / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    return bundle


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@attrs.define
class Servers:
    """The running servers, their loop and the spans they exported."""

    loop: asyncio.AbstractEventLoop
    worker: WorkerServer
    lane_gateway: GatewayServer
    grpc_gateway: GatewayServer
    spans: InMemorySpanExporter

    def call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coroutine`` on the servers' loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(60)

    @property
    def worker_grpc(self) -> str:
        return f"127.0.0.1:{self.worker.grpc_port}"

    @property
    def worker_http(self) -> str:
        return f"127.0.0.1:{self.worker.http_port}"


async def _gateway(worker: WorkerServer, *, lane: bool) -> GatewayServer:
    config = gateway_config_from_mapping(
        {
            "endpoints": [f"127.0.0.1:{worker.grpc_port}"],
            "listen": {"grpc": "127.0.0.1:0", "metrics": "127.0.0.1:0"},
            "worker_client": {"lane": lane},
            "tracing": TRACING,
        },
        {},
    )
    server = GatewayServer(config, version="9.9.9")
    await server.start()
    return server


def running_servers(root: Path) -> Iterator[Servers]:
    """Start a traced worker serving :data:`MODEL` and two traced gateways; stop them after."""
    models = root / "models"
    write_bundle(models)
    config = worker_config_from_mapping(
        {
            "model_dirs": [str(models)],
            "cache_dir": str(root / "cache"),
            "model_control_mode": "static",
            "endpoints": {
                "host": "127.0.0.1",
                "port": free_port(),
                "http_port": free_port(),
                "metrics_port": free_port(),
            },
            "tracing": TRACING,
        },
        {},
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="tracing-test-loop", daemon=True)
    thread.start()
    spans = InMemorySpanExporter()

    async def start() -> tuple[WorkerServer, GatewayServer, GatewayServer]:
        worker = WorkerServer(config, version="9.9.9")
        worker.state.tracing.export_to(spans)
        await worker.start()
        await worker.wait_booted()
        lane_gateway = await _gateway(worker, lane=True)
        grpc_gateway = await _gateway(worker, lane=False)
        for gateway in (lane_gateway, grpc_gateway):
            gateway.tracing.export_to(spans)
        return worker, lane_gateway, grpc_gateway

    async def stop(servers: Servers) -> None:
        await servers.lane_gateway.shut_down()
        await servers.grpc_gateway.shut_down()
        await servers.worker.shut_down()

    try:
        worker, lane_gateway, grpc_gateway = asyncio.run_coroutine_threadsafe(start(), loop).result(
            180
        )
        servers = Servers(loop, worker, lane_gateway, grpc_gateway, spans)
        try:
            yield servers
        finally:
            servers.call(stop(servers))
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
