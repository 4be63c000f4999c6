"""The node file, typed and validated.

Worker-key blocks (``global`` and each worker entry) are kept as written and key-checked here;
turning them into one :class:`WorkerConfig` per worker is ``_config_resolve``'s job. The
supervisor keys are parsed into typed values, but their environment variables and command-line
flags (``REACTANTSERVER_NODE_GPUS``, ``--role``, ...) are the supervisor's to apply, since
flags come first.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

import attrs

from reactantserver.core.config._fields import (
    FILE_KEY,
    HAND_PARSED_KEY,
    MAX_PORT,
    Choice,
    between,
    non_empty,
    required_setting,
    setting,
)
from reactantserver.core.config._keys import check_keys, file_fields, removed_hint
from reactantserver.core.config._schema import WorkerConfig
from reactantserver.core.config._structure import (
    KeyPath,
    Origin,
    Problem,
    describe,
    make_converter,
    raise_problems,
    structure,
)

__all__ = [
    "AUTO_GPUS",
    "SYNTHESIZED_WORKER_PREFIX",
    "GpuSpec",
    "ListenConfig",
    "NodeConfig",
    "Role",
    "SupervisorConfig",
    "WorkerEntry",
    "check_address",
    "check_worker_name",
    "node_config_from_mapping",
    "node_problems",
    "worker_ports",
]

logger = logging.getLogger("reactantserver.core.config")

AUTO_GPUS: Final = "auto"
#: Synthesized workers are ``worker0 … worker{N-1}``.
SYNTHESIZED_WORKER_PREFIX: Final = "worker"
_SYNTHESIZED_NAME: Final = re.compile(rf"{SYNTHESIZED_WORKER_PREFIX}(0|[1-9][0-9]*)")
_WORKER_NAME: Final = re.compile(r"[A-Za-z0-9_-]+")
#: Keys of a worker entry that are not worker keys.
_ENTRY_KEYS: Final = ("name", "gpu", "port", "metrics_port")
#: Gateway keys the supervisor fills in.
_SUPERVISOR_FILLED_GATEWAY_KEYS: Final = (
    "listen",
    "endpoints",
    "metrics_endpoints",
    "worker_names",
)
#: Worker keys that node resolution sets, whatever ``global`` or an entry says.
_NODE_DERIVED: Final = {
    ("model_dirs",): "model_repo",
    ("endpoints", "port"): "base_port or the entry's port",
    ("endpoints", "metrics_port"): "metrics_base_port or the entry's metrics_port",
    ("endpoints", "http_port"): "listen.http (a sole worker; workers behind the gateway "
    "serve REST on their metrics port)",
    ("runtime", "device_ordinal"): "the supervisor (always 0: one visible device per worker)",
}

#: ``gpus``: ``"auto"``, a device count, or explicit selectors (ordinals or UUIDs, as strings).
GpuSpec: TypeAlias = Literal["auto"] | int | tuple[str, ...]


def _one_or_more(value: object) -> object:
    # One repository may be written as a plain string (an empty one is no repository).
    if isinstance(value, str):
        return [value] if value else []
    return value


def _repositories(value: str | Iterable[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def check_worker_name(value: Any) -> str | None:
    """Rule of worker names: ``[A-Za-z0-9_-]+``."""
    if isinstance(value, str) and _WORKER_NAME.fullmatch(value):
        return None
    return "must match [A-Za-z0-9_-]+"


def check_address(value: Any) -> str | None:
    """Rule of ``listen.*``: ``host:port`` (IPv6 hosts in brackets)."""
    host, _, port = str(value).rpartition(":")
    if host and port.isdigit() and 1 <= int(port) <= MAX_PORT:
        return None
    return f'must be "host:port" with a port in [1, {MAX_PORT}]'


class Role(Choice):
    """``role``: what a supervisor runs."""

    ALL = "all"
    WORKERS = "workers"
    GATEWAY = "gateway"


@attrs.frozen
class ListenConfig:
    """``listen.*``: the public addresses of the node, Triton's three ports by default."""

    http: str = setting("0.0.0.0:8000", check=check_address)
    """Public KServe REST address of the node (inference, metadata, ``/v2/health/*``, the
    repository and shared-memory extensions), ``host:port`` (IPv6 hosts in brackets). Set it
    equal to ``metrics`` to serve REST, metrics and the status page on one port. Unused with
    role ``workers``."""
    grpc: str = setting("0.0.0.0:8001", check=check_address)
    """Public gRPC address of the node, ``host:port``, served by the embedded gateway or, on a
    node with one worker, by that worker. Unused with role ``workers``."""
    metrics: str = setting("0.0.0.0:8002", check=check_address)
    """Public metrics address of the node (``/metrics``, the status page, ``/healthz`` and
    ``/readyz``), ``host:port``; the ``healthcheck`` command reads ``/readyz`` there. A sole
    worker binds the host of ``grpc`` for all three ports."""


@attrs.frozen
class SupervisorConfig:
    """``supervisor.*``: restart policy, grace periods and liveness probing."""

    max_restarts: int = setting(0, check=between(0))
    """How many times in a row one child may crash and be restarted; one more crash shuts the
    whole node down with exit code 1. 0: restart forever."""
    stable_uptime_seconds: float = setting(60.0, check=between(0, lo_open=True))
    """A child that ran at least this many seconds before it exited has its count of
    consecutive crashes reset (> 0)."""
    max_backoff_seconds: float = setting(30.0, check=between(0, lo_open=True))
    """Cap on the wait before a restart, in seconds (> 0); the wait doubles from 1 s with
    each consecutive crash."""
    worker_grace_seconds: float = setting(15.0, check=between(0))
    """Seconds a worker has to exit after SIGTERM (to drain its queues) before it is sent
    SIGKILL."""
    gateway_grace_seconds: float = setting(10.0, check=between(0))
    """Seconds the gateway has to exit after SIGTERM before it is sent SIGKILL."""
    liveness_interval_seconds: float = setting(10.0, check=between(0))
    """Seconds between probes of each child's ``/healthz`` on its HTTP port; 0 turns the
    probes off. Probing counts only after the child has answered once."""
    liveness_failures: int = setting(3, check=between(1))
    """Failed liveness probes in a row after which a child is stopped and restarted, as if it
    had crashed (>= 1)."""


def _hand_parsed(*, factory: Any, key: str | None = None) -> Any:
    metadata: dict[str, object] = {HAND_PARSED_KEY: True}
    if key is not None:
        metadata[FILE_KEY] = key
    return attrs.field(factory=factory, hash=False, metadata=metadata)


@attrs.frozen
class WorkerEntry:
    """One ``workers:`` entry: its name, device index, ports, and worker keys as written."""

    name: str = required_setting(check_worker_name)
    """The worker's name, unique in the file and made of ``[A-Za-z0-9_-]``: its log prefix,
    its label in metrics, and what ``models`` and ``--worker`` refer to. Required."""
    gpu: int | None = setting(None, check=between(0))
    """Index into the node's detected devices of the one this worker sees. Unset: the
    entry's position in ``workers``. Workers share a device only when each names it here."""
    port: int | None = setting(None, check=between(1, MAX_PORT))
    """This worker's gRPC port; unset: ``base_port`` plus the entry's position."""
    metrics_port: int | None = setting(None, check=between(0, MAX_PORT))
    """This worker's HTTP port (0: off); unset: ``metrics_base_port`` plus the entry's
    position."""
    settings: Mapping[str, Any] = _hand_parsed(factory=dict, key="<worker key>")
    """The entry's other keys: worker keys for this worker only, merged over ``global``."""


@attrs.frozen
class NodeConfig:
    """A parsed node file.

    ``workers`` is ``None`` when the file has no ``workers:`` list (the supervisor synthesizes
    them, see ``synthesize_workers``). ``global_settings`` is the ``global:`` block.
    """

    model_repo: tuple[str, ...] = setting(
        check=non_empty, each=non_empty, structure=_one_or_more, converter=_repositories
    )
    """The model repository every worker serves (each worker's ``model_dirs``): one bundle
    directory per model; a list serves several (a model name must be in one only).
    Required."""
    base_port: int = setting(8080, check=between(1, MAX_PORT))
    """gRPC port of the first worker; worker i (in ``workers`` order) gets ``base_port + i``
    unless its entry sets ``port``."""
    metrics_base_port: int | None = setting(9100, check=between(1, MAX_PORT))
    """HTTP port of the first worker; worker i gets ``metrics_base_port + i`` unless its
    entry sets ``metrics_port``. ``null``: workers have no HTTP port (a sole worker still
    serves ``listen.metrics``)."""
    global_settings: Mapping[str, Any] = _hand_parsed(factory=dict, key="global")
    """The ``global:`` block: worker keys applied to every worker; a worker entry's own keys
    win. Ports, ``model_dirs`` and ``runtime.device_ordinal`` are set by the node and ignored
    here."""
    workers: tuple[WorkerEntry, ...] | None = attrs.field(
        default=None, metadata={HAND_PARSED_KEY: True}
    )
    """The workers, each a ``name`` plus optional ``gpu``, ``port``, ``metrics_port`` and
    worker keys. Omitted: one worker per detected device (``worker0``, ``worker1``, ...), or
    ``cpu_workers`` on a CPU node."""
    models: Mapping[str, tuple[str, ...]] = _hand_parsed(factory=dict)
    """Model name to the workers that keep it on the device: there its residency becomes
    ``device`` unless set otherwise. It does not restrict where a model is loaded."""
    shared_host_weights: bool | None = setting(None)
    """Default of every worker's ``runtime.shared_host_weights`` where neither ``global``
    nor the entry sets it; unset leaves the workers' own default."""
    gpus: GpuSpec = attrs.field(default=AUTO_GPUS, metadata={HAND_PARSED_KEY: True})
    """Devices the node uses: ``auto`` (``CUDA_VISIBLE_DEVICES``, else every device NVML
    finds; a CPU node runs ``cpu_workers``), a count N (devices 0 to N-1; on a CPU node, N CPU
    workers), or a list of ordinals or UUIDs. ``REACTANTSERVER_NODE_GPUS`` and ``--gpus``
    override it."""
    cpu_workers: int = setting(1, check=between(1))
    """Number of workers synthesized on a CPU node when ``gpus`` is ``auto``, or on a CUDA
    node that finds no device and falls back to the CPU (>= 1). Unused with a ``workers``
    list."""
    role: Role = Role.ALL
    """What this supervisor runs: ``all`` (the workers, plus the gateway when there are two
    or more), ``workers`` (only the workers, on their own ports) or ``gateway`` (only the
    gateway). ``REACTANTSERVER_NODE_ROLE`` and ``--role`` override it."""
    listen: ListenConfig = ListenConfig()
    gateway: Mapping[str, Any] = _hand_parsed(factory=dict)
    """Settings of the embedded gateway, as in a gateway file, without ``listen``,
    ``endpoints``, ``metrics_endpoints`` and ``worker_names``, which the supervisor fills
    in."""
    supervisor: SupervisorConfig = SupervisorConfig()
    #: The file it was read from (for messages); not part of equality.
    source: Path | None = attrs.field(
        default=None, eq=False, metadata={HAND_PARSED_KEY: True, FILE_KEY: None}
    )


_CONVERTER: Final = make_converter([ListenConfig, SupervisorConfig, WorkerEntry, NodeConfig])
_HAND_PARSED_KEYS: Final = ("global", "workers", "models", "gpus", "gateway")
_NODE_KEYS: Final = frozenset(
    [f.name for f in attrs.fields(NodeConfig) if not f.metadata.get(HAND_PARSED_KEY)]
    + list(_HAND_PARSED_KEYS)
)


def _check_top_keys(data: Mapping[Any, Any]) -> list[Problem]:
    problems = []
    worker_keys = file_fields(WorkerConfig)
    for key in data:
        if key in _NODE_KEYS:
            continue
        hint = removed_hint((key,)) if isinstance(key, str) else None
        if hint is not None:
            message = f"removed key; {hint}"
        elif key in worker_keys:
            message = "worker key at the top level; put it under global: or a worker entry"
        else:
            close = difflib.get_close_matches(str(key), sorted(_NODE_KEYS), n=1)
            message = "unknown key" + (f" (did you mean {close[0]}?)" if close else "")
        problems.append(Problem((str(key),), message))
    return problems


def _block(value: object, path: KeyPath, problems: list[Problem]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return value
    problems.append(Problem(path, f"expected a mapping, got {describe(value)}"))
    return {}


def _parse_workers(value: object, problems: list[Problem]) -> tuple[WorkerEntry, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value:
        problems.append(
            Problem(
                ("workers",),
                f"expected a non-empty list, got {describe(value)}; "
                "omit the key to have the supervisor synthesize workers",
            )
        )
        return None
    entries: list[WorkerEntry] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(value):
        path: KeyPath = ("workers", index)
        if not isinstance(item, Mapping):
            problems.append(Problem(path, f"expected a mapping, got {describe(item)}"))
            continue
        own = {k: v for k, v in item.items() if k in _ENTRY_KEYS}
        entry, entry_problems = structure(_CONVERTER, own, WorkerEntry, path)
        problems += entry_problems
        settings = {k: v for k, v in item.items() if k not in _ENTRY_KEYS}
        problems += check_keys(settings, Origin(prefix=f"workers[{index}]"))
        if entry is None:
            continue
        if entry.name in seen:
            problems.append(
                Problem((*path, "name"), f"duplicate name (also workers[{seen[entry.name]}])")
            )
        seen[entry.name] = index
        entries.append(attrs.evolve(entry, settings=settings))
    return tuple(entries)


def _parse_models(value: object, problems: list[Problem]) -> dict[str, tuple[str, ...]]:
    models: dict[str, tuple[str, ...]] = {}
    for model, targets in _block(value, ("models",), problems).items():
        path: KeyPath = ("models", str(model))
        if not isinstance(model, str) or not model:
            hint = "; quote it" if isinstance(model, bool | int) else ""
            message = f"model names must be strings, got {describe(model)}{hint}"
            problems.append(Problem(path, message))
        elif not isinstance(targets, list) or not targets:
            problems.append(
                Problem(path, f"expected a non-empty list of worker names, got {describe(targets)}")
            )
        elif bad := [(i, t) for i, t in enumerate(targets) if not isinstance(t, str)]:
            for index, target in bad:
                problems.append(
                    Problem((*path, index), f"expected a worker name, got {describe(target)}")
                )
        else:
            models[model] = tuple(targets)
    return models


def _parse_gpus(value: object, problems: list[Problem]) -> GpuSpec:
    if value is None or value == AUTO_GPUS:
        return AUTO_GPUS
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, list) and value:
        selectors: list[str] = []
        for index, item in enumerate(value):
            if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                selector = str(item)
            elif isinstance(item, str) and item.strip():
                selector = item.strip()
            else:
                problems.append(
                    Problem(
                        ("gpus", index),
                        "expected a device ordinal (int >= 0) "
                        f"or UUID string, got {describe(item)}",
                    )
                )
                continue
            if selector in selectors:
                problems.append(Problem(("gpus", index), f"duplicate selector {selector!r}"))
            selectors.append(selector)
        return tuple(selectors)
    problems.append(
        Problem(
            ("gpus",),
            f"must be auto, a device count >= 0 or a non-empty list of ordinals "
            f"or UUIDs, got {describe(value)}",
        )
    )
    return AUTO_GPUS


def _parse_gateway(value: object, problems: list[Problem]) -> Mapping[str, Any]:
    block = _block(value, ("gateway",), problems)
    for key in _SUPERVISOR_FILLED_GATEWAY_KEYS:
        if key in block:
            problems.append(Problem(("gateway", key), "filled in by the supervisor; remove it"))
    return block


def _warn_node_derived(node: NodeConfig) -> None:
    blocks = [("global", node.global_settings)] + [
        (f"workers[{i}]", entry.settings) for i, entry in enumerate(node.workers or ())
    ]
    for prefix, block in blocks:
        for path, owner in _NODE_DERIVED.items():
            value: Any = block
            for key in path:
                value = value.get(key) if isinstance(value, Mapping) else None
            if value is not None:
                dotted = ".".join(path)
                logger.warning("config: %s.%s is ignored; it is set from %s", prefix, dotted, owner)


def worker_ports(node: NodeConfig, entries: Sequence[WorkerEntry]) -> list[tuple[int, int]]:
    """``(gRPC port, HTTP port)`` of each worker in declaration order (HTTP 0 = off)."""
    ports = []
    for index, entry in enumerate(entries):
        grpc = entry.port if entry.port is not None else node.base_port + index
        if entry.metrics_port is not None:
            http = entry.metrics_port
        else:
            http = 0 if node.metrics_base_port is None else node.metrics_base_port + index
        ports.append((grpc, http))
    return ports


def node_problems(
    node: NodeConfig, entries: Sequence[WorkerEntry], *, synthesized_later: bool = False
) -> list[Problem]:
    """Cross-worker rules: ``models`` targets exist and no two ports collide.

    With ``synthesized_later`` (no ``workers:`` and no device count yet) a target only has to be
    a name the synthesis can produce (``worker<N>``).
    """
    problems: list[Problem] = []
    names = [entry.name for entry in entries]
    for model, targets in node.models.items():
        for index, target in enumerate(targets):
            if target in names:
                continue
            if synthesized_later and _SYNTHESIZED_NAME.fullmatch(target):
                continue
            problems.append(
                Problem(
                    ("models", model, index),
                    f"unknown worker {target!r} (workers: {', '.join(names)})",
                )
            )
    seen: dict[int, str] = {}
    for index, (entry, ports) in enumerate(zip(entries, worker_ports(node, entries), strict=True)):
        for kind, port, key, base in (
            ("gRPC", ports[0], "port", "base_port"),
            ("HTTP", ports[1], "metrics_port", "metrics_base_port"),
        ):
            if kind == "HTTP" and port == 0:
                continue
            label = f"worker {entry.name}'s {kind} port"
            if port in seen:
                explicit = getattr(entry, key) is not None and node.workers is not None
                path: KeyPath = ("workers", index, key) if explicit else (base,)
                problems.append(Problem(path, f"port {port} is both {seen[port]} and {label}"))
            else:
                seen[port] = label
    return problems


def node_config_from_mapping(data: Mapping[str, Any], *, source: Path | None = None) -> NodeConfig:
    """Parse and validate a node file's top-level mapping (without resolving workers)."""
    problems = _check_top_keys(data)
    simple = {k: v for k, v in data.items() if k in _NODE_KEYS and k not in _HAND_PARSED_KEYS}
    node, structure_problems = structure(_CONVERTER, simple, NodeConfig)
    problems += structure_problems
    global_settings = _block(data.get("global"), ("global",), problems)
    problems += check_keys(global_settings, Origin(prefix="global"))
    workers = _parse_workers(data.get("workers"), problems)
    models = _parse_models(data.get("models"), problems)
    gpus = _parse_gpus(data.get("gpus"), problems)
    gateway = _parse_gateway(data.get("gateway"), problems)
    raise_problems(problems, source=source)
    assert node is not None
    node = attrs.evolve(
        node,
        global_settings=global_settings,
        workers=workers,
        models=models,
        gpus=gpus,
        gateway=gateway,
        source=source,
    )
    entries = workers if workers is not None else (WorkerEntry(f"{SYNTHESIZED_WORKER_PREFIX}0"),)
    raise_problems(node_problems(node, entries, synthesized_later=workers is None), source=source)
    _warn_node_derived(node)
    return node
