"""How a worker is put together: the one place that builds it, starts it and stops it.

:class:`WorkerServer` owns every collaborator and wires them explicitly:

- :class:`~reactantserver.worker.state.WorkerState`: the registry, the in-flight limiter,
  the request counters and the shared-memory registry, which every transport reads;
- the transports (``transport/``): the native gRPC front with the inference service
  (:class:`~reactantserver.worker.transport.inference.InferenceService`), health,
  reflection and the control service; the forwarding lane; the HTTP port (``/metrics``,
  ``/healthz``, ``/readyz``, ``/status``, ``/v2`` REST over the same inference service);
- on the loader thread once the listeners are open: the runtime
  (:func:`build_runtime`, below: backend, caches,
  scheduler, data plane; set on the state here and nowhere else), the start-up models
  (:func:`~reactantserver.worker.repository.boot.boot`) and the repository control
  (:func:`~reactantserver.worker.repository.watcher.start_lifecycle`: lifecycle and, in
  ``dynamic`` mode, the watcher), which the inference service asks for model control.

Until start-up finishes the worker is live but not ready. :meth:`WorkerServer.shut_down` is
the graceful SIGTERM path: health flips to ``NOT_SERVING``, new work is refused with
``UNAVAILABLE``, queued work drains for ``shutdown_grace_seconds`` and whatever is left then
fails with ``UNAVAILABLE``::

    server = WorkerServer(config, version="0.1.0")
    await server.start()
    await server.wait_booted()
    ...
    await server.shut_down()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from reactantserver.core.buffer_pool import BufferPool
from reactantserver.core.config import WorkerConfig
from reactantserver.core.front import GrpcFront, flood_backstop
from reactantserver.core.protocol import (
    INFERENCE_SERVICE,
    MODEL_INFER,
    control_pb2,
    inference_service_handler,
)
from reactantserver.core.rest.http_app import start_http
from reactantserver.core.serving import (
    HEALTH_SERVICE,
    HealthTracker,
    enable_reflection,
    front_tls,
)
from reactantserver.core.weights import PrivateWeightStore, SharedWeightStore, WeightStore
from reactantserver.worker.dataplane import DataPlane
from reactantserver.worker.hooks import hook_pool, hook_pool_size
from reactantserver.worker.meta import MetaGate, MetaRunner
from reactantserver.worker.repository.boot import boot
from reactantserver.worker.repository.watcher import RepositoryControl, start_lifecycle
from reactantserver.worker.runtime.device_setup import budget_policy, create_backend
from reactantserver.worker.runtime.executable_cache import ExecutableCache
from reactantserver.worker.runtime.weight_cache import WeightCache
from reactantserver.worker.scheduler import Scheduler
from reactantserver.worker.state import Runtime, WorkerState
from reactantserver.worker.transport.control import add_control_service
from reactantserver.worker.transport.http import http_app
from reactantserver.worker.transport.inference import InferenceService
from reactantserver.worker.transport.lane import LaneServer
from reactantserver.worker.views.metrics import WorkerMetrics

__all__ = ["WorkerServer"]

_log = logging.getLogger("reactantserver.worker")

_CONTROL_SERVICE = control_pb2.DESCRIPTOR.services_by_name["WorkerControl"].full_name


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _weight_store(config: WorkerConfig) -> WeightStore:
    runtime = config.runtime
    if runtime.shared_host_weights:
        return SharedWeightStore(runtime.shared_host_weights_mode_bits)
    return PrivateWeightStore()


def build_runtime(state: WorkerState) -> Runtime:
    """Backend, caches, scheduler, data plane and hook pool, with no model yet."""
    config = state.config
    backend, platform, device_kind = create_backend(config)
    runtime = config.runtime
    root = Path(config.cache_dir) / "executables" if runtime.executable_cache else None
    executables = ExecutableCache(root, backend, max_bytes=runtime.executable_cache_max_bytes)
    policy = budget_policy(config, backend)
    explicit = state.explicit
    weights = WeightCache(
        backend,
        budget=policy.provisional_budget(),
        enabled=policy.enabled,
        explicit=policy.enabled and explicit,
    )
    if explicit and not policy.enabled:
        _log.warning(
            "explicit mode without an on-demand weight cache: residency control is inert, "
            "every model's weights stay on the device"
        )
    scheduler = Scheduler(backend, weights, config.scheduler)
    pool = hook_pool(hook_pool_size(config))
    metas = meta_runner(config, state, scheduler, pool)
    return Runtime(
        backend=backend,
        platform=platform,
        device_kind=device_kind,
        weights=weights,
        executables=executables,
        store=_weight_store(config),
        scheduler=scheduler,
        dataplane=DataPlane(
            state.registry,
            scheduler,
            pool,
            limiter=state.limiter,
            metas=metas,
            unavailable=state.unavailable_reason,
        ),
        pool=pool,
        policy=policy,
        metas=metas,
    )


def meta_runner(
    config: WorkerConfig,
    state: WorkerState,
    scheduler: Scheduler,
    pool: concurrent.futures.Executor,
) -> MetaRunner:
    """The meta gate (``meta.concurrency``) and scratch pool (``meta.scratch_*``) of 07."""
    meta = config.meta
    scratch = None
    if meta.scratch_bytes > 0:
        # Plain anonymous memory: pages are committed only when a meta writes them.
        scratch = BufferPool(max(meta.scratch_bytes, meta.scratch_slots), meta.scratch_slots)
    return MetaRunner(
        state.registry, scheduler, pool, gate=MetaGate(meta.concurrency), scratch=scratch
    )


class WorkerServer:
    """One worker: its state, its listeners and its start-up and shutdown sequences."""

    def __init__(self, config: WorkerConfig, *, version: str) -> None:
        self.config = config
        self.state = WorkerState(config, version=version)
        self.metrics = WorkerMetrics(self.state)
        self.health = HealthTracker(self.state.ready)
        self.grpc_port = 0
        #: The port serving KServe REST (``endpoints.http_port``, else the metrics port).
        self.http_port = 0
        self.metrics_port = 0
        self._server: GrpcFront | None = None
        self._runners: list[web.AppRunner] = []
        self._booted: asyncio.Future[None] | None = None
        self._stopped = False
        self.lane: LaneServer | None = None
        #: The lifecycle (and dynamic mode's watcher) once start-up is done.
        self.repository: RepositoryControl | None = None

    async def start(self) -> None:
        """Open both listeners and start loading models on the loader thread."""
        config = self.config
        server = GrpcFront(
            max_recv_msg_bytes=config.grpc.max_recv_msg_bytes,
            max_send_msg_bytes=config.grpc.max_send_msg_bytes,
            max_concurrent_calls=flood_backstop(config.endpoints.max_concurrent_requests),
            runtime_threads=config.endpoints.front_threads,
            log_format=config.logging.format.value,
        )
        service = InferenceService(self.state, repository=lambda: self.repository)
        server.add_generic_rpc_handlers([inference_service_handler(service.handlers())])
        server.set_gate(MODEL_INFER, self.state.limiter.refusal)
        self.health.add_to(server)
        services = [INFERENCE_SERVICE, HEALTH_SERVICE]
        if config.endpoints.control_service:
            add_control_service(server, self.state)
            services.append(_CONTROL_SERVICE)
        if config.endpoints.reflection:
            enable_reflection(server, services)
        address = _address(config.endpoints.host, config.endpoints.port)
        tls = front_tls(config.endpoints.tls)
        self.grpc_port = server.add_port(address, tls)
        await server.start(grace_seconds=config.shutdown_grace_seconds + 1.0)
        self._server = server
        if config.endpoints.lane and tls is None:
            self.lane = await self._open_lane(service)
        await self.health.start()
        await self._open_http(service)
        _log.info(
            "listening grpc=%s http=%s metrics=%s tls=%s",
            address,
            self.http_port or "off",
            self.metrics_port or "off",
            tls is not None,
        )
        self._booted = self._boot_in_thread()

    async def _open_http(self, service: InferenceService) -> None:
        """The metrics port, and the REST port when it is a port of its own."""
        endpoints = self.config.endpoints
        separate = endpoints.http_port not in (0, endpoints.metrics_port)
        if endpoints.metrics_port:
            app = http_app(self.state, self.metrics, service, rest=not separate)
            self._runners.append(await start_http(app, endpoints.host, endpoints.metrics_port))
            self.metrics_port = endpoints.metrics_port
            if not separate:
                self.http_port = endpoints.metrics_port
        if separate:
            app = http_app(self.state, None, service)
            self._runners.append(await start_http(app, endpoints.host, endpoints.http_port))
            self.http_port = endpoints.http_port

    async def _open_lane(self, service: InferenceService) -> LaneServer | None:
        grpc_config = self.config.grpc
        try:
            lane = await LaneServer.open(
                service,
                max_recv=grpc_config.max_recv_msg_bytes,
                max_send=grpc_config.max_send_msg_bytes,
            )
        except OSError as exc:
            _log.warning("forwarding lane not opened (gateways use gRPC): %s", exc)
            return None
        service.lane_advert = lane.advert
        _log.info("forwarding lane at %s", lane.advert.path)
        return lane

    def _boot_in_thread(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if done.done():
                return
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        def run() -> None:
            error: BaseException | None = None
            try:
                runtime = build_runtime(self.state)
                self.state.runtime = runtime
                booted = boot(self.state, runtime)
                self.repository = start_lifecycle(self.state, runtime, booted)
            except BaseException as exc:
                error = exc
            # The server may have shut down and its loop closed during a long first compile:
            # then nobody waits for this result.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, error)

        # A daemon thread: a SIGTERM during a long first compile must not wait for it.
        threading.Thread(target=run, name="reactant-loader", daemon=True).start()
        return done

    async def wait_booted(self) -> None:
        """Until every start-up model loaded or failed (re-raises a fatal start-up error)."""
        assert self._booted is not None, "start() first"
        await asyncio.shield(self._booted)
        await self.health.sync()

    async def shut_down(self) -> None:
        """Health off, refuse new work, drain queued work for the grace, close listeners."""
        if self._stopped:
            return
        self._stopped = True
        state = self.state
        state.stopping = True
        grace = self.config.shutdown_grace_seconds
        _log.info("shutdown: health NOT_SERVING, draining for up to %.1f s", grace)
        await self.health.shut_down()
        watcher = None if self.repository is None else self.repository.watcher
        if watcher is not None:
            await asyncio.to_thread(watcher.stop, 1.0)
        waits: list[Any] = []
        runtime = state.runtime
        if runtime is not None:
            waits.append(asyncio.to_thread(runtime.scheduler.stop, grace))
        if self._server is not None:
            # In-flight handlers are answered by the drain; the extra second lets them write.
            waits.append(self._server.stop(grace + 1.0))
        await asyncio.gather(*waits)
        if self.lane is not None:
            await self.lane.close()
        for runner in self._runners:
            await runner.cleanup()
        self.metrics.close()
        if runtime is not None:
            runtime.pool.shutdown(wait=False, cancel_futures=True)
            if self._booted is not None and self._booted.done():
                # The dispatch thread is joined: release every host floor, so that the last
                # holder of a shared weight region unlinks it instead of leaking /dev/shm.
                for name in list(runtime.weights):
                    runtime.weights.remove_model(name)
        state.shm.close()
        state.tracing.shutdown()  # flush the spans still batched for the exporter
        _log.info("shutdown: done")
