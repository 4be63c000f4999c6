"""``REACTANTSERVER_GATEWAY_*`` overrides of gateway keys.

Every scalar key has a variable named after its dotted path (``scheduling.routing_fill_mode`` →
``REACTANTSERVER_GATEWAY_SCHEDULING_ROUTING_FILL_MODE``, core's one scheme); the worker lists
have short names of their own. Per-model and per-endpoint maps have none. The functions here
expect an environment already rewritten by core's ``upgrade_env`` (older names replaced).
Everything here reads a ``Mapping[str, str]`` handed in by the caller, never ``os.environ``.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, Final

import attrs

from reactantserver.core.config import (
    GATEWAY_FILE_VARIABLE,
    GATEWAY_PREFIX,
    Override,
    Problem,
    check_not_process_variable,
    iter_leaf_fields,
    key_variable,
    parse_env_setting,
    unknown_variables,
)
from reactantserver.core.config.rules import InvalidValue
from reactantserver.gateway.config._schema import GatewayConfig

__all__ = [
    "ENV_KEYS",
    "ENV_PREFIX",
    "FILE_VARIABLE",
    "LIST_VARIABLES",
    "env_name",
    "scan_env",
]

ENV_PREFIX: Final = GATEWAY_PREFIX
#: Names the config file; not a key (one of core's process variables).
FILE_VARIABLE: Final = GATEWAY_FILE_VARIABLE
#: Comma lists that replace a whole list key.
LIST_VARIABLES: Final[Mapping[str, tuple[str, ...]]] = {
    GATEWAY_PREFIX + "WORKERS": ("endpoints",),
    GATEWAY_PREFIX + "WORKER_METRICS": ("metrics_endpoints",),
    GATEWAY_PREFIX + "WORKER_NAMES": ("worker_names",),
}


def env_name(path: tuple[str, ...]) -> str:
    """The variable of a key: ``listen.grpc`` → ``REACTANTSERVER_GATEWAY_LISTEN_GRPC``."""
    return key_variable(ENV_PREFIX, path)


def _build_keys() -> dict[str, tuple[tuple[str, ...], attrs.Attribute[Any]]]:
    table: dict[str, tuple[tuple[str, ...], attrs.Attribute[Any]]] = {}
    for path, field in iter_leaf_fields(GatewayConfig):
        if typing.get_origin(field.type) is tuple:
            continue  # the lists have the spec's names (LIST_VARIABLES)
        name = env_name(path)
        check_not_process_variable(name, path)
        if name in table or name in LIST_VARIABLES:
            raise RuntimeError(f"{name} names two keys")  # pragma: no cover - schema bug
        table[name] = (path, field)
    return table


#: Variable → (key path, attrs field) for every scalar key.
ENV_KEYS: Final[Mapping[str, tuple[tuple[str, ...], attrs.Attribute[Any]]]] = _build_keys()


def _comma_list(raw: str) -> list[str]:
    return [part.strip() for part in raw.split(",") if part.strip()]


def scan_env(env: Mapping[str, str]) -> tuple[list[Override], list[Problem], list[str]]:
    """The overrides ``env`` asks for, in the order to apply them, unparsable values, and a
    warning for each unknown ``REACTANTSERVER_GATEWAY_*`` variable (with the closest known one).

    An empty value counts as unset.
    """
    overrides: list[Override] = []
    problems: list[Problem] = []
    for variable, path in LIST_VARIABLES.items():
        if env.get(variable, "").strip():
            overrides.append(Override(variable, path, _comma_list(env[variable])))
    for variable in sorted(v for v in env if v in ENV_KEYS):
        raw = env[variable]
        if not raw.strip():
            continue
        path, field = ENV_KEYS[variable]
        try:
            value = parse_env_setting(raw, field)
        except InvalidValue as exc:
            problems.append(Problem(path, str(exc), Override(variable, path, raw).origin))
            continue
        # Text values (paths, choices) are taken without surrounding blanks.
        overrides.append(
            Override(variable, path, value.strip() if isinstance(value, str) else value)
        )
    warnings = unknown_variables(env, ENV_PREFIX, {*ENV_KEYS, *LIST_VARIABLES})
    return overrides, problems, warnings
