"""Frozen attrs classes of the worker configuration.

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
from reactantserver.core.config._tracing import TracingConfig

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
    """``runtime.numerics``: matmul precision policy."""

    AUTO = "auto"
    F32 = "f32"
    TF32 = "tf32"


class ModelControlMode(Choice):
    """``model_control_mode``: who changes the model set and residency."""

    DYNAMIC = "dynamic"
    STATIC = "static"
    EXPLICIT = "explicit"


class SchedulingDiscipline(Choice):
    """``scheduler.discipline``: how the dispatch thread picks the next batch."""

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
    """``logging.format``: human text or one JSON object per line."""

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
    """Device platform the worker runs models on: ``cpu`` or ``cuda`` (``gpu`` is accepted as
    an alias of ``cuda``)."""
    device_ordinal: int = setting(0, check=between(0))
    """Index of the device this worker uses among those it can see. Under a node supervisor it
    is always 0, since each worker is shown exactly one device."""
    mem_fraction: float = setting(0.9, check=between(0, 1, lo_open=True))
    """Share of the GPU's memory the device allocator claims as its arena, in (0, 1]; the
    weight budget is solved from that arena. Workers of a node that share one GPU split the
    default evenly, and their fractions may not add up to more than 1. Unused on the CPU."""
    preallocate: bool = setting(True)
    """Claim the whole ``mem_fraction`` arena when the worker starts instead of growing it on
    demand (GPU only)."""
    allow_cpu_fallback: bool = setting(True)
    """When the CUDA backend cannot start (no device, no driver), run on the CPU with a
    warning instead of failing start-up."""
    numerics: Numerics = Numerics.AUTO
    """Float32 matmul precision: ``auto`` leaves the backend's default, ``f32`` forces full
    float32 (TF32 off), ``tf32`` allows TF32 and needs backend ``cuda``. Part of the key of
    cached executables."""
    weight_cache_fraction: float = setting(1.0, check=between(0, 1))
    """The largest share of the device arena that model weights may use, in [0, 1]; 0 turns
    the on-demand weight cache off (unless ``weight_cache_max_bytes`` is set)."""
    weight_cache_wiggle_fraction: float = setting(0.1, check=between(0, 1, hi_open=True))
    """Share of the device arena always left free as slack when the weight budget is solved,
    in [0, 1)."""
    weight_cache_max_bytes: int = setting(0, check=between(0))
    """A fixed weight budget in bytes that replaces the fraction-based one and turns the
    on-demand cache on even on the CPU backend; 0 solves the budget from the arena."""
    autotune: bool = setting(True)
    """Let XLA autotune GPU kernels while compiling; off compiles faster with possibly slower
    kernels (autotune level 0). No effect on the CPU backend."""
    autotune_cache: bool = setting(True)
    """Keep XLA's per-fusion autotune results on disk in ``autotune_cache_dir``, so later
    compiles skip the measurements (GPU only)."""
    autotune_cache_dir: str = setting("")
    """Folder of the autotune cache; empty means ``<cache_dir>/xla-autotune``. A leading
    ``~/`` is expanded."""
    executable_cache: bool = setting(True)
    """Store compiled executables under ``<cache_dir>/executables`` and reuse them on later
    starts, skipping recompilation. The folder must belong to the worker's user and not be
    group- or world-writable, else the cache is turned off with a warning."""
    executable_cache_max_bytes: int = setting(10 * GIB, check=between(0, lo_open=True))
    """Size cap of the executable cache on disk, in bytes (> 0); the least recently used
    entries are deleted when it is exceeded."""
    warmup: bool = setting(True)
    """Run every compiled batch size once on zeros when a model loads, before it turns
    ready, so its first requests do not pay for the first run. Off skips it; the start-up probe
    that measures execution memory still runs the models it covers."""
    shared_host_weights: bool = setting(False)
    """Share one host copy of each model's weights between the workers of a node, in
    ``/dev/shm``, instead of one private copy per worker. Needs a ``/dev/shm`` common to the
    workers and large enough for the weights."""
    shared_host_weights_mode: str = setting(
        "660", check=check_octal_mode, structure=_structure_octal_mode
    )
    """Permission bits of the shared weight regions and their lock files, as a quoted octal
    string (at most ``"777"``), applied whatever the umask. A world-writable mode such as
    ``"666"`` is accepted with a warning."""
    page_locked_weights: bool = setting(True)
    """Keep private host copies of weights in page-locked memory where the backend has it
    (GPU), so an on-demand load is one DMA; shared copies stay pageable."""
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
    """The model's fair-share weight (> 0): under the ``fair`` discipline its share of device
    time is this weight over the sum of the loaded models' weights. Changed at run time with
    ``WorkerControl.SetModelPolicy``."""
    residency: Residency | None = None
    """Where the model's weights are kept between executions: ``unpinned`` (read from the
    bundle on each load), ``system`` (a host copy kept) or ``device`` (on the device, never
    evicted). Unset: ``system`` when the on-demand weight cache is on, else ``unpinned``."""
    max_batch_size: int | None = setting(None, check=between(1))
    """The most rows one execution of this model may take when requests are coalesced (>= 1);
    unset, or larger than the largest compiled batch size: that size."""
    max_queue_delay_microseconds: int | None = setting(None, check=between(0, 1_000_000))
    """This model's fixed wait for more rows, in microseconds (0 to 1,000,000; 0 never
    waits); unset: the global ``scheduler.max_queue_delay_microseconds``."""


def _models(value: Mapping[str, ModelSchedulingConfig]) -> Mapping[str, ModelSchedulingConfig]:
    return dict(value)


@attrs.frozen
class SchedulerConfig:
    """``scheduler.*``: discipline, cost model and queue bounds."""

    discipline: SchedulingDiscipline = SchedulingDiscipline.FAIR
    """How the dispatch thread picks the next model to run: ``fair`` (by configured share
    against recent use), ``fifo`` (oldest queued request) or ``edf`` (earliest deadline). A
    gateway in ``lpt_packing`` mode needs ``fifo`` or ``edf``."""
    ema_halflife_seconds: float = setting(30.0, check=between(0, lo_open=True))
    """Half-life in seconds of the decaying average of each model's recent device time, which
    ``fair`` compares with its configured share (> 0)."""
    recency_penalty_cap: float = setting(0.25, check=between(0, 1, lo_open=True))
    """Under ``fair``, the most a model's recent share may count above or below its configured
    share, in (0, 1]; it bounds how far one model can be favoured or held back."""
    coalescing_discount: float = setting(0.1, check=between(0, 1, hi_open=True))
    """Under ``fair``, the fraction taken off a batch's learned cost when it merges two or more
    requests, in [0, 1); it favours models whose queued requests batch well."""
    cost_ema_alpha: float = setting(0.2, check=between(0, 1, lo_open=True))
    """Weight of each new measurement in the learned execution cost of a (model, batch size),
    in (0, 1]; 1 keeps only the latest measurement."""
    max_queue_depth: int = setting(1024, check=between(0, lo_open=True))
    """The most requests one model may have queued (> 0); a request beyond it is refused at
    once with ``RESOURCE_EXHAUSTED``."""
    compaction_interval: int = setting(0, check=between(0))
    """Compact device memory after this many on-demand weight loads: free every on-demand
    weight so the allocator can merge free blocks, then reload what is needed. 0: only when
    ``WorkerControl.CompactMemory`` asks."""
    default_priority: int = setting(1, check=between(1))
    """Priority level of a request that sends none (or 0) in its ``priority`` parameter
    (>= 1; lower is more urgent, so the default 1 is the most urgent level)."""
    pad_up_when_cheaper: bool = setting(True)
    """When coalescing, move to a larger compiled batch size that takes more queued requests
    if its learned cost serves more rows per second; applies once every candidate size has
    been measured."""
    max_queue_delay_microseconds: int | None = setting(None, check=between(0, 1_000_000))
    """How long, in microseconds (0 to 1,000,000), a coalescing model's oldest request may wait
    for more rows while the device is idle; 0 never waits. Unset: an adaptive wait, only while
    requests keep arriving, for at most 2 ms or a quarter of the batch's learned cost,
    whichever is longer."""
    prefetch_weights: bool = setting(True)
    """Load the weights of the model expected next while another model executes, where the
    backend copies asynchronously (GPU) and idle models alone can make room; never in
    ``explicit`` mode."""
    # Read-only by type; excluded from the hash because a dict is not hashable.
    models: Mapping[str, ModelSchedulingConfig] = attrs.field(
        factory=dict, converter=_models, hash=False
    )
    """Per-model settings by model name (the keys below); a model without an entry gets the
    defaults. Has no environment variables."""

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
    """``meta.*``: meta-model concurrency and the scratch pool."""

    concurrency: int = setting(2, check=between(1))
    """The most meta models that call sub-models running at once (>= 1); more wait on the
    event loop in arrival order, bounded by their deadlines. Metas without calls are not
    counted."""
    scratch_bytes: int = setting(1 * GIB)
    """Size in bytes of the pool that hands reusable host buffers to meta models
    (``call.scratch``); 0 or less: no pool. Pages are committed only when written."""
    scratch_slots: int = setting(16, check=between(1))
    """Number of equal slots the scratch pool is cut into (>= 1); one buffer request takes
    one or more adjacent slots."""
    expose_sub_models: bool = setting(False)
    """List and serve the sub-models of meta models to clients like any other model; off
    they are hidden behind their meta."""


@attrs.frozen
class TlsConfig:
    """``endpoints.tls.*``: cert + key enable TLS on gRPC; a client CA makes it mutual."""

    cert_file: str = setting("")
    """Path of the PEM certificate (chain) the gRPC port presents; with ``key_file`` it turns
    TLS on. Empty: plain gRPC. The HTTP port stays plain HTTP either way."""
    key_file: str = setting("")
    """Path of the PEM private key of ``cert_file``; set both or neither."""
    client_ca_file: str = setting("")
    """Path of a PEM CA bundle: clients must then present a certificate this CA signed
    (mutual TLS). Needs ``cert_file`` and ``key_file``; empty asks for no client certificate."""

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
    """Address the gRPC and HTTP ports bind to. Under a node, workers behind the embedded
    gateway bind 127.0.0.1 and a sole worker takes the host of ``listen.grpc``."""
    port: int = setting(8080, check=between(1, MAX_PORT))
    """The gRPC port (1 to 65535). In a node file it is set from ``base_port`` or the worker
    entry's ``port``; a standalone worker (``--model-repository``) uses 8001."""
    http_port: int = setting(0, check=between(0, MAX_PORT))
    """The KServe REST port: inference, metadata, health (``/v2/health/*``, ``/healthz``,
    ``/readyz``), the repository, shared-memory, logging and trace extensions. It serves
    neither ``/metrics`` nor the status page, so it can be exposed to clients alone. 0 (or
    ``metrics_port``): REST shares the metrics port, one HTTP listener for everything. A
    standalone worker and a node's sole worker use 8000 (``listen.http``)."""
    metrics_port: int = setting(0, check=between(0, MAX_PORT))
    """The metrics port: ``/metrics``, the status page (``/``, ``/status``) and the probes
    ``/healthz`` and ``/readyz`` (plus REST when ``http_port`` is 0); different from
    ``port``; 0 turns it off. In a node file it is set from ``metrics_base_port`` or the
    entry's ``metrics_port``; a standalone worker uses 8002."""
    max_concurrent_requests: int = setting(64, check=between(0))
    """The most inference calls (and stream messages) in flight at once on this worker; one
    more is refused with ``RESOURCE_EXHAUSTED`` before it is read. 0: no cap. Health, metadata
    and control calls do not count."""
    control_service: bool = setting(True)
    """Serve ``WorkerControl`` (residency, live policy, ``CompactMemory``) on the gRPC port;
    off, its calls answer ``UNIMPLEMENTED``. The gateway's ``lpt_packing`` and ``model_aware``
    modes need it."""
    reflection: bool = setting(True)
    """Serve gRPC server reflection, so tools such as ``grpcurl`` can list the services."""
    lane: bool = setting(True)
    """Serve the forwarding lane, a private Unix socket through which a gateway on the same
    host forwards inference calls. Never opened when TLS is configured."""
    front_threads: int = setting(1, check=between(1, 64))
    """Threads of the native front's HTTP/2 runtime, which does framing and TLS (1 to 64);
    the gRPC handlers run on the event loop whatever this is."""
    tls: TlsConfig = TlsConfig()


@attrs.frozen
class GrpcConfig:
    """``grpc.*``: message limits and keepalive of the gRPC server."""

    max_recv_msg_bytes: int = setting(
        536870912, check=between(0, MAX_GRPC_MESSAGE_BYTES, lo_open=True)
    )
    """Largest gRPC message the server accepts, in bytes (> 0); a larger one is refused with
    ``RESOURCE_EXHAUSTED`` before it is parsed. Also caps HTTP request bodies."""
    max_send_msg_bytes: int = setting(
        536870912, check=between(0, MAX_GRPC_MESSAGE_BYTES, lo_open=True)
    )
    """Largest gRPC message the server sends, in bytes (> 0)."""
    # The native front answers clients' keepalive pings and keeps idle connections open; it
    # sends no pings of its own and closes no connection for its age, so these four load
    # (existing configurations keep working) but are not enforced.
    keepalive_time_seconds: float = setting(60.0, check=between(0))
    """Accepted for compatibility, not enforced: the server sends no keepalive pings of its
    own (it answers clients' pings). Seconds, >= 0."""
    keepalive_timeout_seconds: float = setting(20.0, check=between(0, lo_open=True))
    """Accepted for compatibility, not enforced (no server pings are sent to time out).
    Seconds, > 0."""
    min_client_ping_interval_seconds: float = setting(10.0, check=between(0))
    """Accepted for compatibility, not enforced: the server applies no minimum interval to
    clients' pings. Seconds, >= 0."""
    max_connection_age_seconds: float = setting(0.0, check=between(0))
    """Accepted for compatibility, not enforced: no connection is closed for its age.
    Seconds, >= 0."""


@attrs.frozen
class LoggingConfig:
    """``logging.*``: level and line format."""

    level: LogLevel = LogLevel.INFO
    """Lowest level of the log records written to stderr: ``debug``, ``info``, ``warning``
    or ``error``. Triton's ``LogSettings`` can change it while the process runs."""
    format: LogFormat = LogFormat.TEXT
    """``text`` (time, level, logger, message) or ``json`` (one object per line, for log
    collectors). Triton's ``LogSettings`` can change it while the process runs."""


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
    """The validated configuration of one worker process.

    File keys come first. ``worker_name``, ``hook_threads`` and ``env_overrides`` are not file
    keys: the loader fills them from the command line and the environment.

    Built by :func:`reactantserver.core.config.load_worker_config` (or
    ``worker_config_from_mapping``), which also resolves ``cache_dir`` and
    ``runtime.autotune_cache_dir`` to concrete paths (``""`` means the default location).
    """

    cache_dir: str = setting("")
    """Root of the persistent caches (compiled executables, autotune results). Empty:
    ``$REACTANTSERVER_CACHE_DIR``, else ``$XDG_CACHE_HOME/reactantserver``, else
    ``~/.cache/reactantserver``. Keep it writable only by the server's user."""
    model_dirs: tuple[str, ...] = attrs.field(default=(), converter=_paths)
    """Model repository folders, each holding one bundle directory per model; each must
    exist at start-up. In a node file it is set from ``model_repo``. The variable takes a
    colon-separated list."""
    models_include: tuple[str, ...] = attrs.field(default=(), converter=_paths)
    """Names of the only models to serve from ``model_dirs``; empty serves them all. A name
    no folder holds is logged as a warning."""
    model_control_mode: ModelControlMode = ModelControlMode.DYNAMIC
    """Who changes the model set: ``dynamic`` (the worker follows changes in ``model_dirs``),
    ``static`` (read once at start-up) or ``explicit`` (load and unload calls; the control
    plane also decides which models are on the device)."""
    model_poll_seconds: float = setting(15.0, check=between(0))
    """In ``dynamic`` mode, seconds between scans of ``model_dirs``; a change is acted on once
    two scans in a row agree. Must be > 0 in ``dynamic`` mode; unused in the others."""
    shutdown_grace_seconds: float = setting(10.0, check=between(0))
    """On SIGTERM, how long the worker keeps running queued requests, in seconds, before it
    fails what is left with ``UNAVAILABLE``; new requests are refused meanwhile."""
    runtime: RuntimeConfig = RuntimeConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    meta: MetaConfig = MetaConfig()
    endpoints: EndpointsConfig = EndpointsConfig()
    grpc: GrpcConfig = GrpcConfig()
    logging: LoggingConfig = LoggingConfig()
    tracing: TracingConfig = attrs.field(factory=TracingConfig)
    #: The node-file entry this worker serves (``None`` standalone or embedded).
    worker_name: str | None = env_only(None)
    #: ``REACTANTSERVER_WORKER_THREADS``: hook-pool size; ``None`` = ``min(cpu_count, 16)``.
    hook_threads: int | None = env_only(None)
    #: The environment overrides applied, in order (not part of equality).
    env_overrides: tuple[EnvOverride, ...] = env_only((), eq=False)

    def hook_pool_size(self, cpu_count: int) -> int:
        """Threads of the hook pool: ``hook_threads``, else ``min(cpu_count, 16)``."""
        if self.hook_threads is not None:
            return self.hook_threads
        return max(1, min(cpu_count, HOOK_THREADS_CAP))
