"""``export_jax``: a JAX function with explicit weights -> a published bundle.

The procedure is shared with the PyTorch path (:func:`export_flat` takes one flat callable
per module); everything is lowered and gated before the first byte is written::

    export_jax(forward, params, ["x=f32[n,f=16]"], ["logits"], batch_sizes=(1, 8, 32),
               out="models/mlp")
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax

from reactantserver.core.dtypes import DType
from reactantserver.core.manifest import MODEL_NAME_PATTERN, is_valid_model_name, module_filename
from reactantserver.export._bundle import ModuleKey, TensorLike, write_bundle
from reactantserver.export._errors import ExportError
from reactantserver.export._gate import ArgSpec
from reactantserver.export._lower import FlatCall, LoweredModule, lower_module
from reactantserver.export._outputs import ModuleIndex, declare_outputs
from reactantserver.export._params import flatten_params
from reactantserver.export._progress import Progress
from reactantserver.export._provenance import collect_provenance
from reactantserver.export._spec import TensorDecl, as_decls
from reactantserver.export._template import hooks_template
from reactantserver.export._weights_file import as_weight

__all__ = [
    "bundle_path",
    "checked_batch_sizes",
    "export_flat",
    "export_jax",
    "needs_x64",
    "source_dir_of",
]

_log = logging.getLogger("reactantserver.export")
_WIDE = frozenset({DType.I64, DType.U64, DType.F64})


def needs_x64(dtypes: Sequence[DType]) -> bool:
    """Whether jax must run with ``jax_enable_x64`` for these element types."""
    return any(d in _WIDE for d in dtypes)


def checked_batch_sizes(decls: Sequence[TensorDecl], batch_sizes: Sequence[int]) -> list[int]:
    """The sorted compiled batch sizes, checked against the inputs' batch axes."""
    sizes = sorted({int(b) for b in batch_sizes})
    if any(b <= 0 for b in sizes):
        raise ExportError(f"batch sizes must be > 0, got {sizes}")
    batched = [d for d in decls if d.batch_axis is not None]
    if batched and len(batched) != len(decls):
        unbatched = next(d.name for d in decls if d.batch_axis is None)
        raise ExportError(
            f"inputs mix batched and unbatched tensors: {unbatched!r} has no batch axis n "
            "(every input needs one, or none does)"
        )
    if sizes and not batched:
        raise ExportError(
            "batch sizes given but no input has a batch axis (mark it with n, e.g. x=f32[n,16])"
        )
    if batched and not sizes:
        raise ExportError(
            f"input {batched[0].name!r} has a batch axis n: give the batch sizes to compile "
            "(--batch-sizes 1,8,32)"
        )
    return sizes


def _variants(
    decls: Sequence[TensorDecl], variants: Sequence[Mapping[str, int]]
) -> list[dict[str, int]]:
    letters = list(dict.fromkeys(letter for d in decls for letter in d.variable_letters))
    if letters and not variants:
        raise ExportError(
            f"variable axes {letters} need one --variant per compiled shape "
            f"(e.g. --variant {','.join(f'{c}=128' for c in letters)})"
        )
    if variants and not letters:
        raise ExportError("--variant given but no input has a variable axis (LETTER=-1)")
    out: list[dict[str, int]] = []
    for i, variant in enumerate(variants):
        sizes = dict(variant)
        if set(sizes) != set(letters):
            raise ExportError(
                f"variant {i} sizes {sorted(sizes)}; it must size exactly the variable axes "
                f"{letters}"
            )
        for letter, size in sizes.items():
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                raise ExportError(f"variant {i}: {letter}={size!r} must be an int > 0")
        ordered = {letter: sizes[letter] for letter in letters}
        if ordered in out:
            raise ExportError(f"variant {i} repeats {ordered}")
        out.append(ordered)
    return out


def _entry_of(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"{module}:{name}"


def source_dir_of(fn: Any) -> Path | None:
    """The folder of ``fn``'s source file (git provenance is read there), if it has one."""
    try:
        source = inspect.getsourcefile(inspect.unwrap(fn))
    except TypeError:
        return None
    return Path(source).resolve().parent if source else None


def bundle_path(out: str | os.PathLike[str] | None, name: str | None, force: bool) -> Path:
    """The absolute bundle path, checked before any work: name, and no clobbering."""
    if out is None:
        raise ExportError("out (--out DIR) is required: the bundle directory to write")
    final = Path(os.path.abspath(out))
    if name is not None and name != final.name:
        raise ExportError(
            f"--name {name!r} must match the basename of --out ({final.name!r}): the "
            "directory name is the model name"
        )
    if not is_valid_model_name(final.name):
        raise ExportError(
            f"{final}: invalid model name {final.name!r} (must match {MODEL_NAME_PATTERN})"
        )
    if final.exists() and not force:
        raise ExportError(f"{final}: bundle already exists (use --force to replace it)")
    return final


def export_flat(  # noqa: PLR0917 - the documented positional order
    make_call: Callable[[ModuleIndex], FlatCall],
    weights: Sequence[tuple[str, Any]],
    inputs: Sequence[TensorLike],
    outputs: Sequence[str | TensorDecl] | None = None,
    batch_sizes: Sequence[int] = (),
    variants: Sequence[Mapping[str, int]] = (),
    out: str | os.PathLike[str] | None = None,
    *,
    entry: str,
    source_framework: str = "jax",
    source_dir: Path | None = None,
    platform: str = "cpu",
    name: str | None = None,
    with_hooks: bool = False,
    force: bool = False,
    description: str = "",
    provenance_extra: Mapping[str, Any] | None = None,
    progress: bool = True,
    client_inputs: Sequence[TensorLike] | None = None,
    client_outputs: Sequence[TensorLike] | None = None,
    model_py: str | os.PathLike[str] | None = None,
    text_copies: bool = False,
) -> Path:
    """Lower ``make_call((variant, batch))`` for every compiled shape, gate, and publish.

    ``weights`` is the ``(name, array)`` list in argument order; each callable takes
    ``(weights, inputs)`` as flat sequences. See :func:`export_jax` for the other arguments.
    """
    final = bundle_path(out, name, force)
    decls = as_decls(inputs, "inputs")
    sizes = checked_batch_sizes(decls, batch_sizes)
    variant_maps = _variants(decls, variants)
    if (client_inputs is not None or client_outputs is not None) and not (
        model_py is not None or with_hooks
    ):
        raise ExportError("client inputs/outputs need hooks: give model_py or with_hooks")
    weight_specs = []
    host_weights = []
    for weight_name, value in weights:
        dtype, array = as_weight(weight_name, value)
        weight_specs.append(ArgSpec("weight", weight_name, tuple(array.shape), dtype))
        host_weights.append((weight_name, array))
    indices: list[ModuleIndex] = [
        (variant, batch)
        for variant in (range(len(variant_maps)) if variant_maps else [None])
        for batch in (sizes or [0])
    ]
    x64 = needs_x64([d.dtype for d in decls] + [w.dtype for w in weight_specs])
    lowered: dict[ModuleIndex, LoweredModule] = {}
    with (
        Progress(len(indices) + 1, f"export {final.name}", enabled=progress) as bar,
        jax.enable_x64(True) if x64 else contextlib.nullcontext(),
    ):
        for variant, batch in indices:
            where = module_filename(variant, batch)
            sizes_of_variant = variant_maps[variant] if variant is not None else {}
            arg_inputs = [
                ArgSpec("input", d.name, d.concrete_shape(batch, sizes_of_variant), d.dtype)
                for d in decls
            ]
            module = lower_module(
                make_call((variant, batch)),
                arg_inputs,
                weight_specs,
                platform=platform,
                where=where,
            )
            for warning in module.warnings:
                _log.warning("%s", warning)
            lowered[(variant, batch)] = module
            bar.step(where)
        output_decls = declare_outputs(
            lowered, outputs, input_batch_axis=decls[0].batch_axis if decls else None
        )
        client_in = None if client_inputs is None else as_decls(client_inputs, "client_inputs")
        client_out = None if client_outputs is None else as_decls(client_outputs, "client_outputs")
        if model_py is None and with_hooks:
            model_py = hooks_template(final.name, decls, output_decls, client_in, client_out)
        provenance = collect_provenance(
            entry=entry,
            platform=platform,
            source_framework=source_framework,
            source_dir=source_dir,
            extra=provenance_extra,
        )
        extra_files = dict(provenance.files)
        modules: dict[ModuleKey, bytes] = {}
        for (variant, batch), module in lowered.items():
            modules[batch if variant is None else (variant, batch)] = module.module
            if text_copies:
                extra_files[module_filename(variant, batch) + ".txt"] = module.text.encode()
        return write_bundle(
            final,
            name=final.name,
            executable_inputs=decls,
            executable_outputs=output_decls,
            modules=modules,
            weights=host_weights,
            client_inputs=client_in,
            client_outputs=client_out,
            input_shapes=variant_maps or None,
            provenance=provenance.keys,
            model_py=model_py,
            description=description,
            force=force,
            extra_files=extra_files,
            on_weights_written=lambda: bar.step("weights"),
        )


def export_jax(  # noqa: PLR0917 - the documented signature
    fn: Callable[..., Any],
    params: Any,
    inputs: Sequence[TensorLike],
    outputs: Sequence[str | TensorDecl] | None = None,
    batch_sizes: Sequence[int] = (),
    variants: Sequence[Mapping[str, int]] = (),
    out: str | os.PathLike[str] | None = None,
    *,
    platform: str = "cpu",
    name: str | None = None,
    with_hooks: bool = False,
    force: bool = False,
    description: str = "",
    provenance_extra: Mapping[str, Any] | None = None,
    progress: bool = True,
    client_inputs: Sequence[TensorLike] | None = None,
    client_outputs: Sequence[TensorLike] | None = None,
    model_py: str | os.PathLike[str] | None = None,
    text_copies: bool = False,
) -> Path:
    """Export ``fn(params, *inputs)`` as a bundle at ``out``; returns the bundle path.

    ``inputs`` are declarations (``"x=f32[n,16]"``, :class:`TensorDecl` or core
    ``TensorSpec``); ``outputs`` names the results in order (or declares them,
    ``"logits=f32[n,k=4]"``). ``batch_sizes`` are compiled for the batch axis ``n``;
    ``variants`` size every variable axis (one dict per compiled shape). The weights are the
    leaves of ``params`` (names = ``/``-joined key paths). ``client_inputs``,
    ``client_outputs`` and ``model_py`` (hook source: a path, or the text as ``str``) export a
    model whose hooks convert between client and executable tensors; ``with_hooks`` writes an
    identity template instead. ``text_copies`` adds ``model….mlir.txt`` files for reading.
    Raises :class:`ExportError` (``UnservableError`` for the arity gate) before writing
    anything.
    """
    flat = flatten_params(params)

    def make_call(index: ModuleIndex) -> FlatCall:
        del index  # one function serves every shape
        return lambda weights, xs: fn(flat.rebuild(weights), *xs)

    return export_flat(
        make_call,
        list(zip(flat.names, flat.arrays, strict=True)),
        inputs,
        outputs,
        batch_sizes,
        variants,
        out,
        entry=_entry_of(fn),
        source_framework="jax",
        source_dir=source_dir_of(fn),
        platform=platform,
        name=name,
        with_hooks=with_hooks,
        force=force,
        description=description,
        provenance_extra=provenance_extra,
        progress=progress,
        client_inputs=client_inputs,
        client_outputs=client_outputs,
        model_py=model_py,
        text_copies=text_copies,
    )
