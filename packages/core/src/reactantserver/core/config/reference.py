"""The configuration reference, generated from the schema: every key, type, default, variable.

The attrs classes are the schema: a key's type is its annotation, its default the field's, its
description the docstring written under it (or the ``#:`` comment above it). This module walks
a configuration class into :class:`KeyRow` s and renders them as Markdown, so
``docs/reference/configuration.md`` is regenerated rather than written by hand (``python
tools/config_reference.py``; a test fails when the committed page is stale)::

    rows = key_rows(WorkerConfig, variable=worker_variable)
    print(markdown_table(rows))
"""

from __future__ import annotations

import ast
import enum
import functools
import inspect
import re
import sys
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from reactantserver.core.config._env import env_name
from reactantserver.core.config._fields import ENV_ONLY_KEY
from reactantserver.core.config._schema import WorkerConfig

__all__ = ["KeyRow", "key_rows", "markdown_table", "worker_variable"]

# Section citations of the design documents the docstrings grew from, not in this repository.
_CITATION = re.compile(r" ?\((?:beyond,? ?)?\d\d(?: ?§[^)]*)?(?:, ?\d\d(?: ?§[^)]*)?)*\)")


@attrs.frozen
class KeyRow:
    """One configuration key as the reference lists it."""

    key: str
    type: str
    default: str
    variable: str
    description: str


def _worker_keys() -> frozenset[str]:
    return frozenset(".".join(path) for path in _leaf_paths(WorkerConfig, ()))


def _leaf_paths(cls: type, prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    hints = typing.get_type_hints(cls)
    for field in attrs.fields(cls):
        tp = hints[field.name]
        if isinstance(tp, type) and attrs.has(tp):
            yield from _leaf_paths(tp, (*prefix, field.name))
        else:
            yield (*prefix, field.name)


def worker_variable(path: tuple[str, ...]) -> str:
    """The ``REACTANTSERVER_WORKER_*`` variable of a worker key (every worker key has one)."""
    return env_name(path)


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under it or the ``#:`` comment above it, in ``cls``'s source."""
    source = inspect.getsource(sys.modules[cls.__module__])
    lines = source.splitlines()
    tree = ast.parse(source)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs: dict[str, str] = {}
    body = node.body
    for index, statement in enumerate(body):
        if not isinstance(statement, ast.AnnAssign) or not isinstance(statement.target, ast.Name):
            continue
        name = statement.target.id
        following = body[index + 1] if index + 1 < len(body) else None
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[name] = following.value.value
            continue
        comments: list[str] = []
        line = statement.lineno - 2
        while line >= 0 and lines[line].strip().startswith("#:"):
            comments.insert(0, lines[line].strip().removeprefix("#:").strip())
            line -= 1
        if comments:
            docs[name] = " ".join(comments)
    return docs


@functools.cache
def _annotations(cls: type) -> dict[str, str]:
    source = inspect.getsource(cls)
    node = ast.parse(inspect.cleandoc(source) if source[:1].isspace() else source).body[0]
    assert isinstance(node, ast.ClassDef)
    return {
        s.target.id: ast.unparse(s.annotation)
        for s in node.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    }


def _plain(text: str) -> str:
    text = _CITATION.sub("", " ".join(text.split()))
    return text.replace("|", "\\|")


def _show(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, enum.Enum):
        text = str(value.value)
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, str):
        text = f'"{value}"'
    elif isinstance(value, tuple | list):
        text = "[" + ", ".join(str(v) for v in value) + "]"
    elif isinstance(value, Mapping):
        text = str(dict(value)) if value else "{}"
    else:
        text = str(value)
    return f"`{text}`"


def _default(field: attrs.Attribute[Any]) -> str:
    default: Any = field.default
    if default is attrs.NOTHING:
        return "required"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        if default.takes_self:
            return "derived"
        return _show(default.factory())
    return _show(default)


def key_rows(
    cls: type,
    *,
    variable: Callable[[tuple[str, ...]], str],
    prefix: tuple[str, ...] = (),
    skip: Sequence[str] = (),
    rename: Mapping[str, str] | None = None,
) -> list[KeyRow]:
    """Every key of the configuration class ``cls``, nested sections flattened to dotted keys.

    ``variable`` names a key's environment variables (", "-separated; "" for none);
    ``skip`` lists top-level fields that are not file keys; ``rename`` maps a field to its file
    key where they differ. Fields the loader sets from the environment are left out.
    """
    hints = typing.get_type_hints(cls)
    docs: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for base in reversed([c for c in cls.__mro__ if attrs.has(c)]):  # a subclass's win
        docs.update(_field_docs(base))
        annotations.update(_annotations(base))
    rows: list[KeyRow] = []
    for field in attrs.fields(cls):
        if field.name in skip or field.metadata.get(ENV_ONLY_KEY):
            continue
        path = (*prefix, (rename or {}).get(field.name, field.name))
        tp = hints[field.name]
        if isinstance(tp, type) and attrs.has(tp):
            rows += key_rows(tp, variable=variable, prefix=path)
            continue
        rows.append(
            KeyRow(
                key=".".join(path),
                type=annotations.get(field.name, str(tp)),
                default=_default(field),
                variable=variable(path),
                description=_plain(docs.get(field.name, "")),
            )
        )
        item, entry = _nested(tp, path)
        if item is not None:
            rows += key_rows(item, variable=lambda _p: "", prefix=entry)
    return rows


def _nested(tp: object, path: tuple[str, ...]) -> tuple[type | None, tuple[str, ...]]:
    """The attrs class inside a map (``key.<name>.*``) or a list (``key[].*``) of them."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is Mapping and args and attrs.has(args[-1]):
        return args[-1], (*path, "<name>")
    for arg in args:  # tuple[X, ...] | None
        inner = typing.get_args(arg) if typing.get_origin(arg) is tuple else (arg,)
        if inner and isinstance(inner[0], type) and attrs.has(inner[0]):
            return inner[0], (*path[:-1], f"{path[-1]}[]")
    return None, path


def markdown_table(rows: Sequence[KeyRow]) -> str:
    """``rows`` as a Markdown table: key, type, default, variable, meaning."""
    lines = [
        "| Key | Type | Default | Environment variable | Meaning |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        variable = ", ".join(f"`{name}`" for name in row.variable.split(", ") if name)
        lines.append(
            f"| `{row.key}` | `{row.type.replace('|', chr(92) + '|')}` | {row.default} "
            f"| {variable} | {row.description} |"
        )
    return "\n".join(lines) + "\n"
