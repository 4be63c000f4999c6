"""The worker's ``/status`` document: what the operator page shows (issue 16).

Built on request from the same sources ``/metrics`` reads at scrape time: the registry, the
scheduler's statistics snapshots, the data plane's request outcomes and the weight cache's
per-model flags::

    add_status_routes(app, state)      # GET / (the page) and GET /status (this document)
    doc = worker_status(state, uptime_seconds=12.5)

Decisions made here:

* Models are the visible registry entries plus the hidden sub-models of metas (they run on this
  device too), sorted by name.
* ``residency``: ``pinned`` for ``PINNED_DEVICE``, ``device`` when the weights are on the
  device now, ``host`` otherwise, also for models without device weights (loading, failed,
  metas); a weightless regular model that is ready counts as ``device``.
* ``device_time_share`` is the model's decaying compute EMA over the sum of every model's
  (the fair discipline's ``nema``); ``None`` while nothing ran recently.
* Queue-wait percentiles are ``None`` before the model's first dispatch.
* Like a scrape, the weight cache is only read (it belongs to the dispatch thread): a model
  removed meanwhile is skipped rather than waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import attrs
from aiohttp import web

from reactantserver.core.status import (
    PAGE_CONTENT_TYPE,
    PAGE_PATH,
    STATUS_PATH,
    DeviceStatus,
    ModelStatus,
    ResidencyName,
    WorkerStatus,
    page,
)
from reactantserver.worker.dataplane import RequestStats
from reactantserver.worker.registry import ModelEntry, ModelState
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.runtime.weight_cache import WeightCache
from reactantserver.worker.scheduler.stats import StatsSnapshot
from reactantserver.worker.state import Runtime, WorkerState
from reactantserver.worker.views.metrics import DEFAULT_WORKER_LABEL
from reactantserver.worker.views.model_info import MODEL_VERSION

__all__ = ["add_status_routes", "worker_status"]


@attrs.frozen
class _Weights:
    """One model in the weight cache, read once."""

    residency: Residency
    resident: bool
    nbytes: int
    loads: int
    evictions: int


def add_status_routes(
    app: web.Application, state: WorkerState, *, clock: Callable[[], float] = time.monotonic
) -> None:
    """Serve the page on ``GET /`` and the document on ``GET /status``; uptime counts from now."""
    started = clock()

    async def get_page(request: web.Request) -> web.Response:
        return web.Response(
            body=page(), headers={"Content-Type": PAGE_CONTENT_TYPE, "Cache-Control": "no-cache"}
        )

    async def get_status(request: web.Request) -> web.Response:
        doc = worker_status(state, uptime_seconds=clock() - started)
        return web.json_response(doc, headers={"Cache-Control": "no-store"})

    app.router.add_get(PAGE_PATH, get_page)
    app.router.add_get(STATUS_PATH, get_status)


def worker_status(state: WorkerState, *, uptime_seconds: float) -> WorkerStatus:
    """The worker's status document now (``uptime_seconds``: since its listeners opened)."""
    config = state.config
    runtime = state.runtime
    stats = runtime.scheduler.all_stats() if runtime is not None else {}
    weights = _read_weights(runtime.weights) if runtime is not None else {}
    total_load = sum(s.recent_load for s in stats.values())
    models = [
        _model(
            state,
            runtime,
            entry,
            stats=stats.get(entry.name),
            weights=weights.get(entry.name),
            total_load=total_load,
        )
        for entry in _entries(state, [*stats, *weights])
    ]
    return {
        "kind": "worker",
        "name": config.worker_name or DEFAULT_WORKER_LABEL,
        "version": state.version,
        "ready": state.ready(),
        "uptime_seconds": uptime_seconds,
        "platform": runtime.platform if runtime is not None else config.runtime.backend.value,
        "discipline": config.scheduler.discipline.value,
        "model_control_mode": config.model_control_mode.value,
        "device": _device(runtime, weights),
        "models": models,
    }


def _entries(state: WorkerState, names: list[str]) -> list[ModelEntry]:
    registry = state.registry
    entries = {e.name: e for e in registry.visible()}
    for name in names:
        if name not in entries and (entry := registry.get(name)) is not None:
            entries[name] = entry
    return [entries[name] for name in sorted(entries)]


def _read_weights(cache: WeightCache) -> dict[str, _Weights]:
    out: dict[str, _Weights] = {}
    for name in cache:
        try:
            out[name] = _Weights(
                cache.residency(name),
                cache.is_resident(name),
                cache.nbytes(name),
                cache.model_loads(name),
                cache.model_evictions(name),
            )
        except KeyError:  # removed by the dispatch thread meanwhile
            continue
    return out


def _device(runtime: Runtime | None, weights: Mapping[str, _Weights]) -> DeviceStatus:
    resident = sum(w.nbytes for w in weights.values() if w.resident)
    pinned = sum(w.nbytes for w in weights.values() if w.residency is Residency.PINNED_DEVICE)
    budget = runtime.weights.budget if runtime is not None and runtime.weights.enabled else None
    return {
        "weight_bytes_resident": resident,
        "weight_budget_bytes": budget,
        "pinned_bytes": pinned,
    }


def _model(
    state: WorkerState,
    runtime: Runtime | None,
    entry: ModelEntry,
    *,
    stats: StatsSnapshot | None,
    weights: _Weights | None,
    total_load: float,
) -> ModelStatus:
    name = entry.name
    requests = runtime.dataplane.request_stats(name) if runtime is not None else RequestStats()
    snapshot = stats or StatsSnapshot()
    waited = snapshot.queue_wait_count > 0
    return {
        "name": name,
        "version": MODEL_VERSION,
        "state": entry.state.value,
        "residency": _residency(entry, weights),
        "weight_bytes": weights.nbytes if weights is not None else _nbytes(entry),
        "queue_depth": snapshot.queue_depth,
        "requests": requests.success_count + requests.fail_count,
        "failures": requests.fail_count,
        "executions": snapshot.dispatch_count,
        "device_time_share": snapshot.recent_load / total_load if total_load > 0 else None,
        "weight": _weight(state, runtime, name),
        "queue_wait_p50_seconds": snapshot.queue_wait_p50 if waited else None,
        "queue_wait_p99_seconds": snapshot.queue_wait_p99 if waited else None,
        "batch_sizes": {str(size): n for size, n in sorted(snapshot.batch_histogram.items())},
        "loads": weights.loads if weights is not None else 0,
        "evictions": weights.evictions if weights is not None else 0,
    }


def _residency(entry: ModelEntry, weights: _Weights | None) -> ResidencyName:
    if weights is None:
        ready = entry.state is ModelState.READY and entry.scheduled is not None
        return "device" if ready else "host"
    if weights.residency is Residency.PINNED_DEVICE:
        return "pinned"
    return "device" if weights.resident else "host"


def _nbytes(entry: ModelEntry) -> int:
    return entry.loaded.weight_nbytes if entry.loaded is not None else 0


def _weight(state: WorkerState, runtime: Runtime | None, name: str) -> float:
    """The live fair weight (``SetModelWeight`` changes it), else the configured one."""
    scheduled = runtime.scheduler.model(name) if runtime is not None else None
    if scheduled is not None:
        return scheduled.weight
    return state.config.scheduler.for_model(name).weight
