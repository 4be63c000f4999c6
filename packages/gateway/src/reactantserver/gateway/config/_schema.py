"""Frozen attrs classes of the gateway configuration.

Each field's default is the one place that default lives; its rule sits next to it. Fields are
declared with core's :func:`~reactantserver.core.config.setting` and read by core's engine; the
gRPC server settings are core's :class:`~reactantserver.core.config.GrpcConfig`, as the
worker's.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, Literal, TypeAlias

import attrs

from reactantserver.core.config import GrpcConfig, LoggingConfig, TlsConfig, TracingConfig, setting
from reactantserver.core.config.rules import (
    MAX_PORT,
    Check,
    InvalidValue,
    between,
    describe,
    non_empty,
    unique,
)
from reactantserver.core.errors import ConfigError

__all__ = [
    "ALL_REPLICAS",
    "CompactionMode",
    "FillMode",
    "GatewayConfig",
    "GatewayGrpcConfig",
    "HealthConfig",
    "ListenAddresses",
    "ModelAwareConfig",
    "ModelFillMode",
    "ModelPlacementConfig",
    "Replicas",
    "RoutingPolicy",
    "SchedulingConfig",
    "SchedulingMode",
    "WorkBasis",
    "WorkerClientConfig",
    "WorkerTlsConfig",
]

_FOREVER_WORDS: Final = frozenset({"inf", "+inf", "infinity", "forever"})
ALL_REPLICAS: Final = "all"

Replicas: TypeAlias = int | Literal["all"]
"""A replica count: an int >= 1 or ``"all"`` (every worker)."""


def _port_text(lo: int) -> str:
    return f'must be "host:port" (IPv6 as "[::1]:port") with a port in [{lo}, {MAX_PORT}]'


def address(*, min_port: int) -> Check:
    """Rule of ``host:port`` strings; IPv6 hosts in brackets; ports from ``min_port``."""
    text = _port_text(min_port)

    def check(value: Any) -> str | None:
        if not isinstance(value, str) or any(c.isspace() for c in value):
            return text
        host, _, port = value.rpartition(":")
        if host.startswith("["):
            host_ok = host.endswith("]") and len(host) > 2 and "]" not in host[1:-1]
        else:
            host_ok = bool(host) and not any(c in host for c in ":[]")
        if host_ok and port.isascii() and port.isdigit() and min_port <= int(port) <= MAX_PORT:
            return None
        return text

    return check


def parse_replicas(value: object) -> Replicas | None:
    """A replica count from a file or env value: an int >= 1 or ``all``; ``None`` = inherit."""
    if value is None or value == ALL_REPLICAS:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise InvalidValue(f"must be an integer >= 1 or {ALL_REPLICAS}, got {describe(value)}")


class SchedulingMode(enum.StrEnum):
    """``scheduling.mode``: the routing policy, chosen at start-up."""

    ROUND_ROBIN = "round_robin"
    LPT_PACKING = "lpt_packing"
    MODEL_AWARE = "model_aware"


class WorkBasis(enum.StrEnum):
    """``scheduling.work_basis``: what a request weighs (case-insensitive)."""

    COMPUTE = "compute"
    ITEMS = "items"
    REQUESTS = "requests"

    @classmethod
    def _missing_(cls, value: object) -> Any:
        if isinstance(value, str) and value.lower() != value:
            return cls(value.lower())
        return None


class RoutingPolicy(enum.StrEnum):
    """``scheduling.routing_policy``: tie-break by worker load (``fill_least``) or rotation."""

    FILL_LEAST = "fill_least"
    FILL_RR = "fill_rr"


class FillMode(enum.StrEnum):
    """``scheduling.routing_fill_mode``: how a model's requests fill its replicas."""

    RUN = "run"
    SPREAD = "spread"
    INFLIGHT = "inflight"


class ModelFillMode(enum.StrEnum):
    """``scheduling.models.<m>.fill_mode``: a :class:`FillMode`, or ``inherit`` the default."""

    RUN = "run"
    SPREAD = "spread"
    INFLIGHT = "inflight"
    INHERIT = "inherit"

    def resolve(self, default: FillMode) -> FillMode:
        """The fill mode in force: this one, or ``default`` when inheriting."""
        return default if self is ModelFillMode.INHERIT else FillMode(self.value)


class CompactionMode(enum.StrEnum):
    """``scheduling.compaction_mode``: what a repack asks of the workers it changed."""

    OFF = "off"
    EAGER = "eager"
    SCHEDULED = "scheduled"


def _off_from_false(value: object) -> object:
    # YAML 1.1 reads an unquoted ``off`` as boolean false; ``off`` is a documented value here.
    return CompactionMode.OFF.value if value is False else value


def _replicas_check(value: Any) -> str | None:
    try:
        parse_replicas(value)
    except InvalidValue:
        return f"must be an integer >= 1 or {ALL_REPLICAS}"
    return None


def parse_wait_seconds(value: object) -> float:
    """``startup_wait_seconds``: seconds >= 0, or ``inf``/``forever``/``-1`` for no bound."""
    if isinstance(value, str) and value.strip().lower() in _FOREVER_WORDS:
        return math.inf
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value in (-1, math.inf):
            return math.inf
        if value >= 0 and not math.isnan(value):
            return float(value)
    raise InvalidValue(f"must be a number >= 0, or inf, forever or -1, got {describe(value)}")


def _wait_converter(value: Any) -> Any:
    try:
        return parse_wait_seconds(value)
    except InvalidValue:
        return value  # the rule reports it


def _wait_check(value: Any) -> str | None:
    try:
        parse_wait_seconds(value)
    except InvalidValue:
        return "must be a number >= 0, or inf, forever or -1"
    return None


def _positive_finite(value: Any) -> str | None:
    return None if value is None or (value > 0 and math.isfinite(value)) else "must be > 0"


def _frozen_map(value: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(value))


def _unique_in_order(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(value))


def _strings(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


_LISTEN = address(min_port=0)
_WORKER_ADDRESS = address(min_port=1)


def _optional_listen(value: Any) -> str | None:
    return None if value == "" else _LISTEN(value)


@attrs.frozen
class ListenAddresses:
    """``listen.*``: the gateway's REST, gRPC and metrics addresses; port 0 = any free port."""

    http: str = setting("", check=_optional_listen)
    """Address of the gateway's KServe REST port (inference, metadata, ``/v2/health/*``,
    ``/healthz``, ``/readyz``; no metrics, no status page), ``host:port``; port 0 picks a free
    port. Empty (the default) or equal to ``metrics``: REST is served on the metrics port. A
    node's embedded gateway gets the node's ``listen.http`` (8000). Plain HTTP."""
    grpc: str = setting("0.0.0.0:8001", check=_LISTEN)
    """Address of the gateway's gRPC port, ``host:port`` (IPv6 hosts in brackets); port 0
    picks a free port."""
    metrics: str = setting("0.0.0.0:8002", check=_LISTEN)
    """Address of the gateway's metrics port (its metrics merged with the workers', the
    status page, the probes, and REST when ``http`` is empty), ``host:port``; port 0 picks a
    free port. It is plain HTTP."""

    @property
    def separate_http(self) -> bool:
        """Whether REST has a listener of its own."""
        return self.http not in ("", self.metrics)


@attrs.frozen
class WorkerTlsConfig:
    """``worker_client.tls.*``: TLS (a CA) and mTLS (cert + key) towards the workers."""

    ca_file: str = setting("")
    """Path of the PEM CA bundle that verifies the workers' certificates; setting it (or
    ``cert_file``) makes the gateway dial workers over TLS. Empty: plain gRPC, or the
    system's CAs when only ``cert_file`` is set."""
    cert_file: str = setting("")
    """Path of the PEM client certificate the gateway presents to workers that require
    mutual TLS; set ``key_file`` with it."""
    key_file: str = setting("")
    """Path of the PEM private key of ``cert_file``."""

    @property
    def enabled(self) -> bool:
        """Whether the worker channels use TLS."""
        return bool(self.ca_file or self.cert_file)


@attrs.frozen
class WorkerClientConfig:
    """``worker_client.*``: the gateway's outbound calls to workers."""

    request_timeout_seconds: float = setting(60.0, check=between(0, lo_open=True))
    """Deadline in seconds of a forwarded call whose client set none, and of the gateway's
    own calls to workers (> 0); a ``CompactMemory`` fan-out gets at least 300 s."""
    max_concurrent_streams: int = setting(32, check=between(0, lo_open=True))
    """The most calls the gateway has in flight to one worker (> 0); more wait for a slot,
    bounded by their deadlines."""
    lane: bool = setting(True)
    """Forward inference calls over a worker's forwarding lane (a Unix socket on the same
    host) when it offers one; never with TLS towards the workers."""
    tls: WorkerTlsConfig = WorkerTlsConfig()


@attrs.frozen
class GatewayGrpcConfig(GrpcConfig):
    """``grpc.*``: the worker's gRPC settings (message limits, keepalive; one definition, in
    core's ``GrpcConfig``) and the gateway's inbound cap."""

    max_concurrent_requests_per_worker: int = setting(64, check=between(0))
    """Inference calls in flight through the gateway, per worker: the gateway's cap is this
    times the number of ``endpoints``, and a call past it is refused with
    ``RESOURCE_EXHAUSTED``. 0: no cap."""


@attrs.frozen
class HealthConfig:
    """``health.*``: the prober's period and the wedge exit (0 rounds disables it)."""

    interval_seconds: float = setting(10.0, check=between(0, lo_open=True))
    """Seconds between probe rounds (> 0): each round checks every worker's readiness,
    refreshes the routing table and, in ``lpt_packing`` and ``model_aware``, polls the
    workers' status."""
    wedge_exit_rounds: int = setting(3, check=between(0))
    """Exit with code 1 (so a supervisor restarts the gateway) after this many probe rounds
    in a row in which every worker probe timed out, once some worker had answered. 0: never."""


@attrs.frozen
class ModelPlacementConfig:
    """``scheduling.models.<m>``: one model's overrides; ``None``/``inherit`` = the default."""

    replicas: int | Literal["all"] | None = setting(
        None, check=_replicas_check, parse=parse_replicas
    )
    """How many workers this model is placed on: an integer >= 1 or ``all``; unset:
    ``scheduling.default_replicas``. Takes effect at the next repack."""
    fill_mode: ModelFillMode = ModelFillMode.INHERIT
    """This model's fill mode (``run``, ``spread`` or ``inflight``); ``inherit`` uses
    ``scheduling.routing_fill_mode``."""
    fill_factor: float | None = setting(None, check=_positive_finite)
    """This model's fill factor (> 0); unset: ``scheduling.routing_fill_factor``."""


@attrs.frozen
class ModelAwareConfig:
    """``scheduling.model_aware.*``: the knobs of the ``model_aware`` estimate."""

    cold_load_penalty: float = setting(1.0, check=between(1))
    """Multiplier on the estimated time of a cold weight load (>= 1); raise it to send more
    requests to workers where the model is already resident."""
    default_load_bandwidth_bytes_per_second: float = setting(8e9, check=between(0, lo_open=True))
    """Weight-load speed assumed for a worker until it has measured its own, in bytes per
    second (> 0; 8e9 is 8 GB/s)."""
    load_overhead_seconds: float = setting(0.005, check=between(0))
    """Fixed seconds added to every cold-load estimate, whatever the model's size (>= 0)."""
    # Read-only; not hashed.
    network_seconds: Mapping[str, float] = setting(
        factory=dict, each=between(0), converter=_frozen_map
    )
    """Worker endpoint (as written in ``endpoints``) to seconds (>= 0) added to every
    estimate for that worker, for workers farther away; unlisted: 0. Fixed at start-up."""


_DEFAULT_PLACEMENT: Final = ModelPlacementConfig()


@attrs.frozen
class SchedulingConfig:
    """``scheduling.*``: the policy and its knobs (lpt_packing and model_aware)."""

    mode: SchedulingMode = SchedulingMode.ROUND_ROBIN
    """The routing policy, fixed at start-up: ``round_robin`` (rotate over a model's
    workers), ``lpt_packing`` (place models by compute and memory) or ``model_aware`` (the
    worker expected to finish first, counting cold loads)."""
    work_basis: WorkBasis = WorkBasis.COMPUTE
    """``lpt_packing``: what a request adds to its worker's in-flight load, which
    ``fill_least`` compares: ``compute`` (items times cost per item), ``items``, or
    ``requests`` (the model's cost per request, whatever its size). Case-insensitive."""
    rebalance_compute_seconds: float = setting(300.0, check=between(0, lo_open=True))
    """``lpt_packing``: fleet compute seconds (device time summed over the workers) between
    two automatic repacks (> 0)."""
    first_rebalance_compute_seconds: float = setting(60.0, check=between(0))
    """``lpt_packing``: fleet compute seconds before the first repack after start-up, so
    placement adapts sooner; 0 uses ``rebalance_compute_seconds``."""
    ema_halflife_compute_seconds: float = setting(0.0, check=between(0))
    """Half-life of each model's learned cost and arrival rate, in fleet compute seconds, so
    an idle fleet forgets nothing; 0 uses ``rebalance_compute_seconds``."""
    hysteresis: float = setting(0.0, check=between(0, 1, hi_open=True))
    """``lpt_packing``: a one-replica model stays on its previous worker while that worker
    scores within ``1 + hysteresis`` times the best one, in [0, 1); 0: always the best."""
    default_replicas: int | Literal["all"] = setting(1, check=_replicas_check, parse=parse_replicas)
    """``lpt_packing``: how many workers each model is placed on, an integer >= 1 or ``all``
    (at most the number of workers)."""
    routing_policy: RoutingPolicy = RoutingPolicy.FILL_LEAST
    """``lpt_packing``: how ties between a model's replicas are broken: ``fill_least`` (the
    worker with the least in-flight work, then rotation) or ``fill_rr`` (rotation only)."""
    routing_fill_mode: FillMode = FillMode.RUN
    """``lpt_packing``: how a model's requests fill its replicas: ``run`` (a quantum of items
    to one replica, then the next), ``spread`` (fewest items in flight) or ``inflight``
    (legacy; can leave low concurrency on one replica)."""
    routing_fill_factor: float = setting(1.0, check=_positive_finite)
    """``lpt_packing``: the fill quantum as a multiple of the model's largest batch (> 0): a
    replica takes ``round(factor * max batch)`` items, at least 1, before the next one."""
    forbid_memory_oversubscription: bool = setting(True)
    """``lpt_packing``: place a model only on workers whose weight budget still holds it,
    when any does; off, memory only weighs in the score."""
    # An attrs field, which ruff does not recognise through core's helper.
    compaction_mode: CompactionMode = setting(CompactionMode.EAGER, structure=_off_from_false)  # noqa: RUF009
    """``lpt_packing``: what a repack asks of the workers whose models changed: ``off``
    (nothing), ``eager`` (compact their device memory) or ``scheduled`` (compact it and load
    the models now placed there)."""
    compaction_interval: int = setting(1, check=between(0))
    """``lpt_packing``: compact once this many repacks have passed since the last compaction,
    at the first of them that changed some worker (>= 0); 0: never."""
    # Read-only; not hashed.
    models: Mapping[str, ModelPlacementConfig] = setting(factory=dict, converter=_frozen_map)
    """Per-model overrides of the ``lpt_packing`` placement, by model name (the keys below);
    they have no environment variables."""
    model_aware: ModelAwareConfig = ModelAwareConfig()

    @property
    def effective_ema_halflife_compute_seconds(self) -> float:
        """The EWMA half-life in force: ``ema_halflife_compute_seconds``, 0 = the rebalance."""
        return self.ema_halflife_compute_seconds or self.rebalance_compute_seconds

    def for_model(self, name: str) -> ModelPlacementConfig:
        """The overrides of ``name`` (all-inherit when it has no entry)."""
        return self.models.get(name, _DEFAULT_PLACEMENT)


@attrs.frozen(kw_only=True)
class GatewayConfig:
    """The validated configuration of one gateway process.

    Built by ``load_gateway_config`` or ``gateway_config_from_mapping``; direct construction
    runs the same rules (keyword arguments only; ``endpoints`` is required)::

        GatewayConfig(endpoints=("10.0.0.1:8001", "10.0.0.2:8001"))
    """

    listen: ListenAddresses = ListenAddresses()
    endpoints: tuple[str, ...] = setting(
        check=non_empty,
        each=_WORKER_ADDRESS,
        converter=_unique_in_order,
        required_hint="list the workers' host:port (or set REACTANTSERVER_GATEWAY_WORKERS)",
    )
    """The workers' gRPC addresses, ``host:port``; required and non-empty. Duplicates are
    dropped, order is kept. The list is fixed for the gateway's life."""
    metrics_endpoints: tuple[str, ...] = setting((), each=_WORKER_ADDRESS, converter=_strings)
    """The workers' HTTP addresses, ``host:port``, in ``endpoints`` order: their metrics are
    merged into the gateway's ``/metrics`` and their status into its status page. Empty:
    neither."""
    worker_names: tuple[str, ...] = setting((), check=unique, each=non_empty, converter=_strings)
    """Unique labels of the workers in logs, metrics and status, one per endpoint in the same
    order; empty: the endpoints themselves."""
    worker_client: WorkerClientConfig = WorkerClientConfig()
    grpc: GatewayGrpcConfig = GatewayGrpcConfig()
    tls: TlsConfig = attrs.field(factory=TlsConfig)
    logging: LoggingConfig = attrs.field(factory=LoggingConfig)
    tracing: TracingConfig = attrs.field(factory=TracingConfig)
    health: HealthConfig = HealthConfig()
    startup_wait_seconds: float = setting(
        0.0, check=_wait_check, parse=parse_wait_seconds, converter=_wait_converter
    )
    """How long ``lpt_packing`` and ``model_aware`` wait at start-up for the workers' status,
    in seconds: 0 polls once, ``inf``, ``forever`` or ``-1`` waits without bound. Unused by
    ``round_robin``."""
    control_service: bool = setting(True)
    """Serve ``GatewayControl`` (live policy, placement, ``Repack``) and the ``CompactMemory``
    fan-out; off, their calls answer ``UNIMPLEMENTED``."""
    scheduling: SchedulingConfig = SchedulingConfig()

    def __attrs_post_init__(self) -> None:
        if self.worker_names and len(self.worker_names) != len(self.endpoints):
            raise ConfigError(
                f"worker_names: must name every endpoint ({len(self.endpoints)} after "
                f"de-duplication), got {len(self.worker_names)} names"
            )

    @property
    def worker_labels(self) -> tuple[str, ...]:
        """The worker label of each endpoint: ``worker_names``, else the endpoints."""
        return self.worker_names or self.endpoints

    @property
    def inbound_cap(self) -> int:
        """In-flight inference cap: per-worker value x #workers (0 = no cap)."""
        return self.grpc.max_concurrent_requests_per_worker * len(self.endpoints)
