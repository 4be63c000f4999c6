"""Value rules and strict YAML scalars shared by every configuration parser.

The worker and node files (:mod:`reactantserver.core.config`) and the gateway file
(``reactantserver.gateway.config``) read YAML with the same strictness and report problems in
the same words. A rule (:data:`Check`) returns ``None`` when a value is fine, else what it must
be; a strict scalar parser returns the value or raises :class:`InvalidValue`::

    between(0, lo_open=True)(0)      # "must be > 0"
    strict_int("8")                  # InvalidValue: expected an integer, got string '8'; ...
    format_path(("scheduler", "models", "m", "weight"))   # "scheduler.models.m.weight"
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeAlias

__all__ = [
    "MAX_GRPC_MESSAGE_BYTES",
    "MAX_PORT",
    "Check",
    "InvalidValue",
    "between",
    "describe",
    "format_path",
    "non_empty",
    "strict_bool",
    "strict_float",
    "strict_int",
    "strict_str",
    "unique",
]

#: Largest TCP port.
MAX_PORT: Final = 65535
#: gRPC takes message limits as C ints.
MAX_GRPC_MESSAGE_BYTES: Final = (1 << 31) - 1

#: A value rule: ``None`` when the value is fine, else what it must be.
Check: TypeAlias = Callable[[Any], str | None]

_YAML_BOOL_WORDS: Final = frozenset({"yes", "no", "on", "off", "true", "false", "y", "n"})


class InvalidValue(ValueError):
    """A value breaks its key's rule; the message says what it must be and what it got."""


def format_path(path: Iterable[str | int]) -> str:
    """``("scheduler", "models", "resnet", "weight")`` → ``scheduler.models.resnet.weight``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def describe(value: object) -> str:
    """What a YAML value is, for messages: ``boolean true``, ``string 'yes'``, ``integer 660``."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = f"boolean {'true' if value else 'false'}"
    elif isinstance(value, enum.Enum):
        text = repr(value.value)
    elif isinstance(value, int):
        text = f"integer {value}"
    elif isinstance(value, float):
        text = f"number {value!r}"
    elif isinstance(value, str):
        text = f"string {value!r}"
    elif isinstance(value, Mapping):
        text = "a mapping"
    elif isinstance(value, list | tuple):
        text = "a list"
    else:
        text = type(value).__name__
    return text


def _bound(value: float) -> str:
    # Integer bounds exactly (2147483647, not 2.14748e+09); other numbers compactly.
    return str(value) if isinstance(value, int) else f"{value:g}"


def between(
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> Check:
    """A range rule; ``None`` values (unset optional keys) always pass."""
    if lo is not None and hi is not None:
        left, right = "(" if lo_open else "[", ")" if hi_open else "]"
        text = f"must be in {left}{_bound(lo)}, {_bound(hi)}{right}"
    elif lo is not None:
        text = f"must be {'>' if lo_open else '>='} {_bound(lo)}"
    else:
        assert hi is not None, "between() needs a bound"
        text = f"must be {'<' if hi_open else '<='} {_bound(hi)}"

    def check(value: Any) -> str | None:
        if value is None:
            return None
        if lo is not None and (value <= lo if lo_open else value < lo):
            return text
        if hi is not None and (value >= hi if hi_open else value > hi):
            return text
        return None

    return check


def non_empty(value: Any) -> str | None:
    """Rule of strings and lists that must not be empty."""
    return "must not be empty" if len(value) == 0 else None


def unique(value: Any) -> str | None:
    """Rule of lists whose items must not repeat."""
    seen: set[object] = set()
    for item in value:
        if item in seen:
            return f"must not repeat {item!r}"
        seen.add(item)
    return None


def strict_bool(value: object) -> bool:
    """A YAML boolean; quoted words (``"yes"``) get a hint instead of a silent conversion."""
    if isinstance(value, bool):
        return value
    hint = ""
    if isinstance(value, str) and value.strip().lower() in _YAML_BOOL_WORDS:
        hint = "; write it unquoted (true or false) so YAML reads a boolean"
    raise InvalidValue(f"expected a boolean (true or false), got {describe(value)}{hint}")


def strict_int(value: object) -> int:
    """A YAML integer (never a boolean, never a numeric string)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    hint = "; write it unquoted" if isinstance(value, str) and value.strip().isdigit() else ""
    raise InvalidValue(f"expected an integer, got {describe(value)}{hint}")


def strict_float(value: object) -> float:
    """A finite YAML number (integers accepted, booleans and strings not)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise InvalidValue(f"expected a finite number, got {describe(value)}")
        return number
    hint = ""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            pass
        else:
            hint = "; YAML 1.1 reads 1e-3 as a string: write it unquoted with a dot (1.0e-3)"
    raise InvalidValue(f"expected a number, got {describe(value)}{hint}")


def strict_str(value: object) -> str:
    """A YAML string; unquoted booleans and numbers get a hint to quote them."""
    if isinstance(value, str):
        return value
    hint = ""
    if isinstance(value, bool):
        hint = "; YAML reads unquoted yes/no/on/off/true/false as booleans, so quote it"
    elif isinstance(value, int | float):
        hint = "; quote it"
    raise InvalidValue(f"expected a string, got {describe(value)}{hint}")
