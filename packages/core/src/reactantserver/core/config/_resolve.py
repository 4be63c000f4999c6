"""Resolving one worker's configuration from a node file.

Order: built-in defaults ← ``global`` ← worker entry ← node-derived values (``model_dirs``,
ports, ``device_ordinal``, ``shared_host_weights`` where unset) ← ``models`` map ← environment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from reactantserver.core.config._flags import FlagValue
from reactantserver.core.config._node import (
    SYNTHESIZED_WORKER_PREFIX,
    NodeConfig,
    WorkerEntry,
    node_problems,
    worker_ports,
)
from reactantserver.core.config._schema import Residency, RuntimeConfig, WorkerConfig
from reactantserver.core.config._structure import Origin, config_error, raise_problems
from reactantserver.core.config._worker import (
    Layer,
    Origins,
    RawConfig,
    finish_worker_config,
    merge_layers,
    set_path,
)
from reactantserver.core.errors import ConfigError

__all__ = [
    "device_sharers",
    "node_config_to_dict",
    "node_worker_configs",
    "resolve_worker_config",
    "shared_mem_fraction",
    "synthesize_workers",
    "worker_entries",
]

_MODELS_ORIGIN: Final = Origin(prefix="models")


def synthesize_workers(node: NodeConfig, count: int, *, bind_gpus: bool = False) -> NodeConfig:
    """``node`` with ``worker0 … worker{count-1}`` when it lists no workers.

    The supervisor calls this once it knows how many devices (or CPU workers) it runs; with
    ``bind_gpus`` worker i gets ``gpu: i`` (selector i). A node that lists its workers is returned
    unchanged. Raises :class:`ConfigError` when the ``models`` map or the ports do not fit.
    """
    if node.workers is not None:
        return node
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    entries = tuple(
        WorkerEntry(f"{SYNTHESIZED_WORKER_PREFIX}{i}", gpu=i if bind_gpus else None)
        for i in range(count)
    )
    synthesized = attrs.evolve(node, workers=entries)
    raise_problems(node_problems(synthesized, entries), source=node.source)
    return synthesized


def worker_entries(node: NodeConfig) -> tuple[WorkerEntry, ...]:
    """The node's workers: as listed, else a single synthesized ``worker0``.

    Without device detection (a worker reading a file that has no ``workers:``) one worker is
    the only safe assumption; the supervisor calls :func:`synthesize_workers` with the real
    count and hands its workers the resolved file.
    """
    if node.workers is not None:
        return node.workers
    return (WorkerEntry(f"{SYNTHESIZED_WORKER_PREFIX}0"),)


def _apply_models_map(node: NodeConfig, name: str, raw: RawConfig, origins: Origins) -> None:
    for model, targets in node.models.items():
        if name not in targets:
            continue
        scheduler = raw.get("scheduler")
        models = scheduler.get("models") if isinstance(scheduler, dict) else None
        entry = models.get(model) if isinstance(models, dict) else None
        if isinstance(entry, dict) and entry.get("residency") is not None:
            continue  # the worker's own setting wins
        path = ("scheduler", "models", model, "residency")
        set_path(raw, path, Residency.DEVICE.value)
        origins[path] = _MODELS_ORIGIN


def _resolve(
    node: NodeConfig,
    entries: tuple[WorkerEntry, ...],
    index: int,
    env: Mapping[str, str],
    *,
    quiet: bool,
    flags: Sequence[FlagValue] = (),
) -> WorkerConfig:
    entry = entries[index]
    raw, origins, problems = merge_layers(
        [
            Layer(node.global_settings, Origin(prefix="global")),
            Layer(entry.settings, Origin(prefix=f"workers[{index}]")),
        ]
    )
    raise_problems(problems, source=node.source)
    grpc_port, http_port = worker_ports(node, entries)[index]
    derived: list[tuple[tuple[str, ...], object, str]] = [
        (("model_dirs",), list(node.model_repo), "from model_repo"),
        (("endpoints", "port"), grpc_port, _port_note(entry.port, "base_port", index)),
        (
            ("endpoints", "metrics_port"),
            http_port,
            _port_note(entry.metrics_port, "metrics_base_port", index),
        ),
        (("endpoints", "http_port"), 0, "node-derived: REST shares the metrics port"),
        (("runtime", "device_ordinal"), 0, "node-derived"),
    ]
    runtime = raw.get("runtime")
    sharers = device_sharers(entries, index)
    if sharers > 1 and not (isinstance(runtime, dict) and "mem_fraction" in runtime):
        derived.append(
            (
                ("runtime", "mem_fraction"),
                shared_mem_fraction(sharers),
                f"node-derived: the default split between the {sharers} workers of gpu {entry.gpu}",
            )
        )
    if node.shared_host_weights is not None and not (
        isinstance(runtime, dict) and "shared_host_weights" in runtime
    ):
        derived.append(
            (
                ("runtime", "shared_host_weights"),
                node.shared_host_weights,
                "from the node's shared_host_weights",
            )
        )
    for path, value, note in derived:
        set_path(raw, path, value)
        origins[path] = Origin(note=note)
    _apply_models_map(node, entry.name, raw, origins)
    return finish_worker_config(
        raw, origins, env, worker_name=entry.name, source=node.source, quiet=quiet, flags=flags
    )


def device_sharers(entries: Sequence[WorkerEntry], index: int) -> int:
    """How many workers name the device of ``entries[index]`` with ``gpu:`` (1: not shared).

    Workers share a device only by naming it, each of them, with ``gpu:``.
    """
    gpu = entries[index].gpu
    if gpu is None:
        return 1
    return sum(1 for entry in entries if entry.gpu == gpu)


def shared_mem_fraction(sharers: int) -> float:
    """The default ``runtime.mem_fraction`` of each of ``sharers`` workers on one device.

    The single worker's default split evenly (rounded down to 0.001), so the arenas together
    leave the device the same headroom for CUDA contexts and executables as one worker does.
    """
    default = attrs.fields(RuntimeConfig).mem_fraction.default
    assert isinstance(default, float)
    return math.floor(default / sharers * 1000) / 1000


def _port_note(explicit: int | None, base: str, index: int) -> str:
    return f"from workers[{index}]" if explicit is not None else f"from {base} + {index}"


def resolve_worker_config(
    node: NodeConfig,
    name: str,
    env: Mapping[str, str],
    *,
    quiet: bool = False,
    flags: Sequence[FlagValue] = (),
) -> WorkerConfig:
    """The configuration of worker ``name`` of ``node``, environment overrides applied, then
    command-line ``flags``."""
    entries = worker_entries(node)
    problems = node_problems(node, entries, synthesized_later=node.workers is None)
    raise_problems(problems, source=node.source)
    names = [entry.name for entry in entries]
    if name not in names:
        raise ConfigError(
            f"no worker named {name!r} in {node.source or 'the node file'} "
            f"(workers: {', '.join(names)})"
        )
    return _resolve(node, entries, names.index(name), env, quiet=quiet, flags=flags)


def node_worker_configs(
    node: NodeConfig, env: Mapping[str, str], *, quiet: bool = True
) -> dict[str, WorkerConfig]:
    """Every worker's configuration by name (one synthesized worker when none are listed).

    The ``models`` map may name workers that synthesis has not produced yet; they are skipped
    here and checked by :func:`synthesize_workers`.
    """
    entries = worker_entries(node)
    problems = node_problems(node, entries, synthesized_later=node.workers is None)
    if problems:
        raise config_error(problems, source=node.source)
    return {
        entry.name: _resolve(node, entries, index, env, quiet=quiet)
        for index, entry in enumerate(entries)
    }


def node_config_to_dict(node: NodeConfig) -> dict[str, Any]:
    """``node`` as a node-file mapping (for ``reactantserver-node materialize``)."""
    data: dict[str, Any] = {
        "model_repo": node.model_repo[0] if len(node.model_repo) == 1 else list(node.model_repo),
        "base_port": node.base_port,
        "metrics_base_port": node.metrics_base_port,
        "global": _plain_dict(node.global_settings),
    }
    if node.workers is not None:
        workers = []
        for entry in node.workers:
            item: dict[str, Any] = {"name": entry.name}
            for key in ("gpu", "port", "metrics_port"):
                if getattr(entry, key) is not None:
                    item[key] = getattr(entry, key)
            item.update(_plain_dict(entry.settings))
            workers.append(item)
        data["workers"] = workers
    data["models"] = {model: list(targets) for model, targets in node.models.items()}
    if node.shared_host_weights is not None:
        data["shared_host_weights"] = node.shared_host_weights
    data["gpus"] = list(node.gpus) if isinstance(node.gpus, tuple) else node.gpus
    data["cpu_workers"] = node.cpu_workers
    data["role"] = node.role.value
    data["listen"] = attrs.asdict(node.listen)
    data["gateway"] = _plain_dict(node.gateway)
    data["supervisor"] = attrs.asdict(node.supervisor)
    return data


def _plain_dict(value: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _plain_dict(v) if isinstance(v, Mapping) else v for k, v in value.items()}
