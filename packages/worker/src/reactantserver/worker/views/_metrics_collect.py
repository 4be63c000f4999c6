"""The scrape-time half of the worker's metrics: every family read from the :class:`WorkerState`.

:class:`StateCollector`, registered by ``metrics.WorkerMetrics``, builds on each scrape every
worker family of docs/reference/metrics.md except the request counters: scheduler statistics,
per-stage CPU,
weight-cache residency, device memory, the executable cache, the meta gate, the in-flight
limiter and ``reactantserver_worker_info``. It only reads; the weight cache stays the dispatch
thread's, so a
model removed mid-scrape is skipped rather than waited for. The help texts, :data:`CPU_STAGES`
and the default ``worker`` label live here with it; ``metrics`` re-exports the public ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import attrs
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from reactantserver.worker.registry import ModelEntry, ModelState
from reactantserver.worker.request_counters import cumulative_buckets
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.scheduler.stats import Durations, StatsSnapshot
from reactantserver.worker.state import Runtime, WorkerState

__all__ = [
    "CPU_STAGES",
    "DEFAULT_WORKER_LABEL",
    "StateCollector",
    "backend_platform",
    "worker_label",
]

DEFAULT_WORKER_LABEL = "worker"
"""The ``worker`` label of a worker without ``worker_name`` (standalone or embedded)."""

CPU_STAGES = ("decode", "queue", "dispatch", "encode")
"""The ``stage`` labels of ``reactantserver_worker_stage_cpu_seconds_total``, in request order:
decoding the
wire message, admission and the wake-up on the caller's loop, the dispatch thread's turn
(selection, assembly, transfers, execution, slicing) shared by the requests it served, and
encoding the answer. Each is thread CPU time (``time.thread_time_ns``) where the work runs;
decode, encode and admission are timed on one request in ``SAMPLE_EVERY`` and count for the
requests it stands for (the clock is a system call), dispatch and waking on every execution."""

_HELP = {
    "reactantserver_worker_dispatch_total": "Executions.",
    "reactantserver_worker_compute_seconds_total": "Measured compute seconds.",
    "reactantserver_worker_batch_dispatch_total": "Executions per compiled batch size.",
    "reactantserver_worker_queue_depth": "Queued requests.",
    "reactantserver_worker_queue_wait_seconds": "Time requests waited in the model's queue.",
    "reactantserver_worker_compute_input_seconds": (
        "Per execution: copying the batch's inputs to the device."
    ),
    "reactantserver_worker_compute_infer_seconds": (
        "Per execution: running the compiled executable."
    ),
    "reactantserver_worker_compute_output_seconds": (
        "Per execution: copying the outputs back to the host."
    ),
    "reactantserver_worker_requests_served_total": "Requests served by an execution.",
    "reactantserver_worker_rows_served_total": "Executable rows served.",
    "reactantserver_worker_requests_cancelled_total": "Requests cancelled while queued.",
    "reactantserver_worker_stage_cpu_seconds_total": "Thread CPU seconds of requests by stage.",
    "reactantserver_worker_model_resident": "1 if the model's weights are on the device.",
    "reactantserver_worker_model_pinned": "1 if the model is PINNED_DEVICE.",
    "reactantserver_worker_model_weight_bytes": "Bytes of the model's weights.",
    "reactantserver_worker_model_max_batch_size": "Effective max batch (0: does not coalesce).",
    "reactantserver_worker_model_load_seconds": "Duration of the last load/compile.",
    "reactantserver_worker_model_load_failures_total": "Failed loads.",
    "reactantserver_worker_models_loaded": "Regular models ready to serve.",
    "reactantserver_worker_models_resident": "Models whose weights are on the device.",
    "reactantserver_worker_resident_weight_bytes": "Bytes of device-resident weights.",
    "reactantserver_worker_weight_cache_resident_bytes": (
        "Bytes of on-demand weights on the device."
    ),
    "reactantserver_worker_weight_cache_max_bytes": "On-demand weight budget.",
    "reactantserver_worker_weight_cache_pinned_bytes": "Bytes of PINNED_DEVICE weights (P).",
    "reactantserver_worker_weight_cache_max_scratch_bytes": "Largest execution scratch (S).",
    "reactantserver_worker_weight_pool_bytes": "Weight pool of the solved budget.",
    "reactantserver_worker_weight_loads_total": "Weight loads onto the device.",
    "reactantserver_worker_weight_evicts_total": "Weight evictions from the device.",
    "reactantserver_worker_weight_load_seconds_total": "Seconds spent loading weights.",
    "reactantserver_worker_weight_load_bytes_total": "Bytes of weights loaded.",
    "reactantserver_worker_weight_compactions_total": "Weight cache compactions.",
    "reactantserver_worker_weight_prefetches_total": (
        "Weight loads started while another model executed."
    ),
    "reactantserver_worker_device_memory_in_use_bytes": "Device allocator bytes in use.",
    "reactantserver_worker_device_memory_limit_bytes": "Device allocator limit.",
    "reactantserver_worker_device_memory_free_bytes": "Device allocator limit minus in use.",
    "reactantserver_worker_device_memory_peak_in_use_bytes": "Device allocator peak bytes in use.",
    "reactantserver_worker_device_memory_pool_bytes": "Device allocator pool (reserved) bytes.",
    "reactantserver_worker_device_memory_process_used_bytes": (
        "Device memory used by this process (NVML)."
    ),
    "reactantserver_worker_device_memory_out_of_pool_bytes": (
        "Process device memory beyond the allocator limit."
    ),
    "reactantserver_worker_executable_cache_hits_total": "Executables loaded from the cache.",
    "reactantserver_worker_executable_cache_misses_total": (
        "Executables compiled after a cache miss."
    ),
    "reactantserver_worker_inflight_requests": "Inference requests in flight.",
    "reactantserver_worker_meta_gate_in_use": "Meta-gate permits held (gated metas running).",
    "reactantserver_worker_meta_gate_waiting": "Metas waiting for a meta-gate permit.",
    "reactantserver_worker_requests_shed_total": (
        "Requests refused with RESOURCE_EXHAUSTED (cap, queue full)."
    ),
    "reactantserver_worker_max_concurrent_requests": "Configured in-flight cap (0: unlimited).",
    "reactantserver_worker_info": "Worker identity and configuration.",
}


class _Families:
    """Scrape-time families by name, in first-use order (labels in call order)."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def gauge(self, name: str, value: float, **labels: str) -> None:
        self._add(GaugeMetricFamily, name, value, labels)

    def counter(self, name: str, value: float, **labels: str) -> None:
        self._add(CounterMetricFamily, name, value, labels)

    def histogram(self, name: str, durations: Durations, **labels: str) -> None:
        family = self._families.get(name)
        if family is None:
            family = HistogramMetricFamily(name, _HELP[name], labels=list(labels))
            self._families[name] = family
        assert isinstance(family, HistogramMetricFamily)
        family.add_metric(
            list(labels.values()), cumulative_buckets(durations.counts), durations.total
        )

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


def worker_label(state: WorkerState) -> str:
    """The ``worker`` label: ``config.worker_name``, else :data:`DEFAULT_WORKER_LABEL`."""
    return state.config.worker_name or DEFAULT_WORKER_LABEL


def backend_platform(state: WorkerState) -> str:
    """``cpu`` or ``cuda``: the backend's once it is up, else the configured one."""
    runtime = state.runtime
    return runtime.platform if runtime is not None else state.config.runtime.backend.value


class StateCollector(Collector):
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
        out.gauge("reactantserver_worker_inflight_requests", limiter.in_flight)
        shed = limiter.shed + sum(s.shed for s in stats.values())
        out.counter("reactantserver_worker_requests_shed_total", shed)
        out.gauge("reactantserver_worker_max_concurrent_requests", limiter.limit)
        loaded = sum(
            e.state is ModelState.READY and not (e.manifest is not None and e.manifest.is_meta)
            for e in entries.values()
        )
        out.gauge("reactantserver_worker_models_loaded", loaded)
        for name, entry in entries.items():
            if entry.scheduled is not None:
                out.gauge(
                    "reactantserver_worker_model_max_batch_size",
                    entry.scheduled.max_batch,
                    model=name,
                )
        for name, record in dict(state.loads).items():
            out.gauge("reactantserver_worker_model_load_seconds", record.seconds, model=name)
            out.counter(
                "reactantserver_worker_model_load_failures_total", record.failures, model=name
            )
        if runtime is not None:
            _scheduler(out, stats, entries)
            _stages(out, stats, self._codec_cpu(), entries)
            _weights(out, runtime, entries)
            self._device(out, runtime)
            counters = runtime.executables.counters
            out.counter("reactantserver_worker_executable_cache_hits_total", counters.hits)
            out.counter("reactantserver_worker_executable_cache_misses_total", counters.misses)
            if runtime.metas is not None:
                gate = runtime.metas.gate
                out.gauge("reactantserver_worker_meta_gate_in_use", gate.in_use)
                out.gauge("reactantserver_worker_meta_gate_waiting", gate.waiting)
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
            "reactantserver_worker_info",
            1,
            worker=worker_label(state),
            device_ordinal=str(config.runtime.device_ordinal),
            backend=backend_platform(state),
            control_mode=config.model_control_mode.value,
            discipline=config.scheduler.discipline.value,
            residency_mode="externally_managed" if state.explicit else "self_managed",
            version=state.version,
        )

    def _device(self, out: _Families, runtime: Runtime) -> None:
        stats = runtime.backend.memory_stats()
        if stats is not None:
            out.gauge("reactantserver_worker_device_memory_in_use_bytes", stats.bytes_in_use)
            out.gauge("reactantserver_worker_device_memory_limit_bytes", stats.bytes_limit)
            out.gauge("reactantserver_worker_device_memory_free_bytes", stats.bytes_free)
            out.gauge(
                "reactantserver_worker_device_memory_peak_in_use_bytes", stats.peak_bytes_in_use
            )
            out.gauge("reactantserver_worker_device_memory_pool_bytes", stats.bytes_reserved)
        used = self._process_memory()
        if used is not None:
            out.gauge("reactantserver_worker_device_memory_process_used_bytes", used)
            if stats is not None:
                beyond = max(0, used - stats.bytes_limit)
                out.gauge("reactantserver_worker_device_memory_out_of_pool_bytes", beyond)


def _scheduler(
    out: _Families, stats: Mapping[str, StatsSnapshot], entries: Mapping[str, ModelEntry]
) -> None:
    for name, s in stats.items():
        if name not in entries:
            continue
        out.counter("reactantserver_worker_dispatch_total", s.dispatch_count, model=name)
        out.counter("reactantserver_worker_compute_seconds_total", s.compute_seconds, model=name)
        for size, batch in sorted(s.batches.items()):
            out.counter(
                "reactantserver_worker_batch_dispatch_total",
                batch.count,
                model=name,
                batch_size=str(size),
            )
        out.gauge("reactantserver_worker_queue_depth", s.queue_depth, model=name)
        out.histogram("reactantserver_worker_queue_wait_seconds", s.queue_waits, model=name)
        out.histogram("reactantserver_worker_compute_input_seconds", s.compute_input, model=name)
        out.histogram("reactantserver_worker_compute_infer_seconds", s.compute_infer, model=name)
        out.histogram("reactantserver_worker_compute_output_seconds", s.compute_output, model=name)
        out.counter("reactantserver_worker_requests_served_total", s.requests_served, model=name)
        out.counter("reactantserver_worker_rows_served_total", s.rows_served, model=name)
        out.counter("reactantserver_worker_requests_cancelled_total", s.cancelled, model=name)


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
            out.counter(
                "reactantserver_worker_stage_cpu_seconds_total", ns * 1e-9, model=name, stage=stage
            )


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
            out.gauge("reactantserver_worker_model_resident", int(m.resident), model=name)
            out.gauge("reactantserver_worker_model_pinned", int(m.pinned), model=name)
            out.gauge("reactantserver_worker_model_weight_bytes", m.nbytes, model=name)
    resident = [m for m in models.values() if m.resident]
    out.gauge("reactantserver_worker_models_resident", len(resident))
    out.gauge("reactantserver_worker_resident_weight_bytes", sum(m.nbytes for m in resident))
    if cache.enabled:
        out.gauge(
            "reactantserver_worker_weight_cache_resident_bytes",
            sum(m.nbytes for m in resident if not m.pinned),
        )
        out.gauge("reactantserver_worker_weight_cache_max_bytes", cache.budget)
        out.gauge(
            "reactantserver_worker_weight_cache_pinned_bytes",
            sum(m.nbytes for m in models.values() if m.pinned),
        )
        solved = cache.budget_solution
        if solved is not None:
            out.gauge("reactantserver_worker_weight_cache_max_scratch_bytes", solved.max_scratch)
            out.gauge("reactantserver_worker_weight_pool_bytes", solved.weight_pool)
    out.counter("reactantserver_worker_weight_loads_total", cache.loads)
    out.counter("reactantserver_worker_weight_evicts_total", cache.evictions)
    out.counter("reactantserver_worker_weight_load_seconds_total", cache.load_seconds)
    out.counter("reactantserver_worker_weight_load_bytes_total", cache.load_bytes)
    out.counter("reactantserver_worker_weight_compactions_total", cache.compactions)
    out.counter("reactantserver_worker_weight_prefetches_total", cache.prefetches)
