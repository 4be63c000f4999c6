"""Tensor entries of a manifest: the shape-letter rules and the 2.0 → 3.0 normalisation.

A 3.0 entry ``{name: image, dtype: f32, shape: nchw, dims: {c: 3, h: 224, w: 224}}`` becomes
``TensorSpec("image", DType.F32, (Batch(), Fixed(3), Fixed(224), Fixed(224)))`` with letters
``"nchw"``. A 2.0 entry writes its letters column-major and may mark the batch axis ``b``; its
letters are reversed and ``b`` becomes ``n`` (2.0 ``whcn`` → 3.0 ``nchw``).
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

import attrs

from reactantserver.core.dtypes import DType
from reactantserver.core.manifest._check import Checker, child, describe, is_int, item
from reactantserver.core.types import Batch, Dim, Fixed, TensorSpec, Variable

BATCH_LETTER = "n"
"""The batch letter of format 3.0 (and the normalised form of 2.0's ``b``)."""

VARIABLE_SIZE = -1
"""The ``dims`` value of a VARIABLE axis."""

_LEGACY_BATCH_LETTERS = frozenset({"n", "b"})
_TENSOR_KEYS = frozenset({"name", "dtype", "shape", "dims"})
_LETTERS = frozenset(string.ascii_letters)


@attrs.frozen
class ParsedTensor:
    """A validated, normalised tensor entry: its spec and its row-major 3.0 axis letters."""

    spec: TensorSpec
    letters: str


def parse_tensor_list(checker: Checker, value: object, path: str) -> tuple[ParsedTensor, ...]:
    """Parse the tensor list at ``path``; names must be unique within the list."""
    entries = checker.sequence(value, path)
    seen: dict[str, int] = {}
    parsed: list[ParsedTensor] = []
    for index, entry in enumerate(entries):
        tensor = parse_tensor(checker, entry, item(path, index))
        name = tensor.spec.name
        if name in seen:
            checker.fail(
                f"{item(path, index)}.name",
                f"duplicate tensor name {name!r} (also {item(path, seen[name])})",
            )
        seen[name] = index
        parsed.append(tensor)
    return tuple(parsed)


def parse_tensor(checker: Checker, value: object, path: str) -> ParsedTensor:
    """Parse one tensor entry at ``path`` (``executable_inputs[0]``)."""
    entry = checker.mapping(value, path)
    checker.unknown_keys(entry, _TENSOR_KEYS, path)
    name = _required_string(checker, entry, "name", path)
    if not name:
        checker.fail(child(path, "name"), "tensor name must be non-empty")
    dtype = _dtype(checker, entry, path)
    shape = _required_string(checker, entry, "shape", path)
    dims_value = entry.get("dims")
    dims = {} if dims_value is None else checker.mapping(dims_value, child(path, "dims"))
    markers = _LEGACY_BATCH_LETTERS if checker.legacy else frozenset({BATCH_LETTER})
    _check_letters(checker, shape, markers, child(path, "shape"))
    sizes = _check_dims(checker, shape, dims, markers, child(path, "dims"))
    axes: list[Dim] = [_dim(letter, sizes, markers) for letter in shape]
    letters = shape
    if checker.legacy:
        # Julia writes axes column-major; the StableHLO (and the wire) see them reversed.
        axes.reverse()
        letters = "".join(BATCH_LETTER if c in markers else c for c in reversed(shape))
    return ParsedTensor(TensorSpec(name, dtype, tuple(axes)), letters)


def _required_string(checker: Checker, entry: Mapping[Any, Any], key: str, path: str) -> str:
    if key not in entry or entry[key] is None:
        checker.fail(child(path, key), "required key is missing")
    return checker.string(entry[key], child(path, key))


def _dtype(checker: Checker, entry: Mapping[Any, Any], path: str) -> DType:
    token = _required_string(checker, entry, "dtype", path)
    try:
        return DType.from_token(token)
    except ValueError as exc:
        checker.fail(child(path, "dtype"), str(exc))


def _check_letters(checker: Checker, shape: str, markers: frozenset[str], path: str) -> None:
    seen: set[str] = set()
    batch: list[str] = []
    for letter in shape:
        if letter not in _LETTERS:
            checker.fail(
                path,
                f"invalid character {letter!r} in shape {shape!r}: one ASCII letter per axis",
            )
        if letter in seen:
            checker.fail(path, f"letter {letter!r} occurs twice in shape {shape!r}")
        seen.add(letter)
        if letter in markers:
            batch.append(letter)
    if len(batch) > 1:
        checker.fail(
            path,
            f"shape {shape!r} has more than one batch letter ({', '.join(batch)}); "
            "at most one per tensor",
        )


def _check_dims(
    checker: Checker,
    shape: str,
    dims: Mapping[Any, Any],
    markers: frozenset[str],
    path: str,
) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for key, size in dims.items():
        key_path = child(path, key)
        if not isinstance(key, str) or len(key) != 1 or key not in _LETTERS:
            checker.fail(key_path, f"dims key must be a single letter, got {describe(key)}")
        if key in markers:
            checker.fail(
                key_path,
                f"{key!r} is the batch letter; its extent comes from the request, "
                "it is never a dims key",
            )
        if key not in shape:
            checker.fail(key_path, f"dims key {key!r} does not occur in shape {shape!r}")
        if not is_int(size) or (size <= 0 and size != VARIABLE_SIZE):
            checker.fail(
                key_path,
                f"dims value must be an int > 0 (fixed) or -1 (variable), got {describe(size)}",
            )
        sizes[key] = size
    for letter in shape:
        if letter not in markers and letter not in sizes:
            checker.fail(
                child(path, letter),
                f"missing: letter {letter!r} of shape {shape!r} needs a dims entry "
                "(only the batch letter has none)",
            )
    return sizes


def _dim(letter: str, sizes: Mapping[str, int], markers: frozenset[str]) -> Dim:
    if letter in markers:
        return Batch()
    size = sizes[letter]
    return Variable() if size == VARIABLE_SIZE else Fixed(size)
