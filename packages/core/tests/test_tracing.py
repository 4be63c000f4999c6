"""core.tracing without servers: Triton's trace settings, sampling, spans, the lane's frames."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reactantserver.core.config import TraceExporter, TraceLevel, TraceMode, TracingConfig
from reactantserver.core.errors import FailedPreconditionError, InvalidArgumentError
from reactantserver.core.lane import split_traced, traced_body
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.tracing import Tracing, answer_trace_settings
from reactantserver.core.tracing._settings import SettingsBook, TraceSettings

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _tracing(**config: object) -> Tracing:
    settings = {"mode": TraceMode.OPENTELEMETRY, "exporter": TraceExporter.NONE, **config}
    return Tracing(TracingConfig(**settings), service="test")  # type: ignore[arg-type]


def test_mode_off_builds_no_tracer_and_refuses_changes() -> None:
    tracing = Tracing(TracingConfig(), service="test")
    assert not tracing.active
    assert tracing.settings()["trace_level"] == ["OFF"]
    with pytest.raises(FailedPreconditionError, match=r"tracing\.mode is off"):
        tracing.update("", {"trace_rate": ["2"]})


def test_rates_read_as_one_in_n_or_a_fraction() -> None:
    book = SettingsBook(TraceSettings(level=TraceLevel.TIMESTAMPS, rate=0.01, count=-1))
    assert book.answer("")["trace_rate"] == ["100"]
    book.update("", {"trace_rate": ["4"]})
    assert book.global_settings.rate == 0.25
    book.update("", {"trace_rate": ["0.5"]})
    assert book.answer("")["trace_rate"] == ["2"]
    book.update("", {"trace_rate": ["0"]})
    assert book.answer("")["trace_rate"] == ["0"]
    book.update("", {"trace_rate": []})  # no value: back to the configured one
    assert book.global_settings.rate == 0.01
    with pytest.raises(InvalidArgumentError, match=r"in \[0, 1\]"):
        book.update("", {"trace_rate": ["1.5"]})


def test_model_overrides_follow_the_global_settings_they_do_not_override() -> None:
    book = SettingsBook(TraceSettings(level=TraceLevel.TIMESTAMPS, rate=1.0, count=-1))
    book.update("m", {"trace_count": ["3"]})
    book.update("", {"trace_level": ["OFF"], "trace_rate": ["2"]})
    assert book.answer("m")["trace_level"] == ["OFF"]
    assert book.answer("m")["trace_rate"] == ["2"]
    assert book.answer("m")["trace_count"] == ["3"]
    assert book.answer("other")["trace_count"] == ["-1"]
    book.for_model("m").take()
    book.update("", {"trace_level": ["TIMESTAMPS"]})
    assert book.answer("m")["trace_count"] == ["2"]  # its count-down survives a global change
    assert book.any_tracing
    book.update("m", {"trace_count": []})
    assert "m" not in book.models


def test_spans_follow_the_parent_and_count_down() -> None:
    tracing = _tracing(count=1)
    spans = InMemorySpanExporter()
    tracing.export_to(spans)
    span = tracing.start("ModelInfer", [("traceparent", PARENT)], model="m")
    assert span.recording
    now = time.monotonic_ns()
    span.child("queue", now - 1000, now)
    forwarded = dict(span.headers())["traceparent"]
    assert forwarded.startswith("00-0af7651916cd43dd8448eb211c80319c-")
    span.end()
    queue, server = spans.get_finished_spans()
    assert server.parent is not None
    assert server.parent.span_id == 0xB7AD6B7169203331
    assert queue.parent is not None
    assert queue.parent.span_id == server.context.span_id
    assert (queue.start_time or 0) + 1000 == queue.end_time
    assert not tracing.active  # trace_count 1 is spent
    assert tracing.settings()["trace_count"] == ["0"]


def test_an_unsampled_span_still_propagates_its_context() -> None:
    tracing = _tracing(rate=0.0)
    span = tracing.start("ModelInfer", [], model="m")
    assert not span.recording
    flags = dict(span.headers())["traceparent"].rsplit("-", 1)[1]
    assert int(flags, 16) & 1 == 0  # the sampled bit is clear


def test_answer_applies_then_shows_the_settings() -> None:
    tracing = _tracing()
    request = pb.TraceSettingRequest(model_name="m")
    request.settings["trace_level"].value.append("OFF")
    answer = answer_trace_settings(tracing, request)
    assert list(answer.settings["trace_level"].value) == ["OFF"]
    assert list(answer.settings["trace_mode"].value) == ["opentelemetry"]
    assert tracing.active  # the global level still traces


def test_lane_frames_carry_the_trace_context() -> None:
    headers = (("traceparent", PARENT), ("tracestate", "vendor=1"))
    assert split_traced(traced_body(headers, b"request")) == (headers, b"request")
    assert split_traced(traced_body(headers[:1], b"")) == (headers[:1], b"")
    assert split_traced(b"\x01") == ((), b"")
