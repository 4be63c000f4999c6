"""Everything that touches OpenTelemetry: the provider, the sampler, spans, ``traceparent``.

The only module of the project that imports ``opentelemetry``; :mod:`reactantserver.core.tracing`
imports it when a tracer is asked for, and only then, so a process without the ``tracing``
extra never needs the packages. Spans are exported in the background (a batch processor for
OTLP), never on the request path.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from reactantserver.core.config import TraceExporter, TracingConfig

__all__ = ["MODEL_ATTRIBUTE", "OtelSpan", "OtelTracer"]

_PROPAGATOR = TraceContextTextMapPropagator()
_SCOPE = "reactantserver"
#: The span attribute the sampler reads the model from.
MODEL_ATTRIBUTE = "reactant.model"

#: ``(model, parent sampled or None for a root) -> record this trace?``
Decide = Callable[[str, "bool | None"], bool]


class _Sampler(Sampler):
    """Parent-based sampling whose root decision, rate and count are the settings' own.

    A span with a local parent (a request's phases) follows it; any other asks ``decide``,
    which knows the model's settings and counts traces down.
    """

    def __init__(self, decide: Decide) -> None:
        self._decide = decide

    def should_sample(  # noqa: PLR0917 - the SDK's signature
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        state = parent.trace_state if parent.is_valid else None
        if parent.is_valid and not parent.is_remote:
            sampled = parent.trace_flags.sampled
        else:
            model = str((attributes or {}).get(MODEL_ATTRIBUTE, ""))
            sampled = self._decide(model, parent.trace_flags.sampled if parent.is_valid else None)
        if sampled:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, state)
        return SamplingResult(Decision.DROP, None, state)

    def get_description(self) -> str:
        return "ReactantParentBased"


def _resource(config: TracingConfig, default_service: str) -> Any:
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; an explicit name
    # is set only when the file gives one or the environment does not.
    attributes: dict[str, str] = {}
    if config.service_name:
        attributes["service.name"] = config.service_name
    elif not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = default_service
    return Resource.create(attributes)


def _processor(config: TracingConfig) -> SpanProcessor | None:
    if config.exporter is TraceExporter.CONSOLE:
        return SimpleSpanProcessor(ConsoleSpanExporter())
    if config.exporter is TraceExporter.OTLP:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        # No endpoint: the exporter reads the OTEL_EXPORTER_OTLP_* variables itself.
        exporter = OTLPSpanExporter(endpoint=config.endpoint or None)
        return BatchSpanProcessor(exporter)
    return None


class OtelSpan:
    """One live span (possibly not recording: its context still propagates)."""

    __slots__ = ("_context", "_offset_ns", "_span", "_tracer", "recording")

    def __init__(self, span: Any, tracer: Any) -> None:
        self._span = span
        self._tracer = tracer
        self._context: Context | None = None  # the children's parent, made once
        self.recording: bool = span.is_recording()
        # Monotonic -> wall clock, fixed for the span's life (phase marks are monotonic).
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    def set(self, key: str, value: str | int | float | bool) -> None:
        """Set an attribute."""
        self._span.set_attribute(key, value)

    def event(self, name: str, attributes: Mapping[str, str | int] | None = None) -> None:
        """Add a timestamped event."""
        self._span.add_event(name, dict(attributes or {}))

    def child(
        self,
        name: str,
        start_mono_ns: int,
        end_mono_ns: int,
        attributes: Mapping[str, str | int | float | bool] | None = None,
    ) -> None:
        """A finished child span from two ``time.monotonic_ns()`` marks."""
        if self._context is None:
            self._context = trace.set_span_in_context(self._span)
        child = self._tracer.start_span(
            name,
            context=self._context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=start_mono_ns + self._offset_ns,
        )
        child.end(end_time=end_mono_ns + self._offset_ns)

    def headers(self) -> tuple[tuple[str, str], ...]:
        """``traceparent`` (and ``tracestate``) naming this span, to forward."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(self._span))
        return tuple(carrier.items())

    def fail(self, description: str) -> None:
        """Mark the span failed."""
        self._span.set_status(Status(StatusCode.ERROR, description))

    def end(self) -> None:
        """End the span now."""
        self._span.end()


class OtelTracer:
    """A private tracer provider (not the global one): one per server, its own resource."""

    def __init__(self, config: TracingConfig, default_service: str, decide: Decide) -> None:
        self.provider = TracerProvider(
            resource=_resource(config, default_service), sampler=_Sampler(decide)
        )
        processor = _processor(config)
        if processor is not None:
            self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer(_SCOPE)

    def export_to(self, exporter: SpanExporter) -> None:
        """Also hand every finished span to ``exporter``, synchronously (tests, embedding)."""
        self.provider.add_span_processor(SimpleSpanProcessor(exporter))

    def start(
        self,
        name: str,
        carrier: Mapping[str, str],
        attributes: Mapping[str, str | int | float | bool],
    ) -> OtelSpan:
        """A server span, child of the ``traceparent`` in ``carrier`` when there is one."""
        context = _PROPAGATOR.extract(carrier) if carrier else None
        span = self.tracer.start_span(
            name, context=context, kind=SpanKind.SERVER, attributes=attributes
        )
        return OtelSpan(span, self.tracer)

    def shutdown(self) -> None:
        """Flush and stop the exporters."""
        self.provider.shutdown()
