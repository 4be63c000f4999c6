"""Checks a compiled module's entry signature against its manifest and weights.

The StableHLO ``main`` must take the executable inputs (manifest order) followed by the
weights (``argument_order``) and return the executable outputs, with matching element types
and static extents: the batch axis equals the file's batch size, variable axes the variant's
sizes. Any mismatch is a :class:`~reactantserver.core.errors.BundleError` that names the
file, the argument and expected vs actual.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from reactantserver.core.errors import BundleError
from reactantserver.core.manifest import Manifest, Variant
from reactantserver.core.types import Batch, Fixed, TensorSpec
from reactantserver.core.weights import WeightSpec
from reactantserver.worker.runtime.backend import Signature, TensorType

__all__ = ["check_entry_signature", "expected_input_extents", "signature_problems"]

# None = any static extent is acceptable on that axis.
Extents = tuple[int | None, ...]


def expected_input_extents(
    manifest: Manifest, batch_size: int, variant: Variant | None
) -> list[Extents]:
    """Per executable input, the extent each axis must have in a module of this key."""
    sizes: dict[tuple[int, int], int] = {}
    if variant is not None:
        for axis in manifest.variable_axes:
            sizes[(axis.input_index, axis.axis)] = variant.key[axis.key_index]
    return [
        _extents(spec, batch_size, {axis: n for (inp, axis), n in sizes.items() if inp == i})
        for i, spec in enumerate(manifest.executable_inputs)
    ]


def _extents(spec: TensorSpec, batch_size: int, variable: Mapping[int, int]) -> Extents:
    out: list[int | None] = []
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, Fixed):
            out.append(dim.size)
        elif isinstance(dim, Batch):
            out.append(batch_size if batch_size > 0 else None)
        else:
            out.append(variable.get(axis))
    return tuple(out)


def _render(extents: Extents, token: str) -> str:
    dims = "x".join("*" if e is None else str(e) for e in extents)
    return f"{dims}x{token}" if dims else token


def _problem(actual: TensorType, dtype_token: str, extents: Extents, what: str) -> str | None:
    matches = (
        actual.dtype.token == dtype_token
        and len(actual.shape) == len(extents)
        and all(e is None or e == a for e, a in zip(extents, actual.shape, strict=True))
    )
    if matches:
        return None
    return f"{what} is {actual}, expected {_render(extents, dtype_token)}"


def signature_problems(
    signature: Signature,
    manifest: Manifest,
    weights: Sequence[WeightSpec],
    *,
    batch_size: int,
    variant: Variant | None,
    file: str,
) -> list[str]:
    """Every way ``signature`` breaks the bundle's declaration (empty = servable).

    ``weights`` are the materialised weight specs in ``argument_order`` (for a 2.0 bundle,
    already axis-reversed); ``batch_size`` 0 means the unbatched ``model.mlir``. Each
    message names the file, the argument or result, and expected vs actual.
    """
    where = f"{manifest.source.rsplit('/', 1)[0]}/{file}" if manifest.source else file
    problems: list[str] = []
    if not signature.static:
        problems.append(
            f"{where}: entry signature has dynamic dimensions ({_list(signature.inputs)}); "
            "shape-polymorphic modules are not supported"
        )
    n_inputs, n_weights = len(manifest.executable_inputs), len(weights)
    if len(signature.inputs) != n_inputs + n_weights:
        problems.append(
            f"{where}: entry has {len(signature.inputs)} arguments, manifest + weights declare "
            f"{n_inputs + n_weights} (inputs {n_inputs} + weights {n_weights})"
        )
    extents = expected_input_extents(manifest, batch_size, variant)
    wanted = [
        (spec.dtype.token, ext, f"argument {i} (input {spec.name!r})")
        for i, (spec, ext) in enumerate(zip(manifest.executable_inputs, extents, strict=True))
    ]
    wanted += [
        (w.dtype.token, tuple(w.shape), f"argument {n_inputs + j} (weight {w.name!r})")
        for j, w in enumerate(weights)
    ]
    for actual, (token, ext, what) in zip(signature.inputs, wanted, strict=False):
        problems.append(_problem(actual, token, ext, f"{where}: {what}") or "")
    outputs = manifest.executable_outputs
    if len(signature.results) != len(outputs):
        problems.append(
            f"{where}: entry returns {len(signature.results)} results, manifest declares "
            f"{len(outputs)} executable outputs"
        )
    for k, (actual, spec) in enumerate(zip(signature.results, outputs, strict=False)):
        what = f"{where}: result {k} (output {spec.name!r})"
        problems.append(
            _problem(actual, spec.dtype.token, _extents(spec, batch_size, {}), what) or ""
        )
    return [p for p in problems if p]


def check_entry_signature(
    signature: Signature,
    manifest: Manifest,
    weights: Sequence[WeightSpec],
    *,
    batch_size: int,
    variant: Variant | None,
    file: str,
) -> None:
    """Raise ``BundleError`` (naming every problem) unless ``signature`` is as declared."""
    problems = signature_problems(
        signature, manifest, weights, batch_size=batch_size, variant=variant, file=file
    )
    if problems:
        raise BundleError("; ".join(problems))


def _list(types: Sequence[TensorType]) -> str:
    return ", ".join(str(t) for t in types)
