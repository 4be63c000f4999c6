"""The worker's Prometheus metrics: every series of 12 §Metrics/Worker, rendered for ``/metrics``.

Request outcomes are counted as they happen (:meth:`WorkerMetrics.observe_request`, installed as
``state.observe_request``); everything else is read from the :class:`WorkerState` at scrape
time. Every sample carries ``worker="<name>"`` (``config.worker_name``, else ``"worker"``) and,
on CUDA, ``gpu="<selector>"``::

    metrics = WorkerMetrics(state)      # installs itself as state.observe_request
    body = metrics.render()             # served with CONTENT_TYPE
    metrics.forget_model("resnet")      # after the registry dropped an unloaded model

Decisions the spec leaves open:

* Requests for names the registry does not hold (``NOT_FOUND``) create no series: clients
  could otherwise mint label values. Drop a model from the registry *before*
  :meth:`~WorkerMetrics.forget_model`, so a late request cannot bring its series back.
* Per-model series exist only for registry names (scheduler stats outlive an unload);
  worker-wide totals still count everything. Residency series cover models with weights.
* ``worker_meta_gate_in_use`` / ``worker_meta_gate_waiting`` show the meta gate (07);
  ``*_created`` series are dropped.
* The weight cache belongs to the dispatch thread: a scrape only reads its counters and
  per-model flags and skips a model removed meanwhile, so it never waits for an execution.
* ``worker_stage_cpu_seconds_total{model, stage}`` (beyond 12) splits the server's CPU per
  request by stage (:data:`CPU_STAGES`): decode and encode are counted as they happen
  (:meth:`WorkerMetrics.observe_codec_cpu`), queue and dispatch by the scheduler. The rest of
  the process's CPU (transport, handler glue, XLA's own threads) is
  ``process_cpu_seconds_total`` minus their sum.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping

import attrs
import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reactantserver.worker.registry import ModelEntry, ModelState
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.scheduler.stats import StatsSnapshot
from reactantserver.worker.server.state import Runtime, WorkerState

__all__ = [
    "CONTENT_TYPE",
    "CPU_STAGES",
    "DEFAULT_WORKER_LABEL",
    "LATENCY_BUCKETS",
    "WorkerMetrics",
    "gpu_selector",
    "process_device_memory",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""``Content-Type`` of :meth:`WorkerMetrics.render` (Prometheus text format 0.0.4)."""

LATENCY_BUCKETS = tuple(0.001 * 2**k for k in range(14))
"""Upper bounds of the latency histogram: ``0.001 * 2**k`` s, k = 0..13 (``+Inf`` implied)."""

DEFAULT_WORKER_LABEL = "worker"
"""The ``worker`` label of a worker without ``worker_name`` (standalone or embedded)."""

CPU_STAGES = ("decode", "queue", "dispatch", "encode")
"""The ``stage`` labels of ``worker_stage_cpu_seconds_total``, in request order: decoding the
wire message, admission and the wake-up on the caller's loop, the dispatch thread's turn
(selection, assembly, transfers, execution, slicing) shared by the requests it served, and
encoding the answer. Each is thread CPU time (``time.thread_time_ns``) where the work runs."""

_HELP = {
    "worker_dispatch_total": "Executions.",
    "worker_compute_seconds_total": "Measured compute seconds.",
    "worker_batch_dispatch_total": "Executions per compiled batch size.",
    "worker_queue_depth": "Queued requests.",
    "worker_queue_wait_seconds": "Queue wait quantiles over the last 1024 waits.",
    "worker_requests_served_total": "Requests served by an execution.",
    "worker_rows_served_total": "Executable rows served.",
    "worker_requests_cancelled_total": "Requests cancelled while queued.",
    "worker_stage_cpu_seconds_total": "Thread CPU seconds of requests by stage.",
    "worker_model_resident": "1 if the model's weights are on the device.",
    "worker_model_pinned": "1 if the model is PINNED_DEVICE.",
    "worker_model_weight_bytes": "Bytes of the model's weights.",
    "worker_model_max_batch_size": "Effective max batch (0: does not coalesce).",
    "worker_model_load_seconds": "Duration of the last load/compile.",
    "worker_model_load_failures_total": "Failed loads.",
    "worker_models_loaded": "Regular models ready to serve.",
    "worker_models_resident": "Models whose weights are on the device.",
    "worker_resident_weight_bytes": "Bytes of device-resident weights.",
    "worker_weight_cache_resident_bytes": "Bytes of on-demand weights on the device.",
    "worker_weight_cache_max_bytes": "On-demand weight budget.",
    "worker_weight_cache_pinned_bytes": "Bytes of PINNED_DEVICE weights (P).",
    "worker_weight_cache_max_scratch_bytes": "Largest execution scratch (S).",
    "worker_weight_pool_bytes": "Weight pool of the solved budget.",
    "worker_weight_loads_total": "Weight loads onto the device.",
    "worker_weight_evicts_total": "Weight evictions from the device.",
    "worker_weight_load_seconds_total": "Seconds spent loading weights.",
    "worker_weight_load_bytes_total": "Bytes of weights loaded.",
    "worker_weight_compactions_total": "Weight cache compactions.",
    "worker_device_memory_in_use_bytes": "Device allocator bytes in use.",
    "worker_device_memory_limit_bytes": "Device allocator limit.",
    "worker_device_memory_free_bytes": "Device allocator limit minus in use.",
    "worker_device_memory_peak_in_use_bytes": "Device allocator peak bytes in use.",
    "worker_device_memory_pool_bytes": "Device allocator pool (reserved) bytes.",
    "worker_device_memory_process_used_bytes": "Device memory used by this process (NVML).",
    "worker_device_memory_out_of_pool_bytes": "Process device memory beyond the allocator limit.",
    "worker_executable_cache_hits_total": "Executables loaded from the cache.",
    "worker_executable_cache_misses_total": "Executables compiled after a cache miss.",
    "worker_inflight_requests": "Inference requests in flight.",
    "worker_meta_gate_in_use": "Meta-gate permits held (gated metas running).",
    "worker_meta_gate_waiting": "Metas waiting for a meta-gate permit.",
    "worker_requests_shed_total": "Requests refused with RESOURCE_EXHAUSTED (cap, queue full).",
    "worker_max_concurrent_requests": "Configured in-flight cap (0: unlimited).",
    "worker_info": "Worker identity and configuration.",
}


def process_device_memory() -> int | None:
    """Device bytes this process uses according to NVML; ``None`` where unknown.

    The seam for ``worker_device_memory_process_used_bytes``. ``nvidia-ml-py`` is not a
    dependency of the worker, so this reports nothing (the series are then absent).
    """
    return None


def gpu_selector(visible_devices: str | None, device_ordinal: int) -> str | None:
    """The ``gpu`` label: the ``CUDA_VISIBLE_DEVICES`` selector this worker's device is.

    The single token, or the token at ``device_ordinal`` when several are listed; the ordinal
    itself when the variable is unset; ``None`` when it hides every device or is too short.
    """
    if visible_devices is None:
        return str(device_ordinal)
    tokens = [t.strip() for t in visible_devices.split(",") if t.strip()]
    if len(tokens) == 1:
        return tokens[0]
    return tokens[device_ordinal] if device_ordinal < len(tokens) else None


class _LabelledRegistry(CollectorRegistry):
    """A registry that adds constant labels to every sample (kept when already present)."""

    def __init__(self, labels: Callable[[], Mapping[str, str]]) -> None:
        super().__init__()
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        """Every registered family, relabelled, without ``*_created`` samples."""
        extra = self._labels()
        for family in super().collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            created = family.name + "_created"
            out.samples = [
                s._replace(labels={**extra, **s.labels})
                for s in family.samples
                if s.name != created
            ]
            yield out


class _Families:
    """Scrape-time families by name, in first-use order (labels in call order)."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def gauge(self, name: str, value: float, **labels: str) -> None:
        self._add(GaugeMetricFamily, name, value, labels)

    def counter(self, name: str, value: float, **labels: str) -> None:
        self._add(CounterMetricFamily, name, value, labels)

    def _add(
        self,
        kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
        name: str,
        value: float,
        labels: Mapping[str, str],
    ) -> None:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = kind(name, _HELP[name], labels=list(labels))
        assert isinstance(family, kind)
        family.add_metric(list(labels.values()), value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


@attrs.frozen
class _Residency:
    """One weight-cache model at scrape time."""

    resident: bool
    pinned: bool
    nbytes: int


class WorkerMetrics:
    """The worker's registry: request counters plus a scrape-time view of ``state``.

    ``environ`` supplies ``CUDA_VISIBLE_DEVICES`` (the ``gpu`` label); ``process_memory`` is
    the NVML seam (:func:`process_device_memory`).
    """

    def __init__(
        self,
        state: WorkerState,
        *,
        environ: Mapping[str, str] | None = None,
        process_memory: Callable[[], int | None] = process_device_memory,
    ) -> None:
        self._state = state
        env = os.environ if environ is None else environ
        self._gpu = gpu_selector(
            env.get("CUDA_VISIBLE_DEVICES"), state.config.runtime.device_ordinal
        )
        self._lock = threading.Lock()
        # (model, status) -> its counter and latency children: one dict hit per request.
        self._children: dict[tuple[str, grpc.StatusCode], tuple[Counter, Histogram]] = {}
        # model -> [decode ns, encode ns] (the other stages are the scheduler's counters).
        self._codec_ns: dict[str, list[int]] = {}
        self.registry: CollectorRegistry = _LabelledRegistry(self._constant_labels)
        self._requests = Counter(
            "worker_requests_total",
            "Inference requests by final status.",
            ["model", "status"],
            registry=self.registry,
        )
        self._latency = Histogram(
            "worker_request_latency_seconds",
            "Inference handler wall time.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_StateCollector(state, process_memory, self.codec_cpu))
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        state.observe_request = self.observe_request
        state.observe_codec_cpu = self.observe_codec_cpu
        state.forget_model = self.forget_model

    def _constant_labels(self) -> dict[str, str]:
        labels = {"worker": _worker_label(self._state)}
        if _platform(self._state) == "cuda" and self._gpu is not None:
            labels["gpu"] = self._gpu
        return labels

    def observe_request(self, model: str, status: grpc.StatusCode, seconds: float) -> None:
        """Count one finished inference request (a :data:`RequestObserver`)."""
        key = (model, status)
        with self._lock:
            children = self._children.get(key)
            if children is None:
                if self._state.registry.get(model) is None:
                    return
                children = (
                    self._requests.labels(model, status.name),
                    self._latency.labels(model),
                )
                self._children[key] = children
            counter, histogram = children
            counter.inc()
            histogram.observe(seconds)

    def observe_codec_cpu(self, model: str, decode_ns: int, encode_ns: int) -> None:
        """Add one request's decode and encode CPU (a :data:`CodecObserver`)."""
        with self._lock:
            codec = self._codec_ns.get(model)
            if codec is None:
                if self._state.registry.get(model) is None:
                    return
                codec = self._codec_ns[model] = [0, 0]
            codec[0] += decode_ns
            codec[1] += encode_ns

    def codec_cpu(self) -> dict[str, tuple[int, int]]:
        """Model -> (decode ns, encode ns) so far."""
        with self._lock:
            return {name: (d, e) for name, (d, e) in self._codec_ns.items()}

    def forget_model(self, name: str) -> None:
        """Drop the request series of ``name`` (after it left the registry)."""
        with self._lock:
            self._codec_ns.pop(name, None)
            keys = [key for key in self._children if key[0] == name]
            if not keys:
                return
            for key in keys:
                del self._children[key]
                self._requests.remove(name, key[1].name)
            self._latency.remove(name)

    def render(self) -> bytes:
        """The exposition in Prometheus text format 0.0.4 (serve it with :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


def _worker_label(state: WorkerState) -> str:
    return state.config.worker_name or DEFAULT_WORKER_LABEL


def _platform(state: WorkerState) -> str:
    """``cpu`` or ``cuda``: the backend's once it is up, else the configured one."""
    runtime = state.runtime
    return runtime.platform if runtime is not None else state.config.runtime.backend.value


class _StateCollector(Collector):
    """Every family read from the state at scrape time (all but the request metrics)."""

    def __init__(
        self,
        state: WorkerState,
        process_memory: Callable[[], int | None],
        codec_cpu: Callable[[], Mapping[str, tuple[int, int]]],
    ) -> None:
        self._state = state
        self._process_memory = process_memory
        self._codec_cpu = codec_cpu

    def collect(self) -> Iterator[Metric]:
        """The families, read now."""
        out = _Families()
        state = self._state
        runtime = state.runtime
        stats = runtime.scheduler.all_stats() if runtime is not None else {}
        entries = self._entries(runtime, stats)
        self._info(out)
        limiter = state.limiter
        out.gauge("worker_inflight_requests", limiter.in_flight)
        shed = limiter.shed + sum(s.shed for s in stats.values())
        out.counter("worker_requests_shed_total", shed)
        out.gauge("worker_max_concurrent_requests", limiter.limit)
        loaded = sum(
            e.state is ModelState.READY and not (e.manifest is not None and e.manifest.is_meta)
            for e in entries.values()
        )
        out.gauge("worker_models_loaded", loaded)
        for name, entry in entries.items():
            if entry.scheduled is not None:
                out.gauge("worker_model_max_batch_size", entry.scheduled.max_batch, model=name)
        for name, record in dict(state.loads).items():
            out.gauge("worker_model_load_seconds", record.seconds, model=name)
            out.counter("worker_model_load_failures_total", record.failures, model=name)
        if runtime is not None:
            _scheduler(out, stats, entries)
            _stages(out, stats, self._codec_cpu(), entries)
            _weights(out, runtime, entries)
            self._device(out, runtime)
            counters = runtime.executables.counters
            out.counter("worker_executable_cache_hits_total", counters.hits)
            out.counter("worker_executable_cache_misses_total", counters.misses)
            if runtime.metas is not None:
                gate = runtime.metas.gate
                out.gauge("worker_meta_gate_in_use", gate.in_use)
                out.gauge("worker_meta_gate_waiting", gate.waiting)
        return iter(out)

    def _entries(
        self, runtime: Runtime | None, stats: Mapping[str, StatsSnapshot]
    ) -> dict[str, ModelEntry]:
        """Every registry entry, hidden sub-models included (they run on this device too)."""
        registry = self._state.registry
        entries = {e.name: e for e in registry.visible()}
        if runtime is not None:
            for name in [*stats, *runtime.weights]:
                if name not in entries and (entry := registry.get(name)) is not None:
                    entries[name] = entry
        return entries

    def _info(self, out: _Families) -> None:
        state = self._state
        config = state.config
        out.gauge(
            "worker_info",
            1,
            worker=_worker_label(state),
            device_ordinal=str(config.runtime.device_ordinal),
            backend=_platform(state),
            control_mode=config.model_control_mode.value,
            discipline=config.scheduler.discipline.value,
            residency_mode="externally_managed" if state.explicit else "self_managed",
            version=state.version,
        )

    def _device(self, out: _Families, runtime: Runtime) -> None:
        stats = runtime.backend.memory_stats()
        if stats is not None:
            out.gauge("worker_device_memory_in_use_bytes", stats.bytes_in_use)
            out.gauge("worker_device_memory_limit_bytes", stats.bytes_limit)
            out.gauge("worker_device_memory_free_bytes", stats.bytes_free)
            out.gauge("worker_device_memory_peak_in_use_bytes", stats.peak_bytes_in_use)
            out.gauge("worker_device_memory_pool_bytes", stats.bytes_reserved)
        used = self._process_memory()
        if used is not None:
            out.gauge("worker_device_memory_process_used_bytes", used)
            if stats is not None:
                beyond = max(0, used - stats.bytes_limit)
                out.gauge("worker_device_memory_out_of_pool_bytes", beyond)


def _scheduler(
    out: _Families, stats: Mapping[str, StatsSnapshot], entries: Mapping[str, ModelEntry]
) -> None:
    for name, s in stats.items():
        if name not in entries:
            continue
        out.counter("worker_dispatch_total", s.dispatch_count, model=name)
        out.counter("worker_compute_seconds_total", s.compute_seconds, model=name)
        for size, batch in sorted(s.batches.items()):
            out.counter(
                "worker_batch_dispatch_total", batch.count, model=name, batch_size=str(size)
            )
        out.gauge("worker_queue_depth", s.queue_depth, model=name)
        out.gauge("worker_queue_wait_seconds", s.queue_wait_p50, model=name, quantile="0.5")
        out.gauge("worker_queue_wait_seconds", s.queue_wait_p99, model=name, quantile="0.99")
        out.counter("worker_requests_served_total", s.requests_served, model=name)
        out.counter("worker_rows_served_total", s.rows_served, model=name)
        out.counter("worker_requests_cancelled_total", s.cancelled, model=name)


def _stages(
    out: _Families,
    stats: Mapping[str, StatsSnapshot],
    codec: Mapping[str, tuple[int, int]],
    entries: Mapping[str, ModelEntry],
) -> None:
    for name in entries:
        s, c = stats.get(name), codec.get(name)
        if s is None and c is None:
            continue
        decode, encode = c or (0, 0)
        queue, dispatch = (0, 0) if s is None else (s.queue_cpu_ns, s.dispatch_cpu_ns)
        for stage, ns in zip(CPU_STAGES, (decode, queue, dispatch, encode), strict=True):
            out.counter("worker_stage_cpu_seconds_total", ns * 1e-9, model=name, stage=stage)


def _weights(out: _Families, runtime: Runtime, entries: Mapping[str, ModelEntry]) -> None:
    cache = runtime.weights
    models: dict[str, _Residency] = {}
    for name in cache:
        try:
            pinned = cache.residency(name) is Residency.PINNED_DEVICE
            models[name] = _Residency(cache.is_resident(name), pinned, cache.nbytes(name))
        except KeyError:  # removed by the dispatch thread mid-scrape
            continue
    for name, m in models.items():
        if name in entries:
            out.gauge("worker_model_resident", int(m.resident), model=name)
            out.gauge("worker_model_pinned", int(m.pinned), model=name)
            out.gauge("worker_model_weight_bytes", m.nbytes, model=name)
    resident = [m for m in models.values() if m.resident]
    out.gauge("worker_models_resident", len(resident))
    out.gauge("worker_resident_weight_bytes", sum(m.nbytes for m in resident))
    if cache.enabled:
        out.gauge(
            "worker_weight_cache_resident_bytes", sum(m.nbytes for m in resident if not m.pinned)
        )
        out.gauge("worker_weight_cache_max_bytes", cache.budget)
        out.gauge(
            "worker_weight_cache_pinned_bytes", sum(m.nbytes for m in models.values() if m.pinned)
        )
        solved = cache.budget_solution
        if solved is not None:
            out.gauge("worker_weight_cache_max_scratch_bytes", solved.max_scratch)
            out.gauge("worker_weight_pool_bytes", solved.weight_pool)
    out.counter("worker_weight_loads_total", cache.loads)
    out.counter("worker_weight_evicts_total", cache.evictions)
    out.counter("worker_weight_load_seconds_total", cache.load_seconds)
    out.counter("worker_weight_load_bytes_total", cache.load_bytes)
    out.counter("worker_weight_compactions_total", cache.compactions)
