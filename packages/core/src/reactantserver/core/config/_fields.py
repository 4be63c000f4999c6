"""Building blocks of the config classes: value rules, field helpers, closed choices.

A field's rule (``check``) runs twice: as an attrs validator when a class is built directly, and
as a per-field cattrs hook when a file is structured, so that errors name the full key path.
"""

import enum
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import attrs

from reactantserver.core.config.rules import (
    MAX_GRPC_MESSAGE_BYTES,
    MAX_PORT,
    Check,
    InvalidValue,
    between,
    non_empty,
)
from reactantserver.core.errors import ConfigError

__all__ = [
    "CHECK_KEY",
    "EACH_KEY",
    "ENV_ONLY_KEY",
    "FILE_KEY",
    "GIB",
    "HAND_PARSED_KEY",
    "HOOK_THREADS_CAP",
    "MAX_GRPC_MESSAGE_BYTES",
    "MAX_PORT",
    "PARSE_KEY",
    "REQUIRED_HINT_KEY",
    "STRUCTURE_KEY",
    "Check",
    "Choice",
    "InvalidValue",
    "between",
    "check_octal_mode",
    "env_only",
    "non_empty",
    "required_setting",
    "setting",
]

GIB: Final = 1 << 30
#: Upper bound of the default hook-pool size, ``min(cpu_count, 16)``.
HOOK_THREADS_CAP: Final = 16

#: attrs metadata keys read by the structuring, key-walking and env code.
CHECK_KEY: Final = "reactantserver.check"
STRUCTURE_KEY: Final = "reactantserver.structure"
ENV_ONLY_KEY: Final = "reactantserver.env_only"
EACH_KEY: Final = "reactantserver.each"
PARSE_KEY: Final = "reactantserver.parse"
REQUIRED_HINT_KEY: Final = "reactantserver.required_hint"
#: A field that cattrs leaves alone because the loader parses it by hand.
HAND_PARSED_KEY: Final = "reactantserver.hand_parsed"
#: How a field is spelled in the file when that is not its name; ``None``: not a file key.
FILE_KEY: Final = "reactantserver.file_key"

_T = TypeVar("_T")

_OCTAL_MODE = re.compile(r"[0-7]{1,4}")
_MAX_MODE: Final = 0o777


def check_octal_mode(value: Any) -> str | None:
    """Rule of ``runtime.shared_host_weights_mode``: an octal permission string up to ``777``."""
    if not isinstance(value, str) or not _OCTAL_MODE.fullmatch(value):
        return 'must be an octal permission string such as "660"'
    if int(value, 8) > _MAX_MODE:
        return "must be <= 777 (no setuid, setgid or sticky bits)"
    return None


def _validator(
    check: Check | None, each: Check | None
) -> Callable[[Any, "attrs.Attribute[Any]", Any], None]:
    def validate(_instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        lines = []
        if each is not None:
            items = value.items() if isinstance(value, Mapping) else enumerate(value)
            for key, item in items:
                problem = each(item)
                if problem is not None:
                    where = f"[{key}]" if isinstance(key, int) else f".{key}"
                    lines.append(f"{attribute.name}{where}: {problem}, got {item!r}")
        problem = check(value) if check is not None else None
        if problem is not None:
            lines.append(f"{attribute.name}: {problem}, got {value!r}")
        if lines:
            raise ConfigError("\n".join(lines))

    return validate


def setting(
    default: Any = attrs.NOTHING,
    *,
    check: Check | None = None,
    each: Check | None = None,
    structure: Callable[[object], object] | None = None,
    parse: Callable[[object], object] | None = None,
    converter: Callable[[Any], Any] | None = None,
    factory: Callable[[], Any] | None = None,
    required_hint: str = "",
) -> Any:
    """A config key: its default (none: required), its rule and, rarely, how it is read.

    ``check`` is the value's rule and ``each`` the rule of every list item or mapping value;
    ``structure`` rewrites the raw value first and ``parse`` replaces the type-driven reading
    (values that are not one plain type, such as ``int | "all"``); ``converter`` and ``factory``
    are attrs'. ``required_hint`` extends "required key missing".
    """
    metadata: dict[str, object] = {}
    for key, value in (
        (CHECK_KEY, check),
        (EACH_KEY, each),
        (STRUCTURE_KEY, structure),
        (PARSE_KEY, parse),
        (REQUIRED_HINT_KEY, required_hint or None),
    ):
        if value is not None:
            metadata[key] = value
    validator = _validator(check, each) if check is not None or each is not None else None
    return attrs.field(
        default=attrs.Factory(factory) if factory is not None else default,
        validator=validator,
        converter=converter,
        metadata=metadata,
        # A mapping default is not hashable; the class stays hashable without it.
        hash=False if factory is not None else None,
    )


def required_setting(check: Check) -> Any:
    """A config key without a default (``model_repo``, a worker entry's ``name``)."""
    return setting(check=check)


def env_only(default: _T, *, eq: bool = True) -> _T:
    """A field set from the process environment by the loader, never a file key."""
    return attrs.field(default=default, eq=eq, metadata={ENV_ONLY_KEY: True})


# Alias spellings accepted on input and normalised to the canonical value.
_ALIASES: Final[Mapping[str, Mapping[str, str]]] = {
    "Backend": {"gpu": "cuda"},
    "Residency": {"pinned_system": "system", "pinned_device": "device"},
    # Triton's --model-control-mode names.
    "ModelControlMode": {"none": "static", "poll": "dynamic"},
}


class Choice(enum.StrEnum):
    """A closed set of spellings; unknown spellings are resolved through ``_ALIASES``."""

    @classmethod
    def _missing_(cls, value: object) -> Any:
        if isinstance(value, str):
            canonical = _ALIASES.get(cls.__name__, {}).get(value)
            if canonical is not None:
                return cls(canonical)
        return None

    @classmethod
    def spellings(cls) -> str:
        """Every accepted spelling, for error messages: ``cpu, cuda (alias gpu)``."""
        aliases = _ALIASES.get(cls.__name__, {})
        parts = []
        for member in cls:
            extra = [alias for alias, target in aliases.items() if target == member.value]
            parts.append(member.value + (f" (alias {', '.join(extra)})" if extra else ""))
        return ", ".join(parts)
