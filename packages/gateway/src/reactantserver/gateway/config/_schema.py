"""Frozen attrs classes of the gateway configuration (08 §Configuration).

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

from reactantserver.core.config import GrpcConfig, LoggingConfig, TlsConfig, setting
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


@attrs.frozen
class ListenAddresses:
    """``listen.*``: the gateway's gRPC and HTTP (metrics) addresses; port 0 = any free port."""

    grpc: str = setting("0.0.0.0:8001", check=_LISTEN)
    metrics: str = setting("0.0.0.0:8002", check=_LISTEN)


@attrs.frozen
class WorkerTlsConfig:
    """``worker_client.tls.*``: TLS (a CA) and mTLS (cert + key) towards the workers."""

    ca_file: str = setting("")
    cert_file: str = setting("")
    key_file: str = setting("")

    @property
    def enabled(self) -> bool:
        """Whether the worker channels use TLS."""
        return bool(self.ca_file or self.cert_file)


@attrs.frozen
class WorkerClientConfig:
    """``worker_client.*``: the gateway's outbound calls to workers."""

    request_timeout_seconds: float = setting(60.0, check=between(0, lo_open=True))
    max_concurrent_streams: int = setting(32, check=between(0, lo_open=True))
    lane: bool = setting(True)
    """Forward ModelInfer over a worker's forwarding lane when it offers one (not with TLS)."""
    tls: WorkerTlsConfig = WorkerTlsConfig()


@attrs.frozen
class GatewayGrpcConfig(GrpcConfig):
    """``grpc.*``: the worker's gRPC server settings (message limits, keepalive) and the
    gateway's inbound cap."""

    max_concurrent_requests_per_worker: int = setting(64, check=between(0))
    """In-flight inference requests admitted per worker (the cap is this times the number of
    workers; 0: no cap)."""


@attrs.frozen
class HealthConfig:
    """``health.*``: the prober's period and the wedge exit (0 rounds disables it)."""

    interval_seconds: float = setting(10.0, check=between(0, lo_open=True))
    wedge_exit_rounds: int = setting(3, check=between(0))


@attrs.frozen
class ModelPlacementConfig:
    """``scheduling.models.<m>``: one model's overrides; ``None``/``inherit`` = the default."""

    replicas: int | Literal["all"] | None = setting(
        None, check=_replicas_check, parse=parse_replicas
    )
    fill_mode: ModelFillMode = ModelFillMode.INHERIT
    fill_factor: float | None = setting(None, check=_positive_finite)


@attrs.frozen
class ModelAwareConfig:
    """``scheduling.model_aware.*``: the knobs of the ``model_aware`` estimate."""

    cold_load_penalty: float = setting(1.0, check=between(1))
    default_load_bandwidth_bytes_per_second: float = setting(8e9, check=between(0, lo_open=True))
    load_overhead_seconds: float = setting(0.005, check=between(0))
    #: Endpoint → seconds added to every estimate for that worker (read-only; not hashed).
    network_seconds: Mapping[str, float] = setting(
        factory=dict, each=between(0), converter=_frozen_map
    )


_DEFAULT_PLACEMENT: Final = ModelPlacementConfig()


@attrs.frozen
class SchedulingConfig:
    """``scheduling.*``: the policy and its knobs (lpt_packing and model_aware)."""

    mode: SchedulingMode = SchedulingMode.ROUND_ROBIN
    work_basis: WorkBasis = WorkBasis.COMPUTE
    rebalance_compute_seconds: float = setting(300.0, check=between(0, lo_open=True))
    first_rebalance_compute_seconds: float = setting(60.0, check=between(0))
    ema_halflife_compute_seconds: float = setting(0.0, check=between(0))
    hysteresis: float = setting(0.0, check=between(0, 1, hi_open=True))
    default_replicas: int | Literal["all"] = setting(1, check=_replicas_check, parse=parse_replicas)
    routing_policy: RoutingPolicy = RoutingPolicy.FILL_LEAST
    routing_fill_mode: FillMode = FillMode.RUN
    routing_fill_factor: float = setting(1.0, check=_positive_finite)
    forbid_memory_oversubscription: bool = setting(True)
    # An attrs field, which ruff does not recognise through core's helper.
    compaction_mode: CompactionMode = setting(CompactionMode.EAGER, structure=_off_from_false)  # noqa: RUF009
    compaction_interval: int = setting(1, check=between(0))
    #: Per-model overrides by model name (read-only; not hashed).
    models: Mapping[str, ModelPlacementConfig] = setting(factory=dict, converter=_frozen_map)
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
    """The validated configuration of one gateway process (08 §Configuration).

    Built by ``load_gateway_config`` or ``gateway_config_from_mapping``; direct construction
    runs the same rules (keyword arguments only; ``endpoints`` is required)::

        GatewayConfig(endpoints=("10.0.0.1:8001", "10.0.0.2:8001"))
    """

    listen: ListenAddresses = ListenAddresses()
    endpoints: tuple[str, ...] = setting(
        check=non_empty,
        each=_WORKER_ADDRESS,
        converter=_unique_in_order,
        required_hint="list the workers' host:port (or set REACTANT_GATEWAY_WORKERS)",
    )
    metrics_endpoints: tuple[str, ...] = setting((), each=_WORKER_ADDRESS, converter=_strings)
    worker_names: tuple[str, ...] = setting((), check=unique, each=non_empty, converter=_strings)
    worker_client: WorkerClientConfig = WorkerClientConfig()
    grpc: GatewayGrpcConfig = GatewayGrpcConfig()
    tls: TlsConfig = attrs.field(factory=TlsConfig)
    logging: LoggingConfig = attrs.field(factory=LoggingConfig)
    health: HealthConfig = HealthConfig()
    startup_wait_seconds: float = setting(
        0.0, check=_wait_check, parse=parse_wait_seconds, converter=_wait_converter
    )
    """How long start-up waits for the workers to answer; ``inf``, ``forever`` or ``-1``: no
    bound."""
    control_service: bool = setting(True)
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
