"""Environment overrides of worker keys and the other worker variables.

The names follow the one scheme of :mod:`._variables` (``REACTANTSERVER_WORKER_<KEY_PATH>``);
the functions here expect an environment already rewritten by its ``upgrade_env``. Everything
here reads a ``Mapping[str, str]`` handed in by the caller, never ``os.environ``.
"""

from __future__ import annotations

import enum
import math
import os
import pwd
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, get_args

import attrs

from reactantserver.core.config._fields import PARSE_KEY, InvalidValue
from reactantserver.core.config._keys import iter_leaves
from reactantserver.core.config._structure import Origin, Problem
from reactantserver.core.config._variables import (
    CACHE_DIR_VARIABLE,
    NODE_FILE_VARIABLE,
    REMOVED_VARIABLE_PREFIXES,
    REMOVED_VARIABLES,
    WORKER_NAME_VARIABLE,
    WORKER_PREFIX,
    WORKER_THREADS_VARIABLE,
    check_not_process_variable,
    key_variable,
    removed_hint,
    unknown_variables,
)

__all__ = [
    "AUTOTUNE_CACHE_SUBDIR",
    "CACHE_DIR_VARIABLE",
    "CACHE_SUBDIR",
    "DEFAULT_NODE_FILE",
    "ENV_OVERRIDES",
    "ENV_PREFIX",
    "NODE_FILE_VARIABLE",
    "REMOVED_VARIABLES",
    "REMOVED_VARIABLE_PREFIXES",
    "WORKER_NAME_VARIABLE",
    "WORKER_THREADS_VARIABLE",
    "EnvScan",
    "PendingOverride",
    "env_name",
    "parse_env_setting",
    "parse_env_value",
    "parse_hook_threads",
    "resolve_autotune_cache_dir",
    "resolve_cache_dir",
    "scan_env",
]

ENV_PREFIX: Final = WORKER_PREFIX
DEFAULT_NODE_FILE: Final = Path("/etc/reactantserver/node.yaml")
#: Directory under ``$XDG_CACHE_HOME`` / ``~/.cache``, and under ``cache_dir`` for autotune.
CACHE_SUBDIR: Final = "reactantserver"
AUTOTUNE_CACHE_SUBDIR: Final = "xla-autotune"

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
_LIST_SEPARATOR: Final = ":"


def env_name(path: tuple[str, ...]) -> str:
    """The variable overriding a key (``meta.concurrency`` → ``REACTANTSERVER_WORKER_META_...``)."""
    return key_variable(ENV_PREFIX, path)


def _build_overrides() -> dict[str, tuple[tuple[str, ...], Any]]:
    table: dict[str, tuple[tuple[str, ...], Any]] = {}
    for path, leaf_type in iter_leaves():
        name = env_name(path)
        check_not_process_variable(name, path)
        if name in table:  # a schema change made two keys share a variable
            raise RuntimeError(f"{name} names both {table[name][0]} and {path}")
        table[name] = (path, leaf_type)
    return table


#: Variable → (key path, leaf type), for every scalar or list worker key.
ENV_OVERRIDES: Final[Mapping[str, tuple[tuple[str, ...], Any]]] = _build_overrides()


#: The words that leave an optional key unset (``X | None``), e.g. the adaptive queue delay.
_UNSET: Final = frozenset({"", "none", "auto"})


def parse_env_value(raw: str, leaf_type: Any) -> object:
    """Parse a variable's text as ``leaf_type``; :class:`InvalidValue` says why it cannot.

    An optional key (``int | None``) is unset by an empty value, ``none`` or ``auto``.
    """
    if isinstance(leaf_type, types.UnionType) and type(None) in get_args(leaf_type):
        return _parse_optional(raw, leaf_type)
    return _parse_plain(raw, leaf_type)


def parse_env_setting(raw: str, field: attrs.Attribute[Any]) -> object:
    """Parse a variable's text for ``field``; a field read by its own ``parse`` gets a number
    when the text is one, else the text (``"all"``, ``"forever"``) for that parser to judge."""
    if PARSE_KEY not in field.metadata:
        return parse_env_value(raw, field.type)
    text = raw.strip()
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


def _parse_plain(raw: str, leaf_type: Any) -> object:
    if leaf_type is bool:
        word = raw.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise InvalidValue(f"cannot parse {raw!r} as a boolean (1/true/yes/on or 0/false/no/off)")
    if leaf_type is int:
        try:
            return int(raw.strip(), 10)
        except ValueError:
            raise InvalidValue(f"cannot parse {raw!r} as an integer") from None
    if leaf_type is float:
        try:
            number = float(raw.strip())
        except ValueError:
            raise InvalidValue(f"cannot parse {raw!r} as a number") from None
        if not math.isfinite(number):
            raise InvalidValue(f"cannot parse {raw!r} as a finite number")
        return number
    if leaf_type == tuple[str, ...]:
        return [part for part in raw.split(_LIST_SEPARATOR) if part]
    if leaf_type is str or (isinstance(leaf_type, type) and issubclass(leaf_type, enum.Enum)):
        return raw  # enums are checked when structured, with the variable named
    raise TypeError(f"no environment parser for {leaf_type!r}")  # pragma: no cover


def _parse_optional(raw: str, leaf_type: types.UnionType) -> object:
    if raw.strip().lower() in _UNSET:
        return None
    (inner,) = [t for t in get_args(leaf_type) if t is not type(None)]
    return parse_env_value(raw, inner)


@attrs.frozen
class PendingOverride:
    """A parsed override not yet applied: ``variable`` sets ``path`` to ``value``."""

    variable: str
    path: tuple[str, ...]
    value: object

    @property
    def origin(self) -> Origin:
        """How errors in the value name it."""
        return Origin(note=f"from {self.variable}")


@attrs.frozen
class EnvScan:
    """What the environment asks of the worker keys, in the order to apply it."""

    overrides: tuple[PendingOverride, ...]
    problems: tuple[Problem, ...]
    warnings: tuple[str, ...]


def _problem(variable: str, message: str) -> Problem:
    return Problem((), message, Origin(prefix=variable))


def scan_env(env: Mapping[str, str]) -> EnvScan:
    """Parse every override variable in ``env`` (already upgraded to the new names).

    A removed variable is a problem with its hint; an unknown ``REACTANTSERVER_WORKER_*`` only
    warns, naming the closest known variable.
    """
    overrides: list[PendingOverride] = []
    problems: list[Problem] = []
    for variable in sorted(env):
        hint = removed_hint(variable)
        if hint is not None:
            problems.append(_problem(variable, f"removed variable; {hint}"))
    leaf_types = dict(iter_leaves())
    for variable in sorted(v for v in env if v in ENV_OVERRIDES):
        path = ENV_OVERRIDES[variable][0]
        try:
            value = parse_env_value(env[variable], leaf_types[path])
        except InvalidValue as exc:
            problems.append(_problem(variable, str(exc)))
            continue
        overrides.append(PendingOverride(variable, path, value))
    warnings = unknown_variables(env, ENV_PREFIX, ENV_OVERRIDES)
    return EnvScan(tuple(overrides), tuple(problems), tuple(warnings))


def parse_hook_threads(env: Mapping[str, str]) -> tuple[int | None, list[Problem]]:
    """``REACTANTSERVER_WORKER_THREADS`` as the hook-pool size (empty or unset → ``None``)."""
    raw = env.get(WORKER_THREADS_VARIABLE, "").strip()
    if not raw:
        return None, []
    try:
        threads = int(raw, 10)
    except ValueError:
        threads = 0
    if threads < 1:
        return None, [_problem(WORKER_THREADS_VARIABLE, f"must be an integer >= 1, got {raw!r}")]
    return threads, []


def _home(env: Mapping[str, str]) -> Path:
    home = env.get("HOME")
    return Path(home) if home else Path(pwd.getpwuid(os.getuid()).pw_dir)


def _expand(path: str, env: Mapping[str, str]) -> Path:
    if path == "~" or path.startswith("~/"):
        return _home(env) / path[2:]
    return Path(path)


def resolve_cache_dir(cache_dir: str, env: Mapping[str, str]) -> Path:
    """The cache root: ``cache_dir``, else ``$REACTANTSERVER_CACHE_DIR``, else the XDG cache path.

    ``$XDG_CACHE_HOME`` is honoured only when absolute (as the XDG spec says); the last resort is
    ``~/.cache/reactantserver`` with ``~`` from ``env["HOME"]`` (else the password database).
    A leading ``~/`` in either setting is expanded the same way.
    """
    if cache_dir:
        return _expand(cache_dir, env)
    explicit = env.get(CACHE_DIR_VARIABLE, "")
    if explicit:
        return _expand(explicit, env)
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / CACHE_SUBDIR
    return _home(env) / ".cache" / CACHE_SUBDIR


def resolve_autotune_cache_dir(setting: str, cache_dir: Path, env: Mapping[str, str]) -> Path:
    """``runtime.autotune_cache_dir``: the setting, else ``<cache_dir>/xla-autotune``."""
    return _expand(setting, env) if setting else cache_dir / AUTOTUNE_CACHE_SUBDIR
