"""The worker's live state: what every gRPC service, the HTTP app and ``/metrics`` read.

One :class:`WorkerState` exists per process. The event loop creates it before the listeners
open (so health and metadata answer during start-up); the loader thread fills
:attr:`WorkerState.runtime` once the backend exists and flips :attr:`WorkerState.started`
when every start-up model has compiled and warmed (or failed)::

    state = WorkerState(config, version="0.1.0")
    state.ready()                # False until started, True until shutdown begins
    state.runtime.scheduler      # after the backend came up
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable

import attrs
import grpc

from reactantserver.core.config import ModelControlMode, WorkerConfig
from reactantserver.core.shm import SharedMemoryRegistry
from reactantserver.core.tracing import Tracing
from reactantserver.core.weights import WeightStore
from reactantserver.worker.dataplane import DataPlane
from reactantserver.worker.meta import MetaRunner
from reactantserver.worker.registry import (
    NOT_RESIDENT_REASON,
    SERVED_VERSIONS,
    ModelEntry,
    ModelRegistry,
    ModelState,
)
from reactantserver.worker.request_counters import RequestCounters
from reactantserver.worker.runtime.backend import Backend
from reactantserver.worker.runtime.budget import BudgetPolicy
from reactantserver.worker.runtime.executable_cache import ExecutableCache
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.runtime.weight_cache import WeightCache
from reactantserver.worker.scheduler import InflightLimiter, Scheduler

__all__ = ["ModelLoadRecord", "RequestObserver", "Runtime", "WorkerState"]

#: The default ``service.name`` of the worker's spans.
_SERVICE_NAME = "reactantserver-worker"


RequestObserver = Callable[[str, grpc.StatusCode, float, int, int], None]
"""Called once per finished inference request: ``(model, final status, handler seconds,
decode ns, encode ns)``, the last two the event-loop thread's CPU (``time.thread_time_ns``) in
``codec.decode_request`` and ``codec.encode_response`` (0 for a stage it did not reach)."""


@attrs.define(eq=False)
class Runtime:
    """The device side once the backend is up: caches, scheduler, data plane and hook pool."""

    backend: Backend
    platform: str
    """``cpu`` or ``cuda``: ``ModelMetadata.platform`` and ``ModelConfig.platform``."""
    device_kind: str
    weights: WeightCache
    executables: ExecutableCache
    store: WeightStore
    scheduler: Scheduler
    dataplane: DataPlane
    pool: concurrent.futures.ThreadPoolExecutor
    """The hook pool (``model.py`` hooks and other per-request CPU work)."""
    policy: BudgetPolicy | None = None
    """The on-demand budget's inputs (arena, shares); ``None`` in tests that skip the probe."""
    metas: MetaRunner | None = None
    """Serves meta models: the meta gate and the scratch pool."""


@attrs.define
class ModelLoadRecord:
    """Per model name: the last load/compile duration and the failed loads so far."""

    seconds: float = 0.0
    failures: int = 0


@attrs.define(eq=False)
class WorkerState:
    """Everything about this worker that outlives one request."""

    config: WorkerConfig
    version: str
    registry: ModelRegistry = attrs.field()
    shm: SharedMemoryRegistry = attrs.Factory(SharedMemoryRegistry)
    limiter: InflightLimiter = attrs.field()
    runtime: Runtime | None = None
    started: bool = False
    """Every start-up model finished loading (compiled and warmed, or failed)."""
    stopping: bool = False
    """Shutdown began: health is ``NOT_SERVING`` and new inference is refused."""
    loads: dict[str, ModelLoadRecord] = attrs.Factory(dict)
    requests: RequestCounters = attrs.field()
    """Every finished inference request, counted once by the transport that answered it
    (``observe``; with the decode and encode stages of the stage CPU family); a model name
    that leaves (unload, rename) drops its series (``forget``). ``/metrics`` reads them."""
    meta_floors: dict[str, Residency] = attrs.Factory(dict)
    """The residency last set on each meta with ``SetModelResidency``."""
    tracing: Tracing = attrs.field()
    """Request tracing (``tracing.*``) and its live ``TraceSetting`` settings."""
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    @registry.default
    def _registry(self) -> ModelRegistry:
        return ModelRegistry(expose_sub_models=self.config.meta.expose_sub_models)

    @limiter.default
    def _limiter(self) -> InflightLimiter:
        return InflightLimiter(self.config.endpoints.max_concurrent_requests)

    @tracing.default
    def _tracing(self) -> Tracing:
        return Tracing(self.config.tracing, service=_SERVICE_NAME)

    @requests.default
    def _requests(self) -> RequestCounters:
        # Only names the registry holds get series: clients cannot mint label values.
        return RequestCounters(lambda name: self.registry.get(name) is not None)

    # -- readiness -------------------------------------------------------------------------

    @property
    def explicit(self) -> bool:
        """``model_control_mode: explicit`` (only pinned models serve)."""
        return self.config.model_control_mode is ModelControlMode.EXPLICIT

    def ready(self) -> bool:
        """``ServerReady``: start-up finished, ≥ 1 model registered, not shutting down.

        Registered means loaded (``READY``); in explicit mode it need not be resident, so a
        control plane can see the worker ready before it pins anything.
        """
        if not self.started or self.stopping:
            return False
        return any(entry.state is ModelState.READY for entry in self.registry.visible())

    def serving(self, entry: ModelEntry) -> bool:
        """Whether ``entry`` answers inference now (READY and, in explicit mode, on the device).

        A meta serves when every sub-model does (loaded, regular, and resident in explicit
        mode).
        """
        return entry.state is ModelState.READY and self.unavailable_reason(entry) is None

    def unavailable_reason(self, entry: ModelEntry) -> str | None:
        """Why a READY ``entry`` does not serve now (``None``: it does)."""
        if entry.state is not ModelState.READY:
            return entry.reason or entry.state.value.lower()
        if entry.meta is None:
            return None if self._resident(entry.name) else NOT_RESIDENT_REASON
        for callee in entry.meta.calls:
            sub = self.registry.get(callee)
            if sub is None or sub.state is not ModelState.READY or not sub.installed:
                return f"sub-model '{callee}' is not loaded"
            if sub.is_meta:
                return f"sub-model '{callee}' is a meta model; a meta may call regular models only"
            if not self._resident(callee):
                return f"sub-model '{callee}' is {NOT_RESIDENT_REASON}"
        return None

    def _resident(self, name: str) -> bool:
        if not self.explicit or self.runtime is None:
            return True
        weights = self.runtime.weights
        return name not in weights or weights.is_resident(name)

    def model_ready(self, name: str, version: str = "") -> bool:
        """``ModelReady``: never an error; hidden, unknown or bad versions are ``False``."""
        if version not in SERVED_VERSIONS:
            return False
        entry = self.registry.get(name)
        return entry is not None and not entry.hidden and self.serving(entry)

    # -- load records ----------------------------------------------------------------------

    def record_load(self, name: str, seconds: float, *, ok: bool) -> None:
        """Note one load attempt of ``name`` (``worker_model_load_*``)."""
        with self._lock:
            record = self.loads.setdefault(name, ModelLoadRecord())
            record.seconds = seconds
            if not ok:
                record.failures += 1

    def rename_load(self, old: str, new: str) -> None:
        """Carry ``old``'s load record over to ``new`` (a rename in place)."""
        with self._lock:
            record = self.loads.pop(old, None)
            if record is not None:
                self.loads[new] = record

    def forget_load(self, name: str) -> None:
        """Drop the load record of an unloaded model (its metric series go with it)."""
        with self._lock:
            self.loads.pop(name, None)
