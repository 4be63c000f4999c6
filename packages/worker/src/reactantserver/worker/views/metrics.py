"""The worker's Prometheus metrics: every family of docs/reference/metrics.md, rendered for
``/metrics``.

Request outcomes are counted as they happen, in ``state.requests`` (the transports call its
``observe``); everything, those counters included, is read from the :class:`WorkerState` at
scrape time. Every sample carries ``worker="<name>"`` (``config.worker_name``, else
``"worker"``) and, on CUDA, ``gpu="<selector>"``::

    metrics = WorkerMetrics(state)
    body = metrics.render()             # served with CONTENT_TYPE
    metrics.forget_model("resnet")      # after the registry dropped an unloaded model

Decisions made here:

* Requests for names the registry does not hold (``NOT_FOUND``) create no series: clients
  could otherwise mint label values. Drop a model from the registry *before*
  :meth:`~WorkerMetrics.forget_model`, so a late request cannot bring its series back.
* Per-model series exist only for registry names (scheduler stats outlive an unload);
  worker-wide totals still count everything. Residency series cover models with weights.
* ``reactantserver_worker_meta_gate_in_use`` / ``reactantserver_worker_meta_gate_waiting`` show the
  meta gate;
  ``*_created`` series are dropped.
* The weight cache belongs to the dispatch thread: a scrape only reads its counters and
  per-model flags and skips a model removed meanwhile, so it never waits for an execution.
* ``reactantserver_worker_stage_cpu_seconds_total{model, stage}`` splits the server's
  CPU per
  request by stage (:data:`CPU_STAGES`): decode and encode are counted as requests finish
  (``WorkerMetrics.observe_request``), queue and dispatch by the scheduler. The rest of
  the process's CPU (transport, handler glue, XLA's own threads) is
  ``process_cpu_seconds_total`` minus their sum.
* On CUDA, the ``reactantserver_worker_gpu_*`` families and
  ``reactantserver_worker_device_memory_process_used_bytes`` come from NVML through
  :class:`~reactantserver.worker.views._nvml.GpuSampler`, which reads the device on its own
  thread: a scrape never waits for the driver. Without NVML, a driver or the device they are
  absent. Call :meth:`WorkerMetrics.close` to stop that thread (it is a daemon otherwise).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reactantserver.core.config import Backend
from reactantserver.worker.request_counters import LATENCY_BUCKETS
from reactantserver.worker.state import RequestObserver, WorkerState
from reactantserver.worker.views._metrics_collect import (
    CPU_STAGES,
    DEFAULT_WORKER_LABEL,
    StateCollector,
    backend_platform,
    worker_label,
)
from reactantserver.worker.views._nvml import GpuSample, GpuSampler, NvmlLoader, load_pynvml

__all__ = [
    "CONTENT_TYPE",
    "CPU_STAGES",
    "DEFAULT_WORKER_LABEL",
    "GPU_FAMILIES",
    "LATENCY_BUCKETS",
    "WorkerMetrics",
    "gpu_selector",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""``Content-Type`` of :meth:`WorkerMetrics.render` (Prometheus text format 0.0.4)."""


GPU_FAMILIES = {
    "reactantserver_worker_gpu_utilization": "GPU utilization, 0..1 (NVML).",
    "reactantserver_worker_gpu_memory_used_bytes": "Device memory used, all processes (NVML).",
    "reactantserver_worker_gpu_memory_total_bytes": "Device memory in total (NVML).",
    "reactantserver_worker_gpu_power_usage_watts": "Power draw (NVML).",
    "reactantserver_worker_gpu_power_limit_watts": "Enforced power limit (NVML).",
    "reactantserver_worker_gpu_energy_joules_total": (
        "Energy used since the driver was loaded (NVML)."
    ),
}
"""The NVML families of a CUDA worker, name -> help; each sample is labelled ``gpu_uuid``."""


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


class _GpuCollector(Collector):
    """The ``reactantserver_worker_gpu_*`` families from the sampler's newest reading."""

    def __init__(self, latest: Callable[[], GpuSample | None]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[Metric]:
        """One family per quantity the newest fresh sample holds."""
        sample = self._latest()
        if sample is None:
            return
        labels = {} if sample.uuid is None else {"gpu_uuid": sample.uuid}
        values = (
            sample.utilization,
            sample.memory_used_bytes,
            sample.memory_total_bytes,
            sample.power_watts,
            sample.power_limit_watts,
            sample.energy_joules,
        )
        for (name, help_text), value in zip(GPU_FAMILIES.items(), values, strict=True):
            if value is None:
                continue
            kind = CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily
            family = kind(name, help_text, labels=list(labels))
            family.add_metric(list(labels.values()), value)
            yield family


class WorkerMetrics:
    """The worker's registry: request counters plus a scrape-time view of ``state``.

    ``environ`` supplies ``CUDA_VISIBLE_DEVICES`` (the ``gpu`` label); ``nvml`` loads the NVML
    module (the seam of :mod:`~reactantserver.worker.views._nvml`), asked only by a worker
    configured for CUDA whose device has a selector. :attr:`gpu` is that worker's sampler,
    started here.
    """

    def __init__(
        self,
        state: WorkerState,
        *,
        environ: Mapping[str, str] | None = None,
        nvml: NvmlLoader = load_pynvml,
    ) -> None:
        self._state = state
        env = os.environ if environ is None else environ
        self._selector = gpu_selector(
            env.get("CUDA_VISIBLE_DEVICES"), state.config.runtime.device_ordinal
        )
        #: The NVML sampler of the worker's device; ``None`` on CPU or without a selector.
        self.gpu: GpuSampler | None = None
        if state.config.runtime.backend is Backend.CUDA and self._selector is not None:
            self.gpu = GpuSampler(self._selector, nvml)
            self.gpu.start()
        self._counters = state.requests
        #: Counts one finished inference request (a :data:`RequestObserver`): its status, its
        #: handler seconds and its decode and encode CPU.
        self.observe_request: RequestObserver = self._counters.observe
        self.registry: CollectorRegistry = _LabelledRegistry(self._constant_labels)
        self.registry.register(self._counters)
        self.registry.register(StateCollector(state, self._process_memory, self.codec_cpu))
        self.registry.register(_GpuCollector(self._gpu_sample))
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)

    def _gpu_sample(self) -> GpuSample | None:
        return None if self.gpu is None else self.gpu.latest()

    def _process_memory(self) -> int | None:
        sample = self._gpu_sample()
        return None if sample is None else sample.process_used_bytes

    def _constant_labels(self) -> dict[str, str]:
        labels = {"worker": worker_label(self._state)}
        if backend_platform(self._state) == "cuda" and self._selector is not None:
            labels["gpu"] = self._selector
        return labels

    def codec_cpu(self) -> dict[str, tuple[int, int]]:
        """Model -> (decode ns, encode ns) so far."""
        return self._counters.codec_cpu()

    def forget_model(self, name: str) -> None:
        """Drop the request series of ``name`` (after it left the registry)."""
        self._counters.forget(name)

    def render(self) -> bytes:
        """The exposition in Prometheus text format 0.0.4 (serve it with :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def close(self) -> None:
        """Stop the NVML sampler, if there is one (the registry still renders)."""
        if self.gpu is not None:
            self.gpu.close()
