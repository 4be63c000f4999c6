"""Building a :class:`WorkerConfig` from layered raw mappings.

Layers are key-checked one by one, deep-merged in order, then environment overrides are applied,
the result is structured with cattrs and checked across fields. Every value remembers the layer
it came from, so an error names the block to fix (``global.runtime.mem_fraction``) or the
variable that set it.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from reactantserver.core.config._env import (
    parse_hook_threads,
    resolve_autotune_cache_dir,
    resolve_cache_dir,
    scan_env,
)
from reactantserver.core.config._flags import FlagValue
from reactantserver.core.config._keys import check_keys
from reactantserver.core.config._schema import (
    Backend,
    EndpointsConfig,
    EnvOverride,
    GrpcConfig,
    LoggingConfig,
    MetaConfig,
    ModelControlMode,
    ModelSchedulingConfig,
    Numerics,
    RuntimeConfig,
    SchedulerConfig,
    TlsConfig,
    WorkerConfig,
)
from reactantserver.core.config._structure import (
    KeyPath,
    Origin,
    Problem,
    config_error,
    describe,
    format_path,
    make_converter,
    raise_problems,
    structure,
)
from reactantserver.core.config._variables import upgrade_env

__all__ = [
    "CONVERTER",
    "Layer",
    "Origins",
    "RawConfig",
    "cross_field_problems",
    "finish_worker_config",
    "merge_layers",
    "resolve_env",
    "set_path",
    "top_level_mapping",
]

logger = logging.getLogger("reactantserver.core.config")

#: Permission bit that makes a shared weight region world-writable (02: warn at ``666``).
_WORLD_WRITABLE: Final = 0o002

CONVERTER: Final = make_converter(
    [
        ModelSchedulingConfig,
        TlsConfig,
        RuntimeConfig,
        SchedulerConfig,
        MetaConfig,
        EndpointsConfig,
        GrpcConfig,
        LoggingConfig,
        WorkerConfig,
    ]
)

RawConfig = dict[str, Any]
Origins = dict[KeyPath, Origin]


@attrs.frozen
class Layer:
    """One block of worker keys as written, and how errors in it are located."""

    data: Mapping[str, Any]
    origin: Origin


def _plain(value: Any) -> Any:
    # Deep copy that turns every mapping into a dict, so merging never mutates a caller's data.
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return copy.deepcopy(value)


def _merge(
    target: RawConfig, source: Mapping[str, Any], origins: Origins, origin: Origin, path: KeyPath
) -> None:
    for key, value in source.items():
        here = (*path, key)
        current = target.get(key)
        if isinstance(value, Mapping) and isinstance(current, dict):
            _merge(current, value, origins, origin, here)
        else:
            target[key] = _plain(value)
            origins[here] = origin


def merge_layers(layers: Sequence[Layer]) -> tuple[RawConfig, Origins, list[Problem]]:
    """Key-check every layer, then deep-merge them in order (mappings merge, the rest replaces)."""
    problems: list[Problem] = []
    for layer in layers:
        problems += check_keys(layer.data, layer.origin)
    raw: RawConfig = {}
    origins: Origins = {}
    for layer in layers:
        _merge(raw, layer.data, origins, layer.origin, ())
    return raw, origins, problems


def set_path(raw: RawConfig, path: Sequence[str], value: object) -> None:
    """Set ``raw[path]``, creating the sections on the way."""
    node = raw
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = value


def cross_field_problems(config: WorkerConfig) -> list[Problem]:
    """The rules that relate two keys."""
    problems: list[Problem] = []
    runtime, endpoints, tls = config.runtime, config.endpoints, config.endpoints.tls
    if runtime.numerics is Numerics.TF32 and runtime.backend is Backend.CPU:
        problems.append(Problem(("runtime", "numerics"), "tf32 needs backend cuda, not cpu"))
    if config.model_control_mode is ModelControlMode.DYNAMIC and config.model_poll_seconds <= 0:
        problems.append(
            Problem(("model_poll_seconds",), "must be > 0 when model_control_mode is dynamic")
        )
    if endpoints.metrics_port and endpoints.metrics_port == endpoints.port:
        problems.append(
            Problem(
                ("endpoints", "metrics_port"),
                f"must differ from endpoints.port, both are {endpoints.port}",
            )
        )
    if endpoints.http_port and endpoints.http_port == endpoints.port:
        problems.append(
            Problem(
                ("endpoints", "http_port"),
                f"must differ from endpoints.port, both are {endpoints.port}",
            )
        )
    tls_path = ("endpoints", "tls")
    if tls.cert_file and not tls.key_file:
        problems.append(Problem((*tls_path, "key_file"), "required when cert_file is set"))
    if tls.key_file and not tls.cert_file:
        problems.append(Problem((*tls_path, "cert_file"), "required when key_file is set"))
    if tls.client_ca_file and not (tls.cert_file or tls.key_file):
        problems.append(
            Problem(
                (*tls_path, "client_ca_file"),
                "needs cert_file and key_file (mutual TLS is TLS plus client certificates)",
            )
        )
    return problems


def resolve_env(env: Mapping[str, str], *, quiet: bool = False) -> Mapping[str, str]:
    """``env`` with the older variable names replaced by the new ones; unless ``quiet``, one
    warning per older name found, on the log that reports the overrides."""
    upgrade = upgrade_env(env)
    if not quiet:
        for message in upgrade.messages:
            logger.warning("config: %s", message)
    return upgrade.env


def _apply_env(
    raw: RawConfig, origins: Origins, env: Mapping[str, str], *, quiet: bool
) -> tuple[list[EnvOverride], list[Problem]]:
    scan = scan_env(env)
    if not quiet:
        for warning in scan.warnings:
            logger.warning("config: %s", warning)
    applied: list[EnvOverride] = []
    for pending in scan.overrides:
        set_path(raw, pending.path, pending.value)
        origins[pending.path] = pending.origin
        dotted = format_path(pending.path)
        applied.append(EnvOverride(pending.variable, dotted, pending.value))
        if not quiet:
            logger.info(
                "config override %s=%r sets %s", pending.variable, env[pending.variable], dotted
            )
    return applied, list(scan.problems)


def _warn_mode(config: WorkerConfig, origins: Origins) -> None:
    if config.runtime.shared_host_weights_mode_bits & _WORLD_WRITABLE:
        where = origins.get(("runtime", "shared_host_weights_mode"), Origin())
        prefix = f"{where.prefix}." if where.prefix else ""
        logger.warning(
            "config: %sruntime.shared_host_weights_mode %r lets any local user write the "
            "shared weight regions; use 660 and a shared group instead",
            prefix,
            config.runtime.shared_host_weights_mode,
        )


def finish_worker_config(
    raw: RawConfig,
    origins: Origins,
    env: Mapping[str, str],
    *,
    worker_name: str | None = None,
    source: Path | None = None,
    quiet: bool = False,
    flags: Sequence[FlagValue] = (),
) -> WorkerConfig:
    """Apply env overrides, then command-line ``flags``, to merged ``raw``; structure it, check
    it and resolve cache paths.

    ``quiet`` suppresses logging (used when a supervisor only validates its workers). Older
    variable names are accepted (see :func:`resolve_env`).
    """
    env = resolve_env(env, quiet=quiet)
    applied, problems = _apply_env(raw, origins, env, quiet=quiet)
    for flag in flags:
        set_path(raw, flag.path, flag.value)
        origins[flag.path] = Origin(note=f"from {flag.flag}")
    hook_threads, thread_problems = parse_hook_threads(env)
    problems += thread_problems
    raise_problems(problems, origins, source=source)
    config, problems = structure(CONVERTER, raw, WorkerConfig)
    raise_problems(problems, origins, source=source)
    assert config is not None
    raise_problems(cross_field_problems(config), origins, source=source)
    if not quiet:
        _warn_mode(config, origins)
    cache_dir = resolve_cache_dir(config.cache_dir, env)
    autotune_dir = resolve_autotune_cache_dir(config.runtime.autotune_cache_dir, cache_dir, env)
    return attrs.evolve(
        config,
        cache_dir=str(cache_dir),
        runtime=attrs.evolve(config.runtime, autotune_cache_dir=str(autotune_dir)),
        worker_name=worker_name,
        hook_threads=hook_threads,
        env_overrides=tuple(applied),
    )


def top_level_mapping(data: object, what: str) -> Mapping[str, Any]:
    """``data`` as the top-level mapping of a file (an empty file is an empty mapping)."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise config_error([Problem((), f"{what} must be a mapping, got {describe(data)}")])
    return data
