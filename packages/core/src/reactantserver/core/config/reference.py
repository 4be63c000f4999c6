"""The configuration reference in Markdown, generated from the schema classes themselves.

Each key's type and default come from its attrs field, its description from the field's
docstring (the string under it, or ``#:`` comments above it) without spec citations, and its
environment variable from the table the caller passes::

    text = render_reference("Configuration", "", [worker_section])

``tools/config_reference.py`` writes ``docs/reference/configuration.md`` from the worker, node
and gateway schemas; a test fails when the committed file differs from a fresh rendering.
"""

from __future__ import annotations

import ast
import enum
import functools
import inspect
import math
import re
import textwrap
import types
import typing
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

import attrs

from reactantserver.core.config._fields import ENV_ONLY_KEY, FILE_KEY

__all__ = ["ReferenceSection", "render_reference", "strip_citations"]

# "(04 §Request admission)", "(beyond, 04)", "(09 beyond)", "(02)" and such atoms in longer
# parentheses ("(as the worker's, 02)"): references into the spec, meaningless to a reader here.
_CITATION_ATOM: Final = re.compile(r"(?:beyond|\d{2}(?:\s+§[^,;:)]*|\s+beyond)?)")
_PARENTHESES: Final = re.compile(r"\s*\(([^()]*)\)")
_ATOM_SEPARATOR: Final = re.compile(r"\s*[,;:]\s*")
_ROLE: Final = re.compile(r":[a-z]+:`~?(?:[\w.]*\.)?([^`]+)`")
_KEY_LEAD: Final = re.compile(r"^`[^`]+`: ")


@attrs.frozen
class ReferenceSection:
    """One configuration file of the reference.

    ``schema`` is its root attrs class; ``variables`` maps a dotted key to the environment
    variables that set it; ``intro`` is Markdown written under the title.
    """

    title: str
    intro: str
    schema: type
    variables: Mapping[str, Sequence[str]] = attrs.field(factory=dict)


def strip_citations(text: str) -> str:
    """``text`` without spec citations: ``"Waits (beyond, 04); 0 never"`` → ``"Waits; 0 never"``.

    A parenthesis made only of citations goes; in a longer one only the citations go.
    """

    def keep(match: re.Match[str]) -> str:
        atoms = _ATOM_SEPARATOR.split(match.group(1).strip())
        if not any(_CITATION_ATOM.fullmatch(atom) for atom in atoms):
            return match.group(0)
        rest = [atom for atom in atoms if not _CITATION_ATOM.fullmatch(atom)]
        return f" ({', '.join(rest)})" if rest else ""

    return _PARENTHESES.sub(keep, text)


def _markdown(text: str) -> str:
    # reStructuredText roles and double backquotes to Markdown code spans, one line.
    text = _ROLE.sub(r"`\1`", text).replace("``", "`")
    return " ".join(strip_citations(text).split()).replace("|", "\\|")


@functools.cache
def _field_docs(cls: type) -> Mapping[str, str]:
    # The string under a field, else the ``#:`` comments above it.
    lines, _start = inspect.getsourcelines(cls)
    source = textwrap.dedent("".join(lines))
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef)
    text_lines = source.splitlines()
    docs: dict[str, str] = {}
    body = node.body
    for index, stmt in enumerate(body):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        after = body[index + 1] if index + 1 < len(body) else None
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
            continue
        comments: list[str] = []
        row = stmt.lineno - 2
        while row >= 0 and text_lines[row].strip().startswith("#:"):
            comments.insert(0, text_lines[row].strip().removeprefix("#:").strip())
            row -= 1
        if comments:
            docs[stmt.target.id] = " ".join(comments)
    return docs


def _field_doc(cls: type, name: str) -> str:
    # Inherited fields are documented where they are declared.
    for klass in cls.__mro__:
        if attrs.has(klass) and name in _field_docs(klass):
            return _field_docs(klass)[name]
    return ""


def _summary(cls: type) -> str:
    # The docstring's first paragraph, less its "``runtime.*``:" lead (the heading says it).
    text = _markdown((inspect.getdoc(cls) or "").split("\n\n")[0])
    text = _KEY_LEAD.sub("", text)
    return text[:1].upper() + text[1:]


def _optional_inner(tp: object) -> object | None:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [arg for arg in args if arg is not type(None)]
        return rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007
    return None


_SCALAR_NAMES: Final[Mapping[object, str]] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    typing.Any: "any",
}


def _type_text(tp: object) -> str:
    inner = _optional_inner(tp)
    if inner is not None:
        return f"{_type_text(inner)} or null"
    if tp in _SCALAR_NAMES:
        return _SCALAR_NAMES[tp]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _choices(member.value for member in tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        text = _choices(args)
    elif origin in (typing.Union, types.UnionType):
        text = ", ".join(_type_text(arg) for arg in args)
    elif origin is tuple:
        text = "list of " + ("entries" if attrs.has(args[0]) else _plural(_type_text(args[0])))
    elif origin in (Mapping, dict):
        value = args[1]
        plain = attrs.has(value) or value is typing.Any
        text = "mapping" if plain else "mapping of " + _plural(_type_text(value))
    else:
        raise TypeError(f"no reference text for {tp!r}")  # pragma: no cover - schema bug
    return text


def _choices(values: Iterable[object]) -> str:
    return " \\| ".join(f"`{value}`" for value in values)


def _plural(text: str) -> str:
    return text if text.startswith("`") or text.endswith("s") else text + "s"


def _default_text(field: attrs.Attribute[Any]) -> str:
    default = field.default
    if default is attrs.NOTHING:
        return "required"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default = default.factory()  # type: ignore[union-attr]
    return f"`{_value_text(default)}`"


def _value_text(value: object) -> str:
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, enum.Enum):
        text = str(value.value)
    elif isinstance(value, float) and math.isinf(value):
        text = "inf"
    elif isinstance(value, str):
        text = f'"{value}"'
    elif isinstance(value, tuple | list):
        text = "[" + ", ".join(_value_text(item) for item in value) + "]"
    elif isinstance(value, Mapping):
        text = "{}" if not value else repr(dict(value))
    else:
        text = repr(value)
    return text


def _entry_class(tp: object) -> tuple[type, str] | None:
    # A nested section: an attrs class, a list of them (``workers[]``) or a map of them.
    tp = _optional_inner(tp) or tp
    if isinstance(tp, type) and attrs.has(tp):
        return tp, ""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple and args and attrs.has(args[0]):
        return args[0], "[]"
    if origin in (Mapping, dict) and len(args) == 2 and attrs.has(args[1]):
        return args[1], ".<name>"
    return None


def _keys(cls: type) -> Iterator[tuple[str, attrs.Attribute[Any]]]:
    attrs.resolve_types(cls)
    for field in attrs.fields(cls):
        key = field.metadata.get(FILE_KEY, field.name)
        if key is not None and not field.metadata.get(ENV_ONLY_KEY):
            yield key, field


def _tables(
    cls: type, prefix: str, variables: Mapping[str, Sequence[str]], level: int
) -> Iterator[str]:
    rows: list[str] = []
    nested: list[tuple[type, str]] = []
    for key, field in _keys(cls):
        dotted = prefix + key
        entry = _entry_class(field.type)
        if entry is not None:
            nested.append((entry[0], dotted + entry[1]))
            continue
        names = variables.get(dotted, ())
        variable = ", ".join(f"`{name}`" for name in names) or "—"
        # A placeholder key ("<worker key>") stands for keys documented elsewhere.
        placeholder = key.startswith("<")
        type_text = "—" if placeholder else _type_text(field.type)
        default = "—" if placeholder else _default_text(field)
        rows.append(
            f"| `{dotted}` | {type_text} | {default} | {variable} "
            f"| {_markdown(_field_doc(cls, field.name))} |"
        )
    if rows:
        title = f"`{prefix}*`" if prefix else "Top-level keys"
        yield f"{'#' * level} {title}\n"
        summary = _summary(cls) if prefix else ""
        if summary:
            yield f"{summary}\n"
        yield "| Key | Type | Default | Environment variable | Description |"
        yield "|---|---|---|---|---|"
        yield from rows
        yield ""
    for child, path in nested:
        yield from _tables(child, path + ".", variables, level)


def render_reference(title: str, intro: str, sections: Sequence[ReferenceSection]) -> str:
    """The Markdown reference of ``sections``: one table of keys per configuration section."""
    parts = [f"# {title}\n", f"{intro.strip()}\n"] if intro.strip() else [f"# {title}\n"]
    for section in sections:
        parts.append(f"## {section.title}\n")
        if section.intro.strip():
            parts.append(f"{section.intro.strip()}\n")
        parts.extend(_tables(section.schema, "", section.variables, 3))
    return "\n".join(parts).rstrip() + "\n"
