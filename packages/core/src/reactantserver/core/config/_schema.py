"""Frozen attrs classes of the worker configuration (02 §Worker keys).

Each field's default is the one place that default lives; its rule sits next to it.
"""

from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from reactantserver.core.config._fields import (
    GIB,
    HOOK_THREADS_CAP,
    MAX_GRPC_MESSAGE_BYTES,
    MAX_PORT,
    Choice,
    InvalidValue,
    between,
    check_octal_mode,
    env_only,
    non_empty,
    setting,
)

__all__ = [
    "Backend",
    "EndpointsConfig",
    "EnvOverride",
    "GrpcConfig",
    "LogFormat",
    "LogLevel",
    "LoggingConfig",
    "MetaConfig",
    "ModelControlMode",
    "ModelSchedulingConfig",
    "Numerics",
    "Residency",
    "RuntimeConfig",
    "SchedulerConfig",
    "SchedulingDiscipline",
    "TlsConfig",
    "WorkerConfig",
]


class Backend(Choice):
    """``runtime.backend``: the device platform the worker runs on."""

    CPU = "cpu"
    CUDA = "cuda"


class Numerics(Choice):
    """``runtime.numerics``: matmul precision policy (03 §Numerics)."""

    AUTO = "auto"
    F32 = "f32"
    TF32 = "tf32"


class ModelControlMode(Choice):
    """``model_control_mode``: who changes the model set and residency (06)."""

    DYNAMIC = "dynamic"
    STATIC = "static"
    EXPLICIT = "explicit"


class SchedulingDiscipline(Choice):
    """``scheduler.discipline``: how the dispatch thread picks the next batch (04)."""

    FAIR = "fair"
    FIFO = "fifo"
    EDF = "edf"


class Residency(Choice):
    """``scheduler.models.<m>.residency``: where a model's weights are kept."""

    UNPINNED = "unpinned"
    SYSTEM = "system"
    DEVICE = "device"


class LogLevel(Choice):
    """``logging.level``."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class LogFormat(Choice):
    """``logging.format``: human text or one JSON object per line (12 §Logs)."""

    TEXT = "text"
    JSON = "json"


def _structure_octal_mode(value: object) -> object:
    # YAML reads 660 as the integer 660 and 0660 as the octal integer 432: both lose the intent.
    if isinstance(value, int) and not isinstance(value, bool):
        raise InvalidValue(
            f'must be a quoted octal string such as "660", got integer {value}; '
            "YAML reads unquoted 660 as decimal and 0660 as octal, so quote the value"
        )
    return value


@attrs.frozen
class RuntimeConfig:
    """``runtime.*``: backend, device arena, numerics, weight cache, compile caches."""

    backend: Backend = Backend.CPU
    device_ordinal: int = setting(0, check=between(0))
    mem_fraction: float = setting(0.9, check=between(0, 1, lo_open=True))
    preallocate: bool = setting(True)
    allow_cpu_fallback: bool = setting(True)
    numerics: Numerics = Numerics.AUTO
    weight_cache_fraction: float = setting(1.0, check=between(0, 1))
    weight_cache_wiggle_fraction: float = setting(0.1, check=between(0, 1, hi_open=True))
    weight_cache_max_bytes: int = setting(0, check=between(0))
    autotune: bool = setting(True)
    autotune_cache: bool = setting(True)
    autotune_cache_dir: str = setting("")
    executable_cache: bool = setting(True)
    executable_cache_max_bytes: int = setting(10 * GIB, check=between(0, lo_open=True))
    warmup: bool = setting(True)
    shared_host_weights: bool = setting(False)
    shared_host_weights_mode: str = setting(
        "660", check=check_octal_mode, structure=_structure_octal_mode
    )
    page_locked_weights: bool = setting(True)
    """Keep private host floors in page-locked memory where the backend has it (GPU), so an
    on-demand load is one DMA (beyond, 03); shared floors stay pageable."""
    cpu_arena_bytes: int = setting(0, check=between(0))
    """CPU backend only, for benchmarks and tests (0: off): weights loaded onto the "device"
    are real copies into an arena of this many bytes instead of aliases of host memory, so a
    load costs a memory copy, an eviction frees it, and the arena's limit is the device memory
    the weight budget is solved from."""
    cpu_arena_bandwidth_bytes_per_s: float = setting(0.0, check=between(0))
    """With ``cpu_arena_bytes``: the slowest a load may go (bytes/s; 0: as fast as the copy),
    to emulate a host-to-device link such as PCIe (a 25 GB/s cap is 25e9)."""

    @property
    def shared_host_weights_mode_bits(self) -> int:
        """``shared_host_weights_mode`` as permission bits for ``os.open``/``os.chmod``."""
        return int(self.shared_host_weights_mode, 8)


@attrs.frozen
class ModelSchedulingConfig:
    """``scheduler.models.<m>``: one model's fair-share weight, residency, batch cap and
    queue delay (unset: the global ``scheduler.max_queue_delay_microseconds``)."""

    weight: float = setting(1.0, check=between(0, lo_open=True))
    residency: Residency | None = None
    max_batch_size: int | None = setting(None, check=between(1))
    max_queue_delay_microseconds: int | None = setting(None, check=between(0, 1_000_000))


def _models(value: Mapping[str, ModelSchedulingConfig]) -> Mapping[str, ModelSchedulingConfig]:
    return dict(value)


@attrs.frozen
class SchedulerConfig:
    """``scheduler.*``: discipline, cost model and queue bounds (04)."""

    discipline: SchedulingDiscipline = SchedulingDiscipline.FAIR
    ema_halflife_seconds: float = setting(30.0, check=between(0, lo_open=True))
    recency_penalty_cap: float = setting(0.25, check=between(0, 1, lo_open=True))
    coalescing_discount: float = setting(0.1, check=between(0, 1, hi_open=True))
    cost_ema_alpha: float = setting(0.2, check=between(0, 1, lo_open=True))
    max_queue_depth: int = setting(1024, check=between(0, lo_open=True))
    compaction_interval: int = setting(0, check=between(0))
    default_priority: int = setting(1, check=between(1))
    pad_up_when_cheaper: bool = setting(True)
    max_queue_delay_microseconds: int | None = setting(None, check=between(0, 1_000_000))
    """How long a coalescable model's oldest request may wait for more rows while the device
    is idle (beyond, 04); 0 never waits. Unset: an adaptive wait, only while requests keep
    arriving and at most 2 ms (the worker's scheduler decides from arrival gaps and costs)."""
    prefetch_weights: bool = setting(True)
    """Load the next queued model's weights while another model executes, where the backend
    copies asynchronously (GPU) and the budget has room without evicting queued models
    (beyond, 03)."""
    # Read-only by type; excluded from the hash because a dict is not hashable.
    models: Mapping[str, ModelSchedulingConfig] = attrs.field(
        factory=dict, converter=_models, hash=False
    )

    def for_model(self, name: str) -> ModelSchedulingConfig:
        """The scheduling settings of ``name`` (the defaults when it has no entry)."""
        return self.models.get(name, _DEFAULT_MODEL_SCHEDULING)

    def queue_delay_us(self, name: str) -> int | None:
        """``name``'s queue delay in microseconds: its own setting, else the global one
        (None: adaptive)."""
        own = self.for_model(name).max_queue_delay_microseconds
        return self.max_queue_delay_microseconds if own is None else own


_DEFAULT_MODEL_SCHEDULING: Final = ModelSchedulingConfig()


@attrs.frozen
class MetaConfig:
    """``meta.*``: meta-model concurrency and the scratch pool (07)."""

    concurrency: int = setting(2, check=between(1))
    scratch_bytes: int = setting(1 * GIB)
    scratch_slots: int = setting(16, check=between(1))
    expose_sub_models: bool = setting(False)


@attrs.frozen
class TlsConfig:
    """``endpoints.tls.*``: cert + key enable TLS on gRPC; a client CA makes it mutual."""

    cert_file: str = setting("")
    key_file: str = setting("")
    client_ca_file: str = setting("")

    @property
    def enabled(self) -> bool:
        """Whether the gRPC port serves TLS."""
        return bool(self.cert_file and self.key_file)

    @property
    def mutual(self) -> bool:
        """Whether clients must present certificates signed by ``client_ca_file``."""
        return self.enabled and bool(self.client_ca_file)


@attrs.frozen
class EndpointsConfig:
    """``endpoints.*``: listen addresses, the in-flight cap and optional services."""

    host: str = setting("127.0.0.1", check=non_empty)
    port: int = setting(8080, check=between(1, MAX_PORT))
    metrics_port: int = setting(0, check=between(0, MAX_PORT))
    max_concurrent_requests: int = setting(64, check=between(0))
    control_service: bool = setting(True)
    reflection: bool = setting(True)
    lane: bool = setting(True)
    """Serve the forwarding lane (a Unix socket for a gateway on this host; off with TLS)."""
    front_threads: int = setting(1, check=between(1, 64))
    """Threads of the native front's HTTP/2 runtime (HTTP/2, TLS; the gRPC handlers run on
    the event loop whatever this is)."""
    tls: TlsConfig = TlsConfig()


@attrs.frozen
class GrpcConfig:
    """``grpc.*``: message limits and keepalive of the gRPC server (05 §Transport)."""

    max_recv_msg_bytes: int = setting(
        536870912, check=between(0, MAX_GRPC_MESSAGE_BYTES, lo_open=True)
    )
    """The largest message the server accepts, in bytes."""
    max_send_msg_bytes: int = setting(
        536870912, check=between(0, MAX_GRPC_MESSAGE_BYTES, lo_open=True)
    )
    """The largest message the server sends, in bytes."""
    # The native front answers clients' keepalive pings and keeps idle connections open; it
    # sends no pings of its own and closes no connection for its age, so these four load
    # (existing configurations keep working) but are not enforced.
    keepalive_time_seconds: float = setting(60.0, check=between(0))
    """Accepted for compatibility; not enforced (the server sends no keepalive pings)."""
    keepalive_timeout_seconds: float = setting(20.0, check=between(0, lo_open=True))
    """Accepted for compatibility; not enforced (the server sends no keepalive pings)."""
    min_client_ping_interval_seconds: float = setting(10.0, check=between(0))
    """Accepted for compatibility; not enforced (clients' pings are always answered)."""
    max_connection_age_seconds: float = setting(0.0, check=between(0))
    """Accepted for compatibility; not enforced (no connection is closed for its age)."""


@attrs.frozen
class LoggingConfig:
    """``logging.*``: level and line format (12 §Logs)."""

    level: LogLevel = LogLevel.INFO
    format: LogFormat = LogFormat.TEXT


@attrs.frozen
class EnvOverride:
    """One environment variable applied over the file: ``variable`` set ``path`` to ``value``."""

    variable: str
    path: str
    value: object


def _paths(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen
class WorkerConfig:
    """The validated configuration of one worker process (02 §Worker keys).

    File keys come first. ``worker_name``, ``hook_threads`` and ``env_overrides`` are not file
    keys: the loader fills them from the command line and the environment.

    Built by :func:`reactantserver.core.config.load_worker_config` (or
    ``worker_config_from_mapping``), which also resolves ``cache_dir`` and
    ``runtime.autotune_cache_dir`` to concrete paths (02: ``""`` means the default location).
    """

    cache_dir: str = setting("")
    model_dirs: tuple[str, ...] = attrs.field(default=(), converter=_paths)
    models_include: tuple[str, ...] = attrs.field(default=(), converter=_paths)
    model_control_mode: ModelControlMode = ModelControlMode.DYNAMIC
    model_poll_seconds: float = setting(15.0, check=between(0))
    shutdown_grace_seconds: float = setting(10.0, check=between(0))
    runtime: RuntimeConfig = RuntimeConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    meta: MetaConfig = MetaConfig()
    endpoints: EndpointsConfig = EndpointsConfig()
    grpc: GrpcConfig = GrpcConfig()
    logging: LoggingConfig = LoggingConfig()
    #: The node-file entry this worker serves (``None`` standalone or embedded).
    worker_name: str | None = env_only(None)
    #: ``REACTANT_WORKER_THREADS``: hook-pool size; ``None`` = ``min(cpu_count, 16)``.
    hook_threads: int | None = env_only(None)
    #: The environment overrides applied, in order (not part of equality).
    env_overrides: tuple[EnvOverride, ...] = env_only((), eq=False)

    def hook_pool_size(self, cpu_count: int) -> int:
        """Threads of the hook pool: ``hook_threads``, else ``min(cpu_count, 16)`` (04)."""
        if self.hook_threads is not None:
            return self.hook_threads
        return max(1, min(cpu_count, HOOK_THREADS_CAP))
