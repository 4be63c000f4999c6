"""``TraceSetting`` through stock ``tritonclient``: Triton's keys, and run-time changes that
change what is traced (level, rate, count, per model)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from ._servers import MODEL, Servers
from .test_spans import TRACEPARENT, grpc_infer

CONFIGURED = {
    "trace_level": ["TIMESTAMPS"],
    "trace_rate": ["1"],
    "trace_count": ["-1"],
    "trace_mode": ["opentelemetry"],
    "trace_file": [""],
    "log_frequency": ["0"],
}
RESET = {"trace_level": None, "trace_rate": None, "trace_count": None}


def _grpc_settings(answer: Any) -> dict[str, list[str]]:
    return {key: list(value.value) for key, value in answer.settings.items()}


@pytest.fixture
def worker(traced: Servers) -> Iterator[Any]:
    """A gRPC client of the worker; every setting goes back to the configured one after."""
    with grpcclient.InferenceServerClient(traced.worker_grpc) as client:
        try:
            yield client
        finally:
            client.update_trace_settings(MODEL, RESET)
            client.update_trace_settings(settings=RESET)


def test_settings_read_in_tritons_keys_over_grpc_and_rest(traced: Servers, worker: Any) -> None:
    assert _grpc_settings(worker.get_trace_settings()) == CONFIGURED
    assert _grpc_settings(worker.get_trace_settings(MODEL)) == CONFIGURED
    rest = httpclient.InferenceServerClient(traced.worker_http)
    try:
        assert rest.get_trace_settings() == CONFIGURED
        changed = rest.update_trace_settings(settings={"trace_rate": "4"})
        assert changed["trace_rate"] == ["4"]
    finally:
        rest.close()
    assert _grpc_settings(worker.get_trace_settings())["trace_rate"] == ["4"]
    gateway = f"127.0.0.1:{traced.lane_gateway.grpc_port}"
    with grpcclient.InferenceServerClient(gateway) as client:
        assert _grpc_settings(client.get_trace_settings()) == CONFIGURED  # its own


def test_level_off_stops_tracing_and_timestamps_resumes_it(traced: Servers, worker: Any) -> None:
    answer = worker.update_trace_settings(settings={"trace_level": ["OFF"]})
    assert _grpc_settings(answer)["trace_level"] == ["OFF"]
    assert not traced.worker.state.tracing.active
    grpc_infer(traced.worker_grpc, {"traceparent": TRACEPARENT})
    assert traced.spans.get_finished_spans() == ()
    worker.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    grpc_infer(traced.worker_grpc, {"traceparent": TRACEPARENT})
    assert len(traced.spans.get_finished_spans()) == 4


def test_a_model_may_differ_from_the_global_settings(traced: Servers, worker: Any) -> None:
    worker.update_trace_settings(settings={"trace_level": ["OFF"]})
    assert traced.worker.state.tracing.active is False
    answer = worker.update_trace_settings(MODEL, {"trace_level": ["TIMESTAMPS"]})
    assert _grpc_settings(answer)["trace_level"] == ["TIMESTAMPS"]
    assert _grpc_settings(worker.get_trace_settings())["trace_level"] == ["OFF"]
    grpc_infer(traced.worker_grpc)
    assert len(traced.spans.get_finished_spans()) == 4
    worker.update_trace_settings(MODEL, {"trace_level": None})  # back to the global OFF
    assert _grpc_settings(worker.get_trace_settings(MODEL))["trace_level"] == ["OFF"]


def test_rate_zero_keeps_only_traces_whose_parent_is_sampled(traced: Servers, worker: Any) -> None:
    worker.update_trace_settings(settings={"trace_rate": ["0"]})
    grpc_infer(traced.worker_grpc)
    assert traced.spans.get_finished_spans() == ()
    grpc_infer(traced.worker_grpc, {"traceparent": TRACEPARENT})
    assert len(traced.spans.get_finished_spans()) == 4
    unsampled = TRACEPARENT[:-2] + "00"
    traced.spans.clear()
    grpc_infer(traced.worker_grpc, {"traceparent": unsampled})
    assert traced.spans.get_finished_spans() == ()


def test_count_stops_tracing_after_that_many_traces(traced: Servers, worker: Any) -> None:
    worker.update_trace_settings(settings={"trace_count": ["2"]})
    for _ in range(4):
        grpc_infer(traced.worker_grpc)
    servers = [s for s in traced.spans.get_finished_spans() if s.name == "ModelInfer"]
    assert len(servers) == 2
    assert _grpc_settings(worker.get_trace_settings())["trace_count"] == ["0"]
    assert not traced.worker.state.tracing.active


@pytest.mark.parametrize(
    ("settings", "wording"),
    [
        ({"trace_level": ["TENSORS"]}, "not supported"),
        ({"trace_rate": ["often"]}, "whole number"),
        ({"trace_count": ["-2"]}, ">= -1"),
        ({"trace_file": ["/tmp/trace.json"]}, "cannot be changed"),
        ({"trace_mode": ["triton"]}, "cannot be changed"),
        ({"no_such_key": ["1"]}, "unknown trace setting"),
    ],
)
def test_bad_settings_are_refused_and_change_nothing(
    worker: Any, settings: dict[str, list[str]], wording: str
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        worker.update_trace_settings(settings=settings)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT", caught.value
    assert wording in str(caught.value)
    assert _grpc_settings(worker.get_trace_settings()) == CONFIGURED
