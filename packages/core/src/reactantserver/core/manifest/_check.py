"""Error reporting and YAML type checks shared by the manifest parser modules.

Every failure is a :class:`~reactantserver.core.errors.ManifestError` whose message reads
``<file>: <key path>: <rule>``, e.g.
``/models/m/manifest.yaml: client_inputs[1].dims.k: dims value must be an int > 0 or -1``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, NoReturn

import attrs

from reactantserver.core.errors import ManifestError


def child(parent: str, key: object) -> str:
    """The key path of mapping key ``key`` under ``parent`` (``"a.b"``)."""
    return f"{parent}.{key}" if parent else str(key)


def item(parent: str, index: int) -> str:
    """The key path of list element ``index`` under ``parent`` (``"a[1]"``)."""
    return f"{parent}[{index}]"


def describe(value: object) -> str:
    """A short rendering of an offending YAML value for error messages."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


def is_int(value: object) -> bool:
    """Whether ``value`` is a YAML integer; booleans are ints to Python but not here."""
    return isinstance(value, int) and not isinstance(value, bool)


@attrs.frozen
class Checker:
    """Raises manifest errors for one file; ``legacy`` is set for format 2.0 manifests."""

    source: str
    legacy: bool = False

    def error(self, path: str, rule: str) -> ManifestError:
        """A ManifestError naming the file, the key path and the rule broken."""
        where = f"{path}: " if path else ""
        return ManifestError(f"{self.source}: {where}{rule}")

    def fail(self, path: str, rule: str) -> NoReturn:
        """Raise :meth:`error`."""
        raise self.error(path, rule)

    def mapping(self, value: object, path: str) -> Mapping[Any, Any]:
        """``value`` as a mapping, or a ManifestError."""
        if not isinstance(value, Mapping):
            self.fail(path, f"must be a mapping, got {describe(value)}")
        return value

    def sequence(self, value: object, path: str) -> list[Any]:
        """``value`` as a list (YAML sequence), or a ManifestError."""
        if not isinstance(value, list | tuple):
            self.fail(path, f"must be a list, got {describe(value)}")
        return list(value)

    def string(self, value: object, path: str) -> str:
        """``value`` as a string, or a ManifestError."""
        if not isinstance(value, str):
            self.fail(path, f"must be a string, got {describe(value)}")
        return value

    def unknown_keys(self, mapping: Mapping[Any, Any], allowed: Collection[str], path: str) -> None:
        """Reject keys outside ``allowed`` (format 3.0); format 2.0 ignores them."""
        if self.legacy:
            return
        for key in mapping:
            if key not in allowed:
                expected = ", ".join(sorted(allowed))
                self.fail(child(path, key), f"unknown key (expected one of: {expected})")
