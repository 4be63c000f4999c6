"""Writing a bundle: ``manifest.yaml`` (format 3.0), ``weights.safetensors``, modules, ``model.py``.

The manifest is checked with core's parser before anything is written, so a bundle this
module publishes always loads::

    write_bundle(
        Path("models/mlp"),
        name="mlp",
        executable_inputs=["x=f32[n,f=16]"],
        executable_outputs=["logits=f32[n,k=4]"],
        modules={1: b1, 8: b8},
        weights=[("dense/w", w), ("dense/b", b)],
    )
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeAlias

import yaml  # type: ignore[import-untyped,unused-ignore]

from reactantserver.core.errors import ManifestError
from reactantserver.core.manifest import (
    MANIFEST_FILENAME,
    MODEL_PY_FILENAME,
    WEIGHTS_FILENAME,
    module_filename,
    parse_manifest,
)
from reactantserver.core.types import TensorSpec
from reactantserver.export._errors import ExportError
from reactantserver.export._publish import staged_bundle, write_file
from reactantserver.export._spec import TensorDecl, as_decls
from reactantserver.export._weights_file import write_weights

__all__ = ["FORMAT_VERSION", "ModuleKey", "TensorLike", "render_manifest", "write_bundle"]

FORMAT_VERSION = "3.0"
"""The manifest format the exporter writes."""

ModuleKey: TypeAlias = int | tuple[int, int]
TensorLike: TypeAlias = TensorDecl | TensorSpec | str

_TENSOR_LISTS = ("executable_inputs", "executable_outputs", "client_inputs", "client_outputs")
_FLOW_KEYS = frozenset({"batching", "meta"})
_RESERVED = frozenset({MANIFEST_FILENAME, WEIGHTS_FILENAME, MODEL_PY_FILENAME})


def _flow(value: Any) -> str:
    text: str = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 16)
    return text.strip()


def render_manifest(data: Mapping[str, Any]) -> str:
    """YAML text of a manifest mapping, laid out like the examples in docs/reference/manifest.md:
    one flow
    mapping per tensor entry, flow style for ``batching``/``meta``/``input_shapes``."""
    chunks = []
    for key, value in data.items():
        if key in _TENSOR_LISTS or key == "input_shapes":
            chunks.append(f"{key}:\n" + "".join(f"  - {_flow(entry)}\n" for entry in value))
        elif key in _FLOW_KEYS:
            chunks.append(f"{key}: {_flow(value)}\n")
        else:
            chunks.append(
                yaml.safe_dump(
                    {key: value}, default_flow_style=False, sort_keys=False, allow_unicode=True
                )
            )
    return "".join(chunks)


def _normalise_key(key: ModuleKey, variant_count: int) -> tuple[int | None, int]:
    if isinstance(key, tuple):
        variant, batch = key
        if not 0 <= variant < variant_count:
            raise ExportError(
                f"module key {key}: variant {variant} is not one of the {variant_count} "
                "input_shapes entries (a (variant, batch size) key needs input_shapes)"
            )
        return variant, batch
    if variant_count:
        raise ExportError(
            f"module key {key}: with input_shapes, key modules by (variant, batch size)"
        )
    return None, key


def _module_files(
    modules: Mapping[ModuleKey, bytes], variant_count: int
) -> tuple[list[int], dict[str, bytes]]:
    """The compiled batch sizes and ``{file name: bytes}`` for the module map."""
    if not modules:
        raise ExportError("a model bundle needs at least one module")
    keyed = {_normalise_key(key, variant_count): bytes(data) for key, data in modules.items()}
    sizes = sorted({batch for _, batch in keyed})
    if any(b < 0 for b in sizes):
        raise ExportError(f"module batch sizes must be >= 0 (0 = unbatched), got {sizes}")
    if 0 in sizes and len(sizes) > 1:
        raise ExportError(f"batch size 0 (the unbatched model.mlir) mixed with {sizes[1:]}")
    variants: list[int | None] = list(range(variant_count)) if variant_count else [None]
    files = {}
    for index in variants:
        for batch in sizes:
            data = keyed.get((index, batch))
            if not data:
                raise ExportError(
                    f"no module for variant {index} at batch size {batch} "
                    "(every variant needs every batch size, and modules are non-empty)"
                )
            files[module_filename(index, batch)] = data
    return [b for b in sizes if b > 0], files


def _check_extra_files(extra_files: Mapping[str, bytes], modules: Mapping[str, bytes]) -> None:
    for file_name in extra_files:
        bad = file_name in _RESERVED or file_name in modules or file_name in {"", ".", ".."}
        if bad or "/" in file_name:
            raise ExportError(f"extra file name {file_name!r} is not allowed in a bundle")


def _model_py_source(model_py: str | os.PathLike[str]) -> bytes:
    if isinstance(model_py, str):
        return model_py.encode()
    try:
        return Path(model_py).read_bytes()
    except OSError as exc:
        raise ExportError(f"model.py source {model_py}: cannot read: {exc}") from exc


def build_manifest(
    *,
    name: str,
    kind: Literal["model", "meta"],
    description: str,
    meta_calls: Sequence[str] | None,
    tensors: Mapping[str, Sequence[TensorDecl] | None],
    batch_sizes: Sequence[int],
    input_shapes: Sequence[Mapping[str, int]] | None,
    provenance: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The manifest mapping, keys in the order of the manifest grammar."""
    data: dict[str, Any] = {"format_version": FORMAT_VERSION, "name": name}
    if description:
        data["description"] = description
    data["kind"] = kind
    if kind == "meta":
        data["meta"] = {"calls": list(meta_calls or ())}
    for key in _TENSOR_LISTS:
        decls = tensors.get(key)
        if decls is not None:
            data[key] = [decl.manifest_entry() for decl in decls]
    if batch_sizes:
        data["batching"] = {"compiled_batch_sizes": list(batch_sizes)}
    if input_shapes:
        data["input_shapes"] = [{k: int(v) for k, v in shape.items()} for shape in input_shapes]
    if provenance:
        data["provenance"] = dict(provenance)
    return data


def write_bundle(
    out: str | os.PathLike[str],
    *,
    name: str,
    executable_inputs: Sequence[TensorLike] = (),
    executable_outputs: Sequence[TensorLike] = (),
    modules: Mapping[ModuleKey, bytes] | None = None,
    weights: Sequence[tuple[str, Any]] = (),
    client_inputs: Sequence[TensorLike] | None = None,
    client_outputs: Sequence[TensorLike] | None = None,
    input_shapes: Sequence[Mapping[str, int]] | None = None,
    provenance: Mapping[str, Any] | None = None,
    model_py: str | os.PathLike[str] | None = None,
    kind: Literal["model", "meta"] = "model",
    meta_calls: Sequence[str] | None = None,
    description: str = "",
    force: bool = False,
    extra_files: Mapping[str, bytes] | None = None,
    on_weights_written: Callable[[], None] | None = None,
) -> Path:
    """Write and atomically publish a bundle at ``out`` (whose basename must be ``name``).

    ``modules`` maps a batch size (0 = the unbatched ``model.mlir``) or, with
    ``input_shapes``, a ``(variant index, batch size)`` pair to StableHLO bytes (text or
    portable artifact). ``weights`` is the ordered ``(name, array)`` list: the order is
    ``argument_order``. ``model_py`` is the hook source: a path to copy, or the source as a
    ``str``. ``kind="meta"`` writes a meta bundle (``model.py``, ``meta_calls`` and client
    tensors; no modules, no weights). ``extra_files`` are written next to the manifest (e.g.
    text copies of the modules); the loader ignores them. ``on_weights_written`` is called
    once the weights are on disk (progress display). An existing bundle is replaced only with
    ``force``. Returns the bundle path.
    """
    final = Path(out)
    if name != final.name:
        raise ExportError(
            f"model name {name!r} must be the bundle directory's name ({final.name!r}); "
            "the server names a model by its directory"
        )
    tensors: dict[str, Sequence[TensorDecl] | None] = {
        "executable_inputs": as_decls(executable_inputs, "executable_inputs"),
        "executable_outputs": as_decls(executable_outputs, "executable_outputs"),
        "client_inputs": None
        if client_inputs is None
        else as_decls(client_inputs, "client_inputs"),
        "client_outputs": None
        if client_outputs is None
        else as_decls(client_outputs, "client_outputs"),
    }
    model_source = None if model_py is None else _model_py_source(model_py)
    files: dict[str, bytes] = {}
    batch_sizes: list[int] = []
    if kind == "meta":
        if modules or weights or executable_inputs or executable_outputs or input_shapes:
            raise ExportError(
                "a meta bundle has no modules, weights, executable tensors or input_shapes"
            )
        del tensors["executable_inputs"], tensors["executable_outputs"]
    else:
        if meta_calls:
            raise ExportError("meta_calls is only for kind='meta'")
        batch_sizes, files = _module_files(modules or {}, len(input_shapes or ()))
    _check_extra_files(extra_files or {}, files)
    data = build_manifest(
        name=name,
        kind=kind,
        description=description,
        meta_calls=meta_calls,
        tensors=tensors,
        batch_sizes=batch_sizes,
        input_shapes=input_shapes,
        provenance=provenance,
    )
    text = render_manifest(data)
    try:
        # Re-read the rendered text: what is checked is exactly what the server will parse.
        parse_manifest(
            yaml.safe_load(text),
            source=str(final / MANIFEST_FILENAME),
            model_name=final.name,
            has_model_py=model_source is not None,
        )
    except ManifestError as exc:
        raise ExportError(f"the bundle would not load: {exc}") from exc

    with staged_bundle(final, force=force) as staging:
        if kind == "model":
            write_weights(staging / WEIGHTS_FILENAME, weights)
        if on_weights_written is not None:
            on_weights_written()
        for file_name, module in files.items():
            write_file(staging / file_name, module)
        if model_source is not None:
            write_file(staging / MODEL_PY_FILENAME, model_source)
        for file_name, extra in (extra_files or {}).items():
            write_file(staging / file_name, extra)
        write_file(staging / MANIFEST_FILENAME, text.encode())
    return Path(os.path.abspath(final))
