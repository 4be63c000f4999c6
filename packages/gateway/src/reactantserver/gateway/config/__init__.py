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
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from reactantserver.core.config import (
    KeyRules,
    LogFormat,
    LoggingConfig,
    LogLevel,
    Problem,
    TlsConfig,
    config_error,
    load_yaml_file,
    structure_file,
    upgrade_env,
)
from reactantserver.core.config.rules import format_path
from reactantserver.gateway.config._env import (
    ENV_KEYS,
    ENV_PREFIX,
    FILE_VARIABLE,
    LIST_VARIABLES,
    scan_env,
)
from reactantserver.gateway.config._schema import (
    ALL_REPLICAS,
    CompactionMode,
    FillMode,
    GatewayConfig,
    GatewayGrpcConfig,
    HealthConfig,
    ListenAddresses,
    ModelAwareConfig,
    ModelFillMode,
    ModelPlacementConfig,
    Replicas,
    RoutingPolicy,
    SchedulingConfig,
    SchedulingMode,
    WorkBasis,
    WorkerClientConfig,
    WorkerTlsConfig,
)

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

#: Read when neither ``--config`` nor ``REACTANTSERVER_GATEWAY_FILE`` names a file, if it exists.
DEFAULT_GATEWAY_FILE: Final = Path("/etc/reactantserver/gateway.yml")
#: How ``gateway_config_to_dict`` writes an unbounded ``startup_wait_seconds``.
_FOREVER: Final = "forever"


def gateway_env_variables() -> dict[str, str]:
    """Every ``REACTANTSERVER_GATEWAY_*`` override variable and the dotted key it sets."""
    table = {variable: ".".join(path) for variable, (path, _field) in ENV_KEYS.items()}
    table.update({variable: ".".join(path) for variable, path in LIST_VARIABLES.items()})
    return dict(sorted(table.items()))


def resolve_gateway_file(path: Path | None, env: Mapping[str, str]) -> Path | None:
    """The file to read: ``path``, else ``$REACTANTSERVER_GATEWAY_FILE`` (or its older name),
    else the default if present.

    ``None`` means defaults + env only. A file named by ``path`` or the variable must exist
    (reading it raises :class:`ConfigError` otherwise).
    """
    if path is not None:
        return path
    named = upgrade_env(env).env.get(FILE_VARIABLE, "").strip()
    if named:
        return Path(named)
    return DEFAULT_GATEWAY_FILE if DEFAULT_GATEWAY_FILE.is_file() else None


def load_gateway_config(path: Path | None, env: Mapping[str, str]) -> GatewayConfig:
    """Read and validate the gateway configuration (see :func:`resolve_gateway_file`)."""
    source = resolve_gateway_file(path, env)
    data = load_yaml_file(source) if source is not None else None
    return _build(data, env, source)


#: A null section (``health:`` with nothing under it) means its defaults; no removed keys yet.
_KEY_RULES: Final = KeyRules(empty_sections=True)


def gateway_config_from_mapping(
    data: Mapping[str, Any] | None, env: Mapping[str, str], *, source: Path | None = None
) -> GatewayConfig:
    """A gateway configuration from a file's top-level mapping (``None`` = empty) and ``env``.

    Environment overrides win over the file; unknown keys anywhere are errors, unknown
    ``REACTANTSERVER_GATEWAY_*`` variables are ignored with a warning, and each older variable
    name found (``REACTANT_GATEWAY_*``) works with a deprecation warning naming the new one.
    ``source`` only names the file in errors.
    """
    return _build(data, env, source)


def _build(data: object, env: Mapping[str, str], source: Path | None) -> GatewayConfig:
    if data is not None and not isinstance(data, Mapping):
        problem = Problem((), f"expected a mapping of gateway keys, got {type(data).__name__}")
        raise config_error([problem], source=source)
    upgrade = upgrade_env(env)
    for message in upgrade.messages:
        logger.warning("config: %s", message)
    overrides, problems, warnings = scan_env(upgrade.env)
    for warning in warnings:
        logger.warning("config: %s", warning)
    config, found, origins = structure_file(GatewayConfig, data or {}, overrides, rules=_KEY_RULES)
    problems += found
    if problems:
        raise config_error(problems, origins, source=source)
    for override in overrides:
        logger.info(
            "config: %s = %r from %s", format_path(override.path), override.value, override.variable
        )
    assert isinstance(config, GatewayConfig)
    _warn(config)
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
