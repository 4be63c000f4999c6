"""Command-line flags and environment over the node file (09: flag > environment > file).

Each override is checked with the rule the node file uses for its key, and a bad value raises
:class:`ConfigError` naming the flag or variable (``REACTANTSERVER_NODE_ROLE: must be one of
...``). An empty variable counts as unset, except ``REACTANTSERVER_NODE_GPUS``, where it is an
error. The variables are named by core's one scheme: ``REACTANTSERVER_NODE_<KEY_PATH>``, and
the gateway's ``REACTANTSERVER_GATEWAY_LISTEN_*`` for ``listen.*`` (the node's public addresses
are its gateway's).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from reactantserver.core.config import (
    GATEWAY_PREFIX,
    NODE_PREFIX,
    FlagValue,
    NodeConfig,
    Role,
    check_address,
    key_variable,
    set_path,
    upgrade_env,
)
from reactantserver.core.errors import ConfigError
from reactantserver.node._devices import GPUS_VARIABLE, parse_gpu_spec

__all__ = [
    "CPU_WORKERS_VARIABLE",
    "GPUS_FLAG",
    "GPUS_VARIABLE",
    "LISTEN_GRPC_VARIABLE",
    "LISTEN_HTTP_VARIABLE",
    "LISTEN_METRICS_VARIABLE",
    "MAX_RESTARTS_VARIABLE",
    "ROLE_FLAG",
    "ROLE_VARIABLE",
    "apply_flags",
    "apply_overrides",
]

ROLE_VARIABLE: Final = key_variable(NODE_PREFIX, ("role",))
CPU_WORKERS_VARIABLE: Final = key_variable(NODE_PREFIX, ("cpu_workers",))
MAX_RESTARTS_VARIABLE: Final = key_variable(NODE_PREFIX, ("supervisor", "max_restarts"))
LISTEN_HTTP_VARIABLE: Final = key_variable(GATEWAY_PREFIX, ("listen", "http"))
LISTEN_GRPC_VARIABLE: Final = key_variable(GATEWAY_PREFIX, ("listen", "grpc"))
LISTEN_METRICS_VARIABLE: Final = key_variable(GATEWAY_PREFIX, ("listen", "metrics"))
ROLE_FLAG: Final = "--role"
GPUS_FLAG: Final = "--gpus"


def _role(value: str, name: str) -> Role:
    try:
        return Role(value.strip())
    except ValueError:
        raise ConfigError(f"{name}: must be one of {Role.spellings()}, got {value!r}") from None


def _int_at_least(value: str, name: str, lowest: int) -> int:
    try:
        number = int(value.strip(), 10)
    except ValueError:
        number = lowest - 1
    if number < lowest:
        raise ConfigError(f"{name}: must be an integer >= {lowest}, got {value!r}")
    return number


def _address(value: str, name: str) -> str:
    address = value.strip()
    problem = check_address(address)
    if problem is not None:
        raise ConfigError(f"{name}: {problem}, got {value!r}")
    return address


def _set(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "")
    return value if value.strip() else None


def apply_overrides(
    node: NodeConfig,
    env: Mapping[str, str],
    *,
    role: str | None = None,
    gpus: str | None = None,
) -> NodeConfig:
    """``node`` with ``--role``/``--gpus`` and the node's variables applied.

    Flags win over variables, variables over the file. Covers ``role``, ``gpus``,
    ``cpu_workers``, ``supervisor.max_restarts`` and ``listen.*``. Older variable names work
    (silently here: the caller reports them, see core's ``upgrade_env``).
    """
    env = upgrade_env(env).env
    changes: dict[str, object] = {}
    if role is not None:
        changes["role"] = _role(role, ROLE_FLAG)
    elif (value := _set(env, ROLE_VARIABLE)) is not None:
        changes["role"] = _role(value, ROLE_VARIABLE)
    if gpus is not None:
        changes["gpus"] = parse_gpu_spec(gpus, variable=GPUS_FLAG)
    elif GPUS_VARIABLE in env:
        changes["gpus"] = parse_gpu_spec(env[GPUS_VARIABLE], variable=GPUS_VARIABLE)
    if (value := _set(env, CPU_WORKERS_VARIABLE)) is not None:
        changes["cpu_workers"] = _int_at_least(value, CPU_WORKERS_VARIABLE, 1)
    if (value := _set(env, MAX_RESTARTS_VARIABLE)) is not None:
        restarts = _int_at_least(value, MAX_RESTARTS_VARIABLE, 0)
        changes["supervisor"] = attrs.evolve(node.supervisor, max_restarts=restarts)
    listen = node.listen
    if (value := _set(env, LISTEN_HTTP_VARIABLE)) is not None:
        listen = attrs.evolve(listen, http=_address(value, LISTEN_HTTP_VARIABLE))
    if (value := _set(env, LISTEN_GRPC_VARIABLE)) is not None:
        listen = attrs.evolve(listen, grpc=_address(value, LISTEN_GRPC_VARIABLE))
    if (value := _set(env, LISTEN_METRICS_VARIABLE)) is not None:
        listen = attrs.evolve(listen, metrics=_address(value, LISTEN_METRICS_VARIABLE))
    if listen != node.listen:
        changes["listen"] = listen
    return attrs.evolve(node, **changes) if changes else node  # type: ignore[arg-type]


def _with_port(address: str, port: int) -> str:
    host, _, _ = address.rpartition(":")
    return f"{host}:{port}"


def apply_flags(
    node: NodeConfig,
    *,
    model_repository: Sequence[Path] = (),
    ports: Mapping[str, int] | None = None,
    worker_flags: Sequence[FlagValue] = (),
) -> NodeConfig:
    """``node`` with Triton's flags applied; they win over the file and the environment.

    ``--model-repository`` replaces ``model_repo``; ``--http-port``, ``--grpc-port`` and
    ``--metrics-port`` replace the port of ``listen.http``/``grpc``/``metrics`` (the host
    stays); the worker keys (``--model-control-mode``, ``--load-model``, ``--log-format``)
    are set in ``global:``, for every worker.
    """
    changes: dict[str, Any] = {}
    if model_repository:
        changes["model_repo"] = tuple(str(directory) for directory in model_repository)
    if ports:
        addresses = {role: _with_port(getattr(node.listen, role), p) for role, p in ports.items()}
        for role, address in addresses.items():
            if (problem := check_address(address)) is not None:
                raise ConfigError(f"--{role}-port: {problem}, got {address!r}")
        changes["listen"] = attrs.evolve(node.listen, **addresses)
    if worker_flags:
        settings = copy.deepcopy(dict(node.global_settings))
        for flag in worker_flags:
            set_path(settings, flag.path, flag.value)
        changes["global_settings"] = settings
    return attrs.evolve(node, **changes) if changes else node
