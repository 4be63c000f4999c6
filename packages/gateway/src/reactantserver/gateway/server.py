"""The gateway process on one event loop: workers dialled, routes discovered, listeners open.

:class:`GatewayServer` builds a link per worker, the policy of ``scheduling.mode``, the prober,
the proxy and the services, runs the mode's start-up preconditions and one synchronous
discovery round, then opens the gRPC port (inference, health, reflection, control) and the
HTTP port (``/metrics`` aggregated over the workers, ``/healthz``, ``/readyz``, KServe V2
REST under ``/v2``, the status page ``/`` and its ``/status`` document)::

    server = GatewayServer(load_gateway_config(None, os.environ), version="0.1.0")
    await server.start()
    await server.wedged.wait()          # or a signal
    await server.shut_down()
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from reactantserver.core.front import GrpcFront
from reactantserver.core.protocol import INFERENCE_SERVICE, MODEL_INFER, control_pb2
from reactantserver.core.rest.http_app import start_http
from reactantserver.core.serving import (
    HEALTH_SERVICE,
    HealthTracker,
    enable_reflection,
    front_tls,
)
from reactantserver.core.tracing import Tracing
from reactantserver.gateway.config import GatewayConfig
from reactantserver.gateway.policies.modes import make_policy, wait_for_preconditions
from reactantserver.gateway.policies.policy import Policy
from reactantserver.gateway.transport.control import add_control_services
from reactantserver.gateway.transport.http import gateway_http_app
from reactantserver.gateway.transport.proxy import Proxy, ProxySettings
from reactantserver.gateway.transport.rest import GatewayRestBackend
from reactantserver.gateway.transport.service import GatewayService
from reactantserver.gateway.views.metrics import GatewayMetrics
from reactantserver.gateway.views.status import StatusSource
from reactantserver.gateway.workers.discovery import Discovery
from reactantserver.gateway.workers.link import ChannelSettings, WorkerLink

__all__ = ["GatewayServer", "split_address"]

_log = logging.getLogger("reactantserver.gateway")

_CONTROL_SERVICES = [
    control_pb2.DESCRIPTOR.services_by_name["GatewayControl"].full_name,
    control_pb2.DESCRIPTOR.services_by_name["WorkerControl"].full_name,
]
#: In-flight calls get this long to finish after SIGTERM (the supervisor's grace is 10 s).
SHUTDOWN_GRACE_SECONDS = 8.0


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` into its host and port."""
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


class GatewayServer:
    """One gateway: worker links, policy, prober, proxy, services and both listeners."""

    def __init__(self, config: GatewayConfig, *, version: str) -> None:
        self.config = config
        self.version = version
        settings = ChannelSettings(
            max_send_msg_bytes=config.grpc.max_send_msg_bytes,
            max_recv_msg_bytes=config.grpc.max_recv_msg_bytes,
            max_concurrent_streams=config.worker_client.max_concurrent_streams,
            ca_file=config.worker_client.tls.ca_file,
            cert_file=config.worker_client.tls.cert_file,
            key_file=config.worker_client.tls.key_file,
            lane=config.worker_client.lane,
        )
        self.links = [
            WorkerLink(url, label, settings)
            for url, label in zip(config.endpoints, config.worker_labels, strict=True)
        ]
        self.metrics = GatewayMetrics(mode=config.scheduling.mode.value)
        self.policy: Policy = make_policy(config, self.links, self.metrics)
        #: Set when every worker probe timed out for ``wedge_exit_rounds`` rounds (exit 1).
        self.wedged = asyncio.Event()
        self.discovery = Discovery(
            self.links,
            self.policy,
            interval_seconds=config.health.interval_seconds,
            wedge_exit_rounds=config.health.wedge_exit_rounds,
            on_wedged=self.wedged.set,
            on_round=self._after_round,
        )
        #: Request tracing (``tracing.*``); the proxy traces ``ModelInfer`` calls with it.
        self.tracing = Tracing(config.tracing, service="reactantserver-gateway")
        if hasattr(self.policy, "wake"):
            self.policy.wake = self.discovery.wake  # operator repacks wake the prober
        self.proxy = Proxy(
            {link.url: link for link in self.links},
            self.discovery,
            self.policy,
            self.metrics,
            ProxySettings(
                request_timeout_seconds=config.worker_client.request_timeout_seconds,
                inbound_cap=config.inbound_cap,
            ),
            tracing=self.tracing,
        )
        self.service = GatewayService(
            self.links,
            self.discovery,
            self.proxy,
            version=version,
            timeout_seconds=config.worker_client.request_timeout_seconds,
        )
        self.health = HealthTracker(self.service.ready)
        self.status = StatusSource(
            version=version,
            policy=self.policy,
            routes=lambda: self.discovery.routes,
            workers=self.links,
            http_endpoints=config.metrics_endpoints,
            ready=self.service.ready,
        )
        self.grpc_port = 0
        #: The port serving KServe REST (``listen.http``, else the metrics port).
        self.http_port = 0
        self.metrics_port = 0
        self._server: GrpcFront | None = None
        self._runners: list[web.AppRunner] = []
        self._stopped = False

    def _after_round(self) -> None:
        self.metrics.routing_table_size.set(len(self.discovery.routes))
        for link in self.links:
            self.metrics.worker_ready.labels(worker=link.label).set(1 if link.ready else 0)
            lane = link.lane is not None and link.lane.open
            self.metrics.worker_lane.labels(worker=link.label).set(1 if lane else 0)

    async def start(self) -> None:
        """Preconditions, one discovery round, then both listeners and the prober."""
        config = self.config
        self.metrics.max_concurrent_requests.set(config.inbound_cap)
        await wait_for_preconditions(config, self.links, self.policy)
        await self.discovery.probe_round()
        server = GrpcFront(
            max_recv_msg_bytes=config.grpc.max_recv_msg_bytes,
            max_send_msg_bytes=config.grpc.max_send_msg_bytes,
            log_format=config.logging.format.value,
        )
        server.add_generic_rpc_handlers([self.service.handler()])
        server.set_gate(MODEL_INFER, self.proxy.refusal)
        self.health.add_to(server)
        services = [INFERENCE_SERVICE, HEALTH_SERVICE]
        if config.control_service:
            add_control_services(server, self.policy, self.links, config)
            services.extend(_CONTROL_SERVICES)
        enable_reflection(server, services)
        address = config.listen.grpc
        self.grpc_port = server.add_port(address, front_tls(config.tls))
        await server.start(grace_seconds=SHUTDOWN_GRACE_SECONDS)
        self._server = server
        await self.health.start()
        self.discovery.start()
        host, port = split_address(config.listen.metrics)
        targets = list(zip(config.worker_labels, config.metrics_endpoints, strict=False))
        separate = config.listen.separate_http
        rest = GatewayRestBackend(self.service)
        runner = await start_http(
            gateway_http_app(
                metrics=self.metrics,
                scrape_targets=targets,
                ready=self.service.ready,
                rest=None if separate else rest,
                max_body_bytes=config.grpc.max_recv_msg_bytes,
                status=self.status,
            ),
            host,
            port,
        )
        self._runners.append(runner)
        self.metrics_port = self.http_port = _bound_port(runner, port)
        if separate:
            rest_host, rest_port = split_address(config.listen.http)
            runner = await start_http(
                gateway_http_app(
                    metrics=None,
                    scrape_targets=(),
                    ready=self.service.ready,
                    rest=rest,
                    max_body_bytes=config.grpc.max_recv_msg_bytes,
                ),
                rest_host,
                rest_port,
            )
            self._runners.append(runner)
            self.http_port = _bound_port(runner, rest_port)
        _log.info(
            "listening grpc=%s (port %d) http=%d metrics=%s:%d workers=%s mode=%s",
            address,
            self.grpc_port,
            self.http_port,
            host,
            self.metrics_port,
            ",".join(config.endpoints),
            self.policy.mode,
        )

    async def shut_down(self) -> None:
        """Health off, refuse new work, let in-flight calls finish, close everything."""
        if self._stopped:
            return
        self._stopped = True
        self.proxy.stopping = True
        _log.info("shutdown: health NOT_SERVING, draining for up to %.1f s", SHUTDOWN_GRACE_SECONDS)
        await self.health.shut_down()
        await self.discovery.stop()
        if self._server is not None:
            await self._server.stop(SHUTDOWN_GRACE_SECONDS)
        for runner in self._runners:
            await runner.cleanup()
        await asyncio.gather(*(link.close() for link in self.links))
        self.tracing.shutdown()  # flush the spans still batched for the exporter
        _log.info("shutdown: done")


def _bound_port(runner: web.AppRunner, asked: int) -> int:
    if asked:
        return asked
    for address in runner.addresses:
        port: Any = address[1] if isinstance(address, tuple) else None
        if isinstance(port, int):
            return port
    return 0
