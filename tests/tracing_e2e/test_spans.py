"""A client's trace reaches the worker: one trace id, gateway span, worker span and phases.

Stock ``tritonclient`` calls with a W3C ``traceparent`` go through a real gateway (over the
worker's forwarding lane, or over gRPC) to a real worker, by gRPC and by REST; the span tree
the servers export is checked link by link.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from tritonclient.utils import InferenceServerException

from ._servers import MODEL, Servers, W

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
CLIENT_SPAN = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{CLIENT_SPAN:016x}-01"
ROWS = np.arange(6, dtype=np.float32).reshape(2, 3)


def _service(span: ReadableSpan) -> str:
    return str(span.resource.attributes["service.name"])


def _by_name(spans: Sequence[ReadableSpan], service: str) -> dict[str, ReadableSpan]:
    return {span.name: span for span in _by_name_all(spans, service)}


def _parent(span: ReadableSpan) -> int:
    assert span.parent is not None, span.name
    return span.parent.span_id


def grpc_infer(url: str, headers: dict[str, str] | None = None, model: str = MODEL) -> Any:
    with grpcclient.InferenceServerClient(url) as client:
        x = grpcclient.InferInput("x", list(ROWS.shape), "FP32")
        x.set_data_from_numpy(ROWS)
        return client.infer(model, [x], headers=headers).as_numpy("y")


def http_infer(url: str, headers: dict[str, str] | None = None) -> Any:
    client = httpclient.InferenceServerClient(url)
    try:
        x = httpclient.InferInput("x", list(ROWS.shape), "FP32")
        x.set_data_from_numpy(ROWS)
        return client.infer(MODEL, [x], headers=headers).as_numpy("y")
    finally:
        client.close()


def check_worker_tree(
    spans: Sequence[ReadableSpan], *, parent: int, transport: str
) -> dict[str, ReadableSpan]:
    """The worker's ``ModelInfer`` span under ``parent`` and its three phases under it."""
    worker = _by_name(spans, "reactantserver-worker")
    assert sorted(worker) == ["ModelInfer", "execute", "queue", "respond"], sorted(worker)
    server = worker["ModelInfer"]
    assert server.kind is SpanKind.SERVER
    assert server.context.trace_id == TRACE_ID
    assert _parent(server) == parent
    assert server.attributes is not None
    assert server.attributes["reactant.model"] == MODEL
    assert server.attributes["reactant.transport"] == transport
    assert server.attributes["rpc.grpc.status_code"] == 0
    assert server.status.status_code is StatusCode.UNSET
    for name in ("queue", "execute", "respond"):
        phase = worker[name]
        assert phase.context.trace_id == TRACE_ID
        assert _parent(phase) == server.context.span_id, name
        spans_in_order = [server.start_time, phase.start_time, phase.end_time, server.end_time]
        assert None not in spans_in_order, name
        assert spans_in_order == sorted(spans_in_order), name  # type: ignore[type-var]
    assert worker["queue"].end_time == worker["execute"].start_time
    execute = worker["execute"].attributes
    assert execute is not None
    assert execute["reactant.model"] == MODEL
    assert execute["reactant.model_version"] == "1"
    assert execute["reactant.batch_size"] == 4  # 2 rows run at the compiled size 4
    assert execute["reactant.rows"] == 2
    assert execute["reactant.batch_rows"] == 2
    return worker


@pytest.mark.parametrize("lane", [True, False], ids=["lane", "grpc"])
def test_grpc_call_through_the_gateway_is_one_trace(traced: Servers, lane: bool) -> None:
    gateway = traced.lane_gateway if lane else traced.grpc_gateway
    link = gateway.links[0]
    assert (link.lane is not None and link.lane.open) is lane
    out = grpc_infer(f"127.0.0.1:{gateway.grpc_port}", {"traceparent": TRACEPARENT})
    np.testing.assert_allclose(out, ROWS * W)
    spans = traced.spans.get_finished_spans()
    front = _by_name(spans, "reactantserver-gateway")
    assert sorted(front) == ["ModelInfer"]
    routed = front["ModelInfer"]
    assert routed.kind is SpanKind.SERVER
    assert routed.context.trace_id == TRACE_ID
    assert _parent(routed) == CLIENT_SPAN
    assert routed.attributes is not None
    assert routed.attributes["reactant.worker"] == link.label
    assert routed.attributes["reactant.policy"] == "round_robin"
    assert routed.attributes["reactant.transport"] == "grpc"
    worker = check_worker_tree(
        spans, parent=routed.context.span_id, transport="lane" if lane else "grpc"
    )
    server_start = worker["ModelInfer"].start_time
    assert routed.start_time is not None
    assert server_start is not None
    assert routed.start_time <= server_start


def test_rest_call_through_the_gateway_is_one_trace(traced: Servers) -> None:
    gateway = traced.lane_gateway
    out = http_infer(f"127.0.0.1:{gateway.http_port}", {"traceparent": TRACEPARENT})
    np.testing.assert_allclose(out, ROWS * W)
    spans = traced.spans.get_finished_spans()
    routed = _by_name(spans, "reactantserver-gateway")["ModelInfer"]
    assert _parent(routed) == CLIENT_SPAN
    assert routed.attributes is not None
    assert routed.attributes["reactant.transport"] == "http"
    assert routed.attributes["http.response.status_code"] == 200
    check_worker_tree(spans, parent=routed.context.span_id, transport="lane")


def test_rest_and_grpc_calls_straight_to_the_worker(traced: Servers) -> None:
    http_infer(traced.worker_http, {"traceparent": TRACEPARENT})
    check_worker_tree(traced.spans.get_finished_spans(), parent=CLIENT_SPAN, transport="http")
    traced.spans.clear()
    grpc_infer(traced.worker_grpc, {"traceparent": TRACEPARENT})
    check_worker_tree(traced.spans.get_finished_spans(), parent=CLIENT_SPAN, transport="grpc")


def test_a_call_without_traceparent_starts_its_own_trace(traced: Servers) -> None:
    grpc_infer(f"127.0.0.1:{traced.lane_gateway.grpc_port}")
    spans = traced.spans.get_finished_spans()
    assert len(spans) == 5  # the gateway's span, the worker's and its three phases
    routed = _by_name(spans, "reactantserver-gateway")["ModelInfer"]
    assert routed.parent is None
    assert {span.context.trace_id for span in spans} == {routed.context.trace_id}


def test_failures_set_the_error_status_with_the_code(traced: Servers) -> None:
    with pytest.raises(InferenceServerException):
        grpc_infer(
            f"127.0.0.1:{traced.grpc_gateway.grpc_port}",
            {"traceparent": TRACEPARENT},
            model="no_such_model",
        )
    (routed,) = traced.spans.get_finished_spans()
    assert routed.status.status_code is StatusCode.ERROR
    assert routed.attributes is not None
    assert routed.attributes["rpc.grpc.status_code"] == 5  # NOT_FOUND
    assert routed.status.description is not None
    assert routed.status.description.startswith("NOT_FOUND")
    traced.spans.clear()
    # A malformed request reaches the worker, which fails it in decoding.
    with grpcclient.InferenceServerClient(traced.worker_grpc) as client:
        x = grpcclient.InferInput("x", [2, 4], "FP32")
        x.set_data_from_numpy(np.zeros((2, 4), np.float32))
        with pytest.raises(InferenceServerException):
            client.infer(MODEL, [x], headers={"traceparent": TRACEPARENT})
    worker = _by_name(traced.spans.get_finished_spans(), "reactantserver-worker")
    assert sorted(worker) == ["ModelInfer"]  # no phase ran
    failed = worker["ModelInfer"]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None
    assert failed.attributes["rpc.grpc.status_code"] == 3  # INVALID_ARGUMENT


def stream_two(url: str) -> list[Any]:
    """Two messages over one ``ModelStreamInfer`` call with :data:`TRACEPARENT`; the answers."""
    answers: list[Any] = []
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(
            lambda result, error: answers.append(error or result),
            headers={"traceparent": TRACEPARENT},
        )
        x = grpcclient.InferInput("x", list(ROWS.shape), "FP32")
        x.set_data_from_numpy(ROWS)
        for request_id in ("a", "b"):
            client.async_stream_infer(MODEL, [x], request_id=request_id)
        client.stop_stream()
    assert sorted(answer.get_response().id for answer in answers) == ["a", "b"]
    return answers


def test_each_message_of_a_stream_is_traced_under_the_streams_parent(traced: Servers) -> None:
    stream_two(traced.worker_grpc)
    spans = traced.spans.get_finished_spans()
    servers = [span for span in spans if span.name == "ModelInfer"]
    assert len(servers) == 2
    assert {_parent(span) for span in servers} == {CLIENT_SPAN}
    assert [span.name for span in spans].count("execute") == 2


def test_a_stream_through_the_gateway_keeps_each_messages_trace(traced: Servers) -> None:
    stream_two(f"127.0.0.1:{traced.lane_gateway.grpc_port}")
    spans = traced.spans.get_finished_spans()
    routed = list(_by_name_all(spans, "reactantserver-gateway"))
    assert len(routed) == 2
    assert {_parent(span) for span in routed} == {CLIENT_SPAN}
    workers = [s for s in _by_name_all(spans, "reactantserver-worker") if s.name == "ModelInfer"]
    assert {_parent(span) for span in workers} == {span.context.span_id for span in routed}


def _by_name_all(spans: Sequence[ReadableSpan], service: str) -> list[ReadableSpan]:
    return [span for span in spans if _service(span) == service]
