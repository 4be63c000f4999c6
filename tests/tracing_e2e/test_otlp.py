"""The OTLP exporter end to end: a worker process sends its spans to a collector over gRPC.

The collector is a real gRPC server on 127.0.0.1 implementing OTLP's ``TraceService``; the
worker is a ``reactantserver-worker`` subprocess configured only through the environment:
``REACTANTSERVER_WORKER_TRACING_*`` turn tracing on and name the endpoint, and the SDK's own
``OTEL_SERVICE_NAME`` names the service. Spans are batched; the graceful shutdown (SIGTERM)
flushes them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.worker_e2e._harness import WorkerProcess

from ._servers import MODEL, Servers, free_port
from .test_spans import CLIENT_SPAN, TRACE_ID, TRACEPARENT


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span it is sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[tuple[str, Any]] = []

    def Export(self, request: Any, context: Any) -> Any:  # the OTLP method's name
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                )
                for scope in resource_spans.scope_spans:
                    self.spans.extend((service, span) for span in scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def collector() -> Iterator[tuple[Collector, int]]:
    """An OTLP/gRPC collector on a free port of 127.0.0.1."""
    sink = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)  # type: ignore[no-untyped-call]
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield sink, port
    finally:
        server.stop(None)


def test_a_worker_exports_its_spans_to_an_otlp_collector(
    servers: Servers, collector: tuple[Collector, int], tmp_path: Path
) -> None:
    sink, port = collector
    worker = WorkerProcess(
        Path(servers.worker.config.model_dirs[0]),
        tmp_path / "worker.log",
        {
            "REACTANTSERVER_WORKER_CACHE_DIR": servers.worker.config.cache_dir,
            "REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "static",
            "REACTANTSERVER_WORKER_TRACING_MODE": "opentelemetry",
            "REACTANTSERVER_WORKER_TRACING_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_SERVICE_NAME": "traced-worker",
        },
    )
    worker.start()
    try:
        worker.wait_ready()
        with grpcclient.InferenceServerClient(worker.url) as client:
            x = grpcclient.InferInput("x", [1, 3], "FP32")
            x.set_data_from_numpy(np.ones((1, 3), np.float32))
            client.infer(MODEL, [x], headers={"traceparent": TRACEPARENT})
    finally:
        assert worker.stop() == 0, worker.log_tail()
    with sink.lock:
        spans = list(sink.spans)
    assert sorted(span.name for _, span in spans) == ["ModelInfer", "execute", "queue", "respond"]
    assert {service for service, _ in spans} == {"traced-worker"}
    assert {int.from_bytes(span.trace_id, "big") for _, span in spans} == {TRACE_ID}
    server = next(span for _, span in spans if span.name == "ModelInfer")
    assert int.from_bytes(server.parent_span_id, "big") == CLIENT_SPAN
