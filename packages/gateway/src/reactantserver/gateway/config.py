"""Gateway configuration, parsed once at the edge into frozen typed objects.

The gateway runs without a file (defaults + env). ``main`` calls :func:`load_gateway_config`
with ``--config`` and ``os.environ``; nothing below it reads the environment::

    config = load_gateway_config(args.config, os.environ)
    config.scheduling.mode, config.worker_labels, config.inbound_cap

Every error is a :class:`~reactantserver.core.errors.ConfigError` listing every problem, one
``<dotted key path>: <message>`` per line. :func:`gateway_config_to_dict` gives plain YAML data
that loads back to the same configuration (the node supervisor writes ``gateway.yml`` from it).
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs
import yaml
from yaml.nodes import MappingNode

from reactantserver.core.config import LogFormat, LoggingConfig, LogLevel, TlsConfig
from reactantserver.core.errors import ConfigError
from reactantserver.gateway._config_env import (
    ALIAS_VARIABLES,
    ENV_KEYS,
    ENV_PREFIX,
    FILE_VARIABLE,
    LIST_VARIABLES,
    scan_env,
)
from reactantserver.gateway._config_rules import ALL_REPLICAS, KeyPath, Replicas, format_path
from reactantserver.gateway._config_schema import (
    CompactionMode,
    FillMode,
    GatewayConfig,
    GatewayGrpcConfig,
    HealthConfig,
    ListenAddresses,
    ModelAwareConfig,
    ModelFillMode,
    ModelPlacementConfig,
    RoutingPolicy,
    SchedulingConfig,
    SchedulingMode,
    WorkBasis,
    WorkerClientConfig,
    WorkerTlsConfig,
)
from reactantserver.gateway._config_structure import Problem, config_error, structure

try:
    from yaml import CSafeLoader as _BaseLoader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _BaseLoader  # type: ignore[assignment]

__all__ = [
    "ALL_REPLICAS",
    "DEFAULT_GATEWAY_FILE",
    "ENV_PREFIX",
    "FILE_VARIABLE",
    "CompactionMode",
    "FillMode",
    "GatewayConfig",
    "GatewayGrpcConfig",
    "HealthConfig",
    "ListenAddresses",
    "LogFormat",
    "LogLevel",
    "LoggingConfig",
    "ModelAwareConfig",
    "ModelFillMode",
    "ModelPlacementConfig",
    "Replicas",
    "RoutingPolicy",
    "SchedulingConfig",
    "SchedulingMode",
    "TlsConfig",
    "WorkBasis",
    "WorkerClientConfig",
    "WorkerTlsConfig",
    "gateway_config_from_mapping",
    "gateway_config_to_dict",
    "gateway_env_variables",
    "load_gateway_config",
    "resolve_gateway_file",
]

logger = logging.getLogger("reactantserver.gateway.config")

#: Read when neither ``--config`` nor ``REACTANT_GATEWAY_FILE`` names a file, if it exists.
DEFAULT_GATEWAY_FILE: Final = Path("/etc/reactantserver/gateway.yml")
#: How ``gateway_config_to_dict`` writes an unbounded ``startup_wait_seconds``.
_FOREVER: Final = "forever"


def gateway_env_variables() -> dict[str, str]:
    """Every ``REACTANT_GATEWAY_*`` override variable and the dotted key it sets."""
    table = {variable: ".".join(path) for variable, (path, _field) in ENV_KEYS.items()}
    table.update({variable: ".".join(path) for variable, path in LIST_VARIABLES.items()})
    table.update({variable: ".".join(path) for variable, path in ALIAS_VARIABLES.items()})
    return dict(sorted(table.items()))


class _StrictLoader(_BaseLoader):
    """The safe loader, except that a key written twice in one mapping is an error."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        what = "; ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError(f"{where}: invalid YAML: {what}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None


def resolve_gateway_file(path: Path | None, env: Mapping[str, str]) -> Path | None:
    """The file to read: ``path``, else ``$REACTANT_GATEWAY_FILE``, else the default if present.

    ``None`` means defaults + env only. A file named by ``path`` or the variable must exist
    (reading it raises :class:`ConfigError` otherwise).
    """
    if path is not None:
        return path
    named = env.get(FILE_VARIABLE, "").strip()
    if named:
        return Path(named)
    return DEFAULT_GATEWAY_FILE if DEFAULT_GATEWAY_FILE.is_file() else None


def load_gateway_config(path: Path | None, env: Mapping[str, str]) -> GatewayConfig:
    """Read and validate the gateway configuration (see :func:`resolve_gateway_file`)."""
    source = resolve_gateway_file(path, env)
    data = _read_yaml(source) if source is not None else None
    return _build(data, env, source)


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _set_path(raw: dict[Any, Any], path: tuple[str, ...], value: object) -> None:
    node = raw
    for key in path[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            return  # the file's own value is reported (expected a mapping)
        node = child
    node[path[-1]] = value


def _variable_of(path: KeyPath, set_by: Mapping[KeyPath, str]) -> str:
    for end in range(len(path), 0, -1):
        variable = set_by.get(path[:end])
        if variable is not None:
            return variable
    return ""


def gateway_config_from_mapping(
    data: Mapping[str, Any] | None, env: Mapping[str, str], *, source: Path | None = None
) -> GatewayConfig:
    """A gateway configuration from a file's top-level mapping (``None`` = empty) and ``env``.

    Environment overrides win over the file; unknown keys anywhere are errors, unknown
    ``REACTANT_GATEWAY_*`` variables are ignored. ``source`` only names the file in errors.
    """
    return _build(data, env, source)


def _build(data: object, env: Mapping[str, str], source: Path | None) -> GatewayConfig:
    if data is not None and not isinstance(data, Mapping):
        problem = Problem((), f"expected a mapping of gateway keys, got {type(data).__name__}")
        raise config_error([problem], source=source)
    raw: dict[Any, Any] = _plain(data or {})  # type: ignore[assignment]
    overrides, problems = scan_env(env)
    set_by: dict[KeyPath, str] = {}
    for override in overrides:
        _set_path(raw, override.path, override.value)
        set_by[override.path] = override.variable
    config, found = structure(GatewayConfig, raw)
    problems += [
        attrs.evolve(p, variable=p.variable or _variable_of(p.path, set_by)) for p in found
    ]
    if problems:
        raise config_error(problems, source=source)
    for override in overrides:
        logger.info(
            "config: %s = %r from %s", format_path(override.path), override.value, override.variable
        )
    _warn(config)
    assert isinstance(config, GatewayConfig)
    return config


def _warn(config: GatewayConfig) -> None:
    inbound = config.grpc.max_concurrent_requests_per_worker
    streams = config.worker_client.max_concurrent_streams
    if 0 < inbound <= streams:
        logger.warning(
            "config: grpc.max_concurrent_requests_per_worker (%d) <= "
            "worker_client.max_concurrent_streams (%d): the inbound cap binds before the "
            "outbound streams, so a worker never gets its full stream budget",
            inbound,
            streams,
        )
    for endpoint in config.scheduling.model_aware.network_seconds:
        if endpoint not in config.endpoints:
            logger.warning(
                "config: scheduling.model_aware.network_seconds names %r, which is not one of "
                "the endpoints; it has no effect",
                endpoint,
            )


def _to_plain(value: object) -> object:
    if attrs.has(cls := type(value)):
        return {
            field.name: _to_plain(getattr(value, field.name))
            for field in attrs.fields(cls)
            if getattr(value, field.name) is not None
        }
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {key: _to_plain(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_to_plain(item) for item in value]
    if isinstance(value, float) and math.isinf(value):
        return _FOREVER  # only startup_wait_seconds may be unbounded
    return value


def gateway_config_to_dict(config: GatewayConfig) -> dict[str, Any]:
    """``config`` as plain YAML data (every key; unset optional keys left out) that loads back."""
    plain = _to_plain(config)
    assert isinstance(plain, dict)
    return plain
