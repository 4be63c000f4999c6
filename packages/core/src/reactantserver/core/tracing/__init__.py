"""OpenTelemetry tracing of inference requests, shared by the worker and the gateway.

:class:`Tracing` is built once per server from its ``tracing.*`` section. With
``mode: off``, or without the ``tracing`` extra installed, it never imports OpenTelemetry and
:attr:`Tracing.active` stays ``False``: the request path reads that one attribute and does
nothing more. When active, a request gets a server span (:meth:`Tracing.start`), child of
the ``traceparent`` its client sent; sampling is parent-based, with the rate, level and count
that ``TraceSetting`` shows and changes (:func:`answer_trace_settings`)::

    tracing = Tracing(config.tracing, service="reactantserver-worker")
    if tracing.active:
        span = tracing.start("ModelInfer", context.invocation_metadata(), model="mlp")
        ...
        span.end()
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any, Protocol

import grpc

from reactantserver.core.config import TraceMode, TracingConfig
from reactantserver.core.errors import FailedPreconditionError
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.rest import http_status
from reactantserver.core.tracing._settings import SettingsBook, TraceSettings

__all__ = [
    "TRACE_HEADERS",
    "RequestSpan",
    "Tracing",
    "answer_trace_settings",
    "end_span",
    "opentelemetry_missing",
]

_log = logging.getLogger("reactantserver.tracing")

#: The W3C trace-context headers (gRPC metadata keys) read from requests and forwarded.
TRACE_HEADERS = ("traceparent", "tracestate")


class RequestSpan(Protocol):
    """One request's span as the servers use it (an OpenTelemetry span underneath)."""

    recording: bool
    """Whether this span is sampled; an unsampled one only propagates its context."""

    def set(self, key: str, value: str | int | float | bool) -> None:
        """Set an attribute."""

    def event(self, name: str, attributes: Mapping[str, str | int] | None = None) -> None:
        """Add a timestamped event."""

    def child(
        self,
        name: str,
        start_mono_ns: int,
        end_mono_ns: int,
        attributes: Mapping[str, str | int | float | bool] | None = None,
    ) -> None:
        """Record a finished child span between two ``time.monotonic_ns()`` marks."""

    def headers(self) -> tuple[tuple[str, str], ...]:
        """The ``traceparent`` (and ``tracestate``) naming this span, for the next hop."""

    def fail(self, description: str) -> None:
        """Set the error status."""

    def end(self) -> None:
        """End the span now."""


def _load_otel() -> tuple[ModuleType | None, str]:
    """The module that wraps OpenTelemetry, or ``None`` and why it cannot be imported."""
    try:
        from reactantserver.core.tracing import _otel
    except ImportError as exc:
        return None, str(exc)
    return _otel, ""


def opentelemetry_missing() -> str | None:
    """Why OpenTelemetry cannot be used here (``None``: it can)."""
    module, reason = _load_otel()
    return None if module is not None else reason


def _carrier_of(metadata: Iterable[tuple[str, Any]]) -> dict[str, str]:
    """The trace-context entries of request metadata or headers (keys lower-cased)."""
    carrier: dict[str, str] = {}
    for key, value in metadata:
        lowered = key.lower()
        if lowered in TRACE_HEADERS and isinstance(value, str):
            carrier[lowered] = value
    return carrier


class Tracing:
    """One server's tracer and its live settings; :attr:`active` is the request path's test.

    ``service`` is the default ``service.name`` (``tracing.service_name`` and
    ``OTEL_SERVICE_NAME`` come first). Used from one event loop.
    """

    def __init__(self, config: TracingConfig, *, service: str) -> None:
        self.config = config
        #: Whether a request may be traced now; everything else is skipped while it is False.
        self.active = False
        self._book = SettingsBook(
            TraceSettings(level=config.level, rate=config.rate, count=config.count)
        )
        self._tracer: Any = None
        #: Why there is no tracer (``None``: there is one).
        self.off_reason: str | None = "tracing.mode is off"
        if config.mode is TraceMode.OPENTELEMETRY:
            module, reason = _load_otel()
            if module is None:
                self.off_reason = (
                    f"OpenTelemetry is not installed ({reason}); install the 'tracing' extra"
                )
                _log.warning("tracing.mode is opentelemetry but %s: tracing is off", reason)
            else:
                self._tracer = module.OtelTracer(config, service, self._decide)
                self._model_attribute: str = module.MODEL_ATTRIBUTE
                self.off_reason = None
        self._refresh()

    def _refresh(self) -> None:
        self.active = self._tracer is not None and self._book.any_tracing

    def _decide(self, model: str, parent_sampled: bool | None) -> bool:
        settings = self._book.for_model(model)
        if not settings.tracing:
            return False
        sampled = parent_sampled
        if sampled is None:
            sampled = settings.rate >= 1 or random.random() < settings.rate
        if sampled and settings.count > 0:
            settings.take()
            if settings.count == 0:
                self._refresh()
        return sampled

    def start(
        self,
        name: str,
        metadata: Iterable[tuple[str, Any]],
        *,
        model: str,
        attributes: Mapping[str, str | int | float | bool] | None = None,
    ) -> RequestSpan:
        """A server span for one request of ``model`` (call only while :attr:`active`).

        Its parent is the ``traceparent`` in ``metadata`` (gRPC metadata or HTTP headers),
        if any; an unsampled span is returned too, so that its context still propagates.
        """
        assert self._tracer is not None
        values: dict[str, str | int | float | bool] = {self._model_attribute: model}
        if attributes:
            values.update(attributes)
        span: RequestSpan = self._tracer.start(name, _carrier_of(metadata), values)
        return span

    def export_to(self, exporter: Any) -> None:
        """Also send every finished span to ``exporter`` (an OpenTelemetry ``SpanExporter``),
        synchronously: for tests and for embedding a server in a process that reads them."""
        if self._tracer is None:
            raise FailedPreconditionError(f"no tracer: {self.off_reason}")
        self._tracer.export_to(exporter)

    def settings(self, model: str = "") -> dict[str, list[str]]:
        """The settings of ``model`` (or the global ones) under Triton's ``TraceSetting`` keys."""
        answer = self._book.answer(model)
        if self._tracer is None:
            answer["trace_level"] = ["OFF"]
        return answer

    def update(self, model: str, updates: Mapping[str, list[str]]) -> None:
        """Change settings at run time (``INVALID_ARGUMENT`` for a bad one, nothing changed;
        ``FAILED_PRECONDITION`` when this process has no tracer)."""
        if self._tracer is None:
            raise FailedPreconditionError(f"trace settings cannot change: {self.off_reason}")
        self._book.update(model, updates)
        self._refresh()

    def shutdown(self) -> None:
        """Flush the exporters (at server shutdown)."""
        if self._tracer is not None:
            self._tracer.shutdown()


def end_span(span: RequestSpan, code: grpc.StatusCode, detail: str, *, http: bool) -> None:
    """Set a request's outcome on its span (the gRPC code; the HTTP status too for a REST
    request, ``http``; the error status with ``detail`` unless OK) and end it."""
    span.set("rpc.grpc.status_code", code.value[0])
    if http:
        span.set("http.response.status_code", http_status(code))
    if code is not grpc.StatusCode.OK:
        span.fail(f"{code.name}: {detail}")
    span.end()


def answer_trace_settings(
    tracing: Tracing, request: pb.TraceSettingRequest
) -> pb.TraceSettingResponse:
    """``TraceSetting``: apply the request's settings, if any, then show those in force."""
    if request.settings:
        updates = {key: list(value.value) for key, value in request.settings.items()}
        tracing.update(request.model_name, updates)
    response = pb.TraceSettingResponse()
    for key, values in tracing.settings(request.model_name).items():
        response.settings[key].value.extend(values)
    return response
