"""Reading config files: ``yaml.safe_load`` semantics on the C loader, duplicate keys rejected."""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode

from reactantserver.core.errors import ConfigError

try:
    from yaml import CSafeLoader as _BaseLoader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _BaseLoader  # type: ignore[assignment]

__all__ = ["load_yaml_file", "parse_yaml"]


class _StrictLoader(_BaseLoader):
    """The safe loader, except that a key written twice in one mapping is an error.

    Plain PyYAML keeps the last value silently, which hides a typo'd copy-paste.
    """

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable keys are reported by the base class
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def _invalid(exc: yaml.YAMLError, source: str) -> ConfigError:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}"
        what = "; ".join(part for part in (exc.context, exc.problem) if part)
        return ConfigError(f"{where}: invalid YAML: {what}")
    return ConfigError(f"{source}: invalid YAML: {exc}")


def parse_yaml(text: str, source: str = "<string>") -> object:
    """Parse one YAML document safely; syntax errors become :class:`ConfigError`.

    The message reads ``<source>:<line>:<column>: invalid YAML: <problem>``.
    """
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        raise _invalid(exc, source) from None


def load_yaml_file(path: Path) -> object:
    """Read and parse a config file; a missing or unreadable file is a :class:`ConfigError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    return parse_yaml(text, str(path))
