"""``tracing.*``: OpenTelemetry spans of inference requests (worker and gateway files alike)."""

import attrs

from reactantserver.core.config._fields import Choice, between, setting

__all__ = ["TraceExporter", "TraceLevel", "TraceMode", "TracingConfig"]


class TraceMode(Choice):
    """``tracing.mode``: whether a tracer is built at all."""

    OFF = "off"
    OPENTELEMETRY = "opentelemetry"


class TraceLevel(Choice):
    """``tracing.level``: Triton's ``trace_level``; what a traced request records."""

    OFF = "off"
    TIMESTAMPS = "timestamps"


class TraceExporter(Choice):
    """``tracing.exporter``: where finished spans go."""

    OTLP = "otlp"
    CONSOLE = "console"
    NONE = "none"


@attrs.frozen
class TracingConfig:
    """``tracing.*``: OpenTelemetry spans per inference request, exported over OTLP/gRPC.

    Needs the distribution's ``tracing`` extra (the OpenTelemetry SDK); without it a process
    configured for tracing logs a warning and serves untraced. ``TraceSetting`` (gRPC, and
    REST ``/v2/trace/setting``) reads and changes ``level``, ``rate`` and ``count`` while the
    process runs.
    """

    mode: TraceMode = TraceMode.OFF
    """``off`` builds no tracer and costs nothing; ``opentelemetry`` builds one (then
    ``level`` says whether requests are traced)."""
    level: TraceLevel = TraceLevel.TIMESTAMPS
    """``timestamps`` traces sampled requests (the phases of each as spans), ``off`` traces
    none until ``TraceSetting`` sets Triton's ``trace_level`` to ``TIMESTAMPS``. Only read in
    ``opentelemetry`` mode."""
    rate: float = setting(1.0, check=between(0, 1))
    """Share of requests without a sampled parent that start a trace, in [0, 1]. Sampling is
    parent-based: a request whose ``traceparent`` says sampled (or not) follows its parent.
    ``TraceSetting`` shows it as Triton's ``trace_rate``, one request in N."""
    count: int = setting(-1, check=between(-1))
    """How many more traces to record before tracing stops by itself; -1: no limit (Triton's
    ``trace_count``)."""
    exporter: TraceExporter = TraceExporter.OTLP
    """``otlp`` sends spans to an OpenTelemetry collector over OTLP/gRPC, ``console`` prints
    them as JSON on stdout, ``none`` keeps them in the process (for embedding and tests)."""
    endpoint: str = setting("")
    """The collector's OTLP/gRPC address (``http://host:4317``). Empty: the SDK's own
    variables, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` then ``OTEL_EXPORTER_OTLP_ENDPOINT``,
    else ``http://localhost:4317``."""
    service_name: str = setting("")
    """The ``service.name`` of the spans. Empty: ``OTEL_SERVICE_NAME`` when set, else
    ``reactantserver-worker`` or ``reactantserver-gateway``."""
