"""``REACTANT_GATEWAY_*`` overrides of gateway keys.

Every scalar key has a variable named after its dotted path (``scheduling.routing_fill_mode`` →
``REACTANT_GATEWAY_SCHEDULING_ROUTING_FILL_MODE``); the worker lists and the wedge exit have
the names of the spec's table. Per-model and per-endpoint maps have none. Everything here reads
a ``Mapping[str, str]`` handed in by the caller, never ``os.environ``.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, Final

import attrs

from reactantserver.core.config import Override, Problem, iter_leaf_fields, parse_env_setting
from reactantserver.core.config.rules import InvalidValue
from reactantserver.gateway.config._schema import GatewayConfig

__all__ = [
    "ALIAS_VARIABLES",
    "ENV_KEYS",
    "ENV_PREFIX",
    "FILE_VARIABLE",
    "LIST_VARIABLES",
    "env_name",
    "scan_env",
]

ENV_PREFIX: Final = "REACTANT_GATEWAY_"
#: Names the config file; not a key.
FILE_VARIABLE: Final = "REACTANT_GATEWAY_FILE"
#: Comma lists that replace a whole list key.
LIST_VARIABLES: Final[Mapping[str, tuple[str, ...]]] = {
    "REACTANT_GATEWAY_WORKERS": ("endpoints",),
    "REACTANT_GATEWAY_WORKER_METRICS": ("metrics_endpoints",),
    "REACTANT_GATEWAY_WORKER_NAMES": ("worker_names",),
}
#: Short names kept beside the dotted-path variable; the dotted-path one wins when both are set.
ALIAS_VARIABLES: Final[Mapping[str, tuple[str, ...]]] = {
    "REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS": ("health", "wedge_exit_rounds"),
}


def env_name(path: tuple[str, ...]) -> str:
    """The variable of a key: ``listen.grpc`` → ``REACTANT_GATEWAY_LISTEN_GRPC``."""
    return ENV_PREFIX + "_".join(path).upper()


def _build_keys() -> dict[str, tuple[tuple[str, ...], attrs.Attribute[Any]]]:
    table: dict[str, tuple[tuple[str, ...], attrs.Attribute[Any]]] = {}
    for path, field in iter_leaf_fields(GatewayConfig):
        if typing.get_origin(field.type) is tuple:
            continue  # the lists have the spec's names (LIST_VARIABLES)
        name = env_name(path)
        if name in table or name in LIST_VARIABLES or name == FILE_VARIABLE:
            raise RuntimeError(f"{name} names two keys")  # pragma: no cover - schema bug
        table[name] = (path, field)
    return table


#: Variable → (key path, attrs field) for every scalar key.
ENV_KEYS: Final[Mapping[str, tuple[tuple[str, ...], attrs.Attribute[Any]]]] = _build_keys()


def _comma_list(raw: str) -> list[str]:
    return [part.strip() for part in raw.split(",") if part.strip()]


def scan_env(env: Mapping[str, str]) -> tuple[list[Override], list[Problem]]:
    """The overrides ``env`` asks for, in the order to apply them, and unparsable values.

    Unknown ``REACTANT_GATEWAY_*`` variables are ignored (other programs share the prefix);
    an empty value counts as unset.
    """
    overrides: list[Override] = []
    problems: list[Problem] = []
    for variable, path in LIST_VARIABLES.items():
        if env.get(variable, "").strip():
            overrides.append(Override(variable, path, _comma_list(env[variable])))
    names = [v for v in ALIAS_VARIABLES if v in env] + sorted(v for v in env if v in ENV_KEYS)
    for variable in names:
        raw = env[variable]
        if not raw.strip():
            continue
        path = ALIAS_VARIABLES.get(variable) or ENV_KEYS[variable][0]
        try:
            value = parse_env_setting(raw, ENV_KEYS[env_name(path)][1])
        except InvalidValue as exc:
            problems.append(Problem(path, str(exc), Override(variable, path, raw).origin))
            continue
        # Text values (paths, choices) are taken without surrounding blanks.
        overrides.append(
            Override(variable, path, value.strip() if isinstance(value, str) else value)
        )
    return overrides, problems
