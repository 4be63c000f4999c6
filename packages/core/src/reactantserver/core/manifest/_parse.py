"""Manifest validation: every rule of the manifest grammar (docs/reference/manifest.md), applied to
loaded YAML data.

The first broken rule wins; checks run top-level keys → tensor lists → per-kind presence →
dtypes → batching → variants.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Mapping
from typing import Any

import attrs

from reactantserver.core.dtypes import DType
from reactantserver.core.errors import ManifestError
from reactantserver.core.manifest._check import Checker, child, describe, is_int, item
from reactantserver.core.manifest._tensors import ParsedTensor, parse_tensor_list
from reactantserver.core.manifest._types import (
    AxisLetters,
    Kind,
    Manifest,
    SourceFormat,
    Variant,
)
from reactantserver.core.types import Variable

_TOP_KEYS = frozenset(
    {
        "format_version",
        "name",
        "description",
        "kind",
        "meta",
        "executable_inputs",
        "executable_outputs",
        "client_inputs",
        "client_outputs",
        "batching",
        "input_shapes",
        "provenance",
    }
)
_FORMATS: dict[str, SourceFormat] = {"3.0": "3.0", "3": "3.0", "2.0": "2.0", "2": "2.0"}
_KINDS: tuple[Kind, ...] = ("model", "meta")
_FP8 = frozenset({DType.F8_E4M3, DType.F8_E5M2})


@attrs.frozen
class _Lists:
    """The four tensor lists as written; ``None`` where the key is absent (or null)."""

    executable_inputs: tuple[ParsedTensor, ...] | None
    executable_outputs: tuple[ParsedTensor, ...] | None
    client_inputs: tuple[ParsedTensor, ...] | None
    client_outputs: tuple[ParsedTensor, ...] | None


def parse_manifest(
    data: Mapping[str, Any],
    *,
    source: str,
    model_name: str,
    has_model_py: bool,
) -> Manifest:
    """Validate and normalise loaded manifest data.

    ``source`` names the file in error messages, ``model_name`` is the bundle's directory
    name and ``has_model_py`` says whether ``model.py`` sits next to the manifest. Raises
    :class:`~reactantserver.core.errors.ManifestError` naming file, key path and rule::

        manifest = parse_manifest(yaml.safe_load(text), source=str(path),
                                  model_name="resnet", has_model_py=False)
    """
    if not isinstance(data, Mapping):
        got = "an empty document" if data is None else describe(data)
        raise ManifestError(f"{source}: the top level must be a mapping, got {got}")
    written, source_format = _format_version(source, data)
    checker = Checker(source, legacy=source_format == "2.0")
    checker.unknown_keys(data, _TOP_KEYS, "")
    declared_name = _optional_string(checker, data, "name")
    description = _optional_string(checker, data, "description")
    kind = _kind(checker, data)
    meta_calls = _meta_calls(checker, data, kind, model_name)
    lists = _Lists(*(_tensor_list(checker, data, key) for key in attrs.fields_dict(_Lists)))
    sizes = _batch_sizes(checker, data)
    raw_variants = data.get("input_shapes")
    if raw_variants is not None:
        raw_variants = checker.sequence(raw_variants, "input_shapes")

    if kind == "meta":
        _check_meta(checker, lists, sizes, raw_variants, has_model_py)
        exe_in: tuple[ParsedTensor, ...] = ()
        exe_out: tuple[ParsedTensor, ...] = ()
        client_in = lists.client_inputs or ()
        client_out = lists.client_outputs or ()
        variants: tuple[Variant, ...] = ()
    else:
        exe_in, exe_out = _check_model(checker, lists, has_model_py)
        client_in = exe_in if lists.client_inputs is None else lists.client_inputs
        client_out = exe_out if lists.client_outputs is None else lists.client_outputs
        _check_executable_dtypes(checker, exe_in, exe_out)
        _check_batching(checker, exe_in, sizes)
        variants = _variants(checker, raw_variants, exe_in)
    _check_client_dtypes(checker, lists, client_in, client_out)

    return Manifest(
        source=source,
        source_format=source_format,
        format_version=written,
        name=model_name,
        kind=kind,
        declared_name=declared_name,
        description=description,
        meta_calls=meta_calls,
        executable_inputs=tuple(t.spec for t in exe_in),
        executable_outputs=tuple(t.spec for t in exe_out),
        client_inputs=tuple(t.spec for t in client_in),
        client_outputs=tuple(t.spec for t in client_out),
        client_inputs_declared=lists.client_inputs is not None,
        client_outputs_declared=lists.client_outputs is not None,
        compiled_batch_sizes=sizes,
        variants=variants,
        letters=AxisLetters(
            executable_inputs=tuple(t.letters for t in exe_in),
            executable_outputs=tuple(t.letters for t in exe_out),
            client_inputs=tuple(t.letters for t in client_in),
            client_outputs=tuple(t.letters for t in client_out),
        ),
        provenance=_provenance(checker, data),
    )


def _format_version(source: str, data: Mapping[str, Any]) -> tuple[str, SourceFormat]:
    checker = Checker(source)
    value = data.get("format_version")
    if value is None:
        checker.fail("format_version", 'required key is missing (expected "3.0" or "2.0")')
    # YAML reads `format_version: 3.0` as a float; numbers are accepted in string form.
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        checker.fail("format_version", f'must be "3.0" or "2.0", got {describe(value)}')
    written = str(value)
    if written not in _FORMATS:
        checker.fail(
            "format_version", f'unsupported format {written!r} (expected "3.0"/"3" or "2.0"/"2")'
        )
    return written, _FORMATS[written]


def _optional_string(checker: Checker, data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    return "" if value is None else checker.string(value, key)


def _kind(checker: Checker, data: Mapping[str, Any]) -> Kind:
    value = data.get("kind")
    if value is None:
        return "model"
    for kind in _KINDS:
        if value == kind:
            return kind
    raise checker.error("kind", f'must be "model" or "meta", got {describe(value)}')


def _meta_calls(
    checker: Checker, data: Mapping[str, Any], kind: Kind, model_name: str
) -> tuple[str, ...]:
    value = data.get("meta")
    if kind != "meta":
        if value is not None:
            checker.fail("meta", "allowed only with kind: meta")
        return ()
    if value is None:
        checker.fail("meta", "required for kind: meta (with key calls: a list of model names)")
    meta = checker.mapping(value, "meta")
    checker.unknown_keys(meta, ("calls",), "meta")
    if meta.get("calls") is None:
        checker.fail("meta.calls", "required key is missing (a list of model names; may be [])")
    calls = checker.sequence(meta["calls"], "meta.calls")
    seen: dict[str, int] = {}
    for index, callee in enumerate(calls):
        path = item("meta.calls", index)
        checker.string(callee, path)
        if callee in seen:
            checker.fail(
                path, f"duplicate callee {callee!r} (also {item('meta.calls', seen[callee])})"
            )
        if callee == model_name:
            checker.fail(path, f"a meta model must not call itself ({callee!r})")
        seen[callee] = index
    return tuple(calls)


def _tensor_list(
    checker: Checker, data: Mapping[str, Any], key: str
) -> tuple[ParsedTensor, ...] | None:
    value = data.get(key)
    return None if value is None else parse_tensor_list(checker, value, key)


def _batch_sizes(checker: Checker, data: Mapping[str, Any]) -> tuple[int, ...]:
    value = data.get("batching")
    if value is None:
        return ()
    batching = checker.mapping(value, "batching")
    checker.unknown_keys(batching, ("compiled_batch_sizes",), "batching")
    raw = batching.get("compiled_batch_sizes")
    if raw is None:
        return ()
    path = "batching.compiled_batch_sizes"
    seen: dict[int, int] = {}
    for index, size in enumerate(checker.sequence(raw, path)):
        if not is_int(size) or size <= 0:
            checker.fail(item(path, index), f"batch size must be an int > 0, got {describe(size)}")
        if size in seen:
            checker.fail(
                item(path, index), f"duplicate batch size {size} (also {item(path, seen[size])})"
            )
        seen[size] = index
    return tuple(sorted(seen))


def _check_meta(
    checker: Checker,
    lists: _Lists,
    sizes: tuple[int, ...],
    raw_variants: list[Any] | None,
    has_model_py: bool,
) -> None:
    if not has_model_py:
        checker.fail(
            "kind", "a meta model requires model.py next to the manifest (it registers run)"
        )
    for key in ("executable_inputs", "executable_outputs"):
        if getattr(lists, key):
            checker.fail(key, "must be absent or empty for kind: meta (a meta runs no module)")
    for key in ("client_inputs", "client_outputs"):
        if not getattr(lists, key):
            checker.fail(key, "required and non-empty for kind: meta")
    if sizes:
        checker.fail("batching.compiled_batch_sizes", "must be absent or empty for kind: meta")
    if raw_variants:
        checker.fail("input_shapes", "forbidden for kind: meta")


def _check_model(
    checker: Checker, lists: _Lists, has_model_py: bool
) -> tuple[tuple[ParsedTensor, ...], tuple[ParsedTensor, ...]]:
    if lists.executable_inputs is None:
        checker.fail(
            "executable_inputs",
            "required for kind: model (an empty list when the module takes only weights)",
        )
    if not lists.executable_outputs:
        checker.fail("executable_outputs", "required and non-empty for kind: model")
    if not has_model_py:
        for key in ("client_inputs", "client_outputs"):
            if getattr(lists, key) is not None:
                checker.fail(
                    key,
                    "allowed only when the bundle has model.py "
                    "(its hooks map client tensors to executable tensors)",
                )
    return lists.executable_inputs, lists.executable_outputs


def _check_executable_dtypes(
    checker: Checker, exe_in: tuple[ParsedTensor, ...], exe_out: tuple[ParsedTensor, ...]
) -> None:
    for key, tensors in (("executable_inputs", exe_in), ("executable_outputs", exe_out)):
        for index, tensor in enumerate(tensors):
            if tensor.spec.dtype is DType.BYTES:
                checker.fail(
                    f"{item(key, index)}.dtype",
                    f"tensor {tensor.spec.name!r}: bytes tensors are legal only in "
                    "client_inputs/client_outputs (a module has no bytes type)",
                )


def _check_client_dtypes(
    checker: Checker,
    lists: _Lists,
    client_in: tuple[ParsedTensor, ...],
    client_out: tuple[ParsedTensor, ...],
) -> None:
    for key, tensors in (("inputs", client_in), ("outputs", client_out)):
        declared = getattr(lists, f"client_{key}") is not None
        origin = f"client_{key}" if declared else f"executable_{key}"
        for index, tensor in enumerate(tensors):
            if tensor.spec.dtype in _FP8:
                why = "" if declared else f" (no client_{key} declared, so these are client-facing)"
                checker.fail(
                    f"{item(origin, index)}.dtype",
                    f"client-facing tensor {tensor.spec.name!r} needs a wire datatype; "
                    f"{tensor.spec.dtype.token} has none{why}",
                )


def _check_batching(
    checker: Checker, exe_in: tuple[ParsedTensor, ...], sizes: tuple[int, ...]
) -> None:
    batched = [t.spec.name for t in exe_in if t.spec.batch_axis is not None]
    if batched and len(batched) != len(exe_in):
        unbatched = [(i, t.spec.name) for i, t in enumerate(exe_in) if t.spec.batch_axis is None]
        names = ", ".join(f"`{name}`" for _, name in unbatched)
        checker.fail(
            item("executable_inputs", unbatched[0][0]),
            f"model mixes batched and unbatched inputs: {names} "
            f"(no batch letter n, while `{batched[0]}` has one); "
            "all executable inputs need a batch axis or none does",
        )
    if len(sizes) > 1 and not batched:
        checker.fail(
            "batching.compiled_batch_sizes",
            f"{len(sizes)} compiled batch sizes require a batch axis (letter n) "
            "on the executable inputs",
        )


def _variants(
    checker: Checker, raw: list[Any] | None, exe_in: tuple[ParsedTensor, ...]
) -> tuple[Variant, ...]:
    letters = _variable_letters(exe_in)
    if not letters:
        if raw:
            checker.fail(
                "input_shapes",
                "allowed only when an executable input has a VARIABLE axis (dims value -1)",
            )
        return ()
    if not raw:
        checker.fail(
            "input_shapes",
            f"required: the executable inputs have variable axes ({', '.join(letters.values())}); "
            "list one entry per compiled variant",
        )
    variants: list[Variant] = []
    seen: dict[tuple[int, ...], int] = {}
    for index, value in enumerate(raw):
        path = item("input_shapes", index)
        key = _variant_key(checker, value, path, letters)
        if key in seen:
            checker.fail(
                path, f"duplicate variant {list(key)} (also {item('input_shapes', seen[key])})"
            )
        seen[key] = index
        variants.append(Variant(index, key))
    return tuple(variants)


def _variable_letters(exe_in: tuple[ParsedTensor, ...]) -> dict[str, str]:
    """Variable letters in variant-key order, each with a ``tensor.letter`` description."""
    letters: dict[str, str] = {}
    for tensor in exe_in:
        for letter, dim in zip(tensor.letters, tensor.spec.shape, strict=True):
            if isinstance(dim, Variable):
                letters.setdefault(letter, f"{tensor.spec.name}.{letter}")
    return letters


def _variant_key(
    checker: Checker, value: object, path: str, letters: dict[str, str]
) -> tuple[int, ...]:
    entry = checker.mapping(value, path)
    for letter, size in entry.items():
        if letter not in letters:
            checker.fail(
                child(path, letter),
                f"{letter!r} is not a variable letter of the executable inputs "
                f"(variable: {', '.join(letters.values())})",
            )
        if not is_int(size) or size <= 0:
            checker.fail(child(path, letter), f"size must be an int > 0, got {describe(size)}")
    for letter in letters:
        if letter not in entry:
            checker.fail(child(path, letter), "missing: every variable letter needs a size")
    return tuple(int(entry[letter]) for letter in letters)


def _provenance(checker: Checker, data: Mapping[str, Any]) -> Mapping[str, Any]:
    value = data.get("provenance")
    if value is None:
        return types.MappingProxyType({})
    provenance = checker.mapping(value, "provenance")
    # Stored, never interpreted: a private deep copy keeps the caller's data from leaking in.
    return types.MappingProxyType(copy.deepcopy(dict(provenance)))
