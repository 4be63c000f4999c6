"""What a module's entry signature must be, from the manifest and the weights header.

01 §Files: ``main`` takes the executable inputs (manifest order) then the weights
(``argument_order``) and returns the executable outputs; extents are static, the batch axis
equals the file's B and variable axes equal the variant's sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reactantserver.core.dtypes import DType
from reactantserver.core.manifest import Manifest
from reactantserver.core.types import Batch, Fixed, TensorSpec, Variable
from reactantserver.core.weights import WeightSpec

__all__ = ["expected_shape", "signature_problems", "variant_sizes"]


def variant_sizes(manifest: Manifest, variant: int | None) -> dict[str, int]:
    """``{letter: size}`` of a variant's variable axes (empty without variants)."""
    if variant is None:
        return {}
    key = manifest.variants[variant].key
    return dict(zip(manifest.variable_letters, key, strict=True))


def expected_shape(
    spec: TensorSpec, letters: str, batch: int, sizes: dict[str, int]
) -> tuple[int | None, ...]:
    """A tensor's extents in a module; ``None`` where any extent is allowed."""
    shape: list[int | None] = []
    for letter, dim in zip(letters, spec.shape, strict=True):
        if isinstance(dim, Fixed):
            shape.append(dim.size)
        elif isinstance(dim, Batch):
            shape.append(batch or None)
        elif isinstance(dim, Variable):
            shape.append(sizes.get(letter))
    return tuple(shape)


def _render(dtype: DType, shape: Sequence[int | None]) -> str:
    return f"{dtype.token}[{','.join('?' if d is None or d < 0 else str(d) for d in shape)}]"


def _compare(
    what: str, want_dtype: DType, want: Sequence[int | None], got_dtype: DType, got: Sequence[int]
) -> str | None:
    same_rank = len(want) == len(got)
    fits = same_rank and all(w is None or w == g for w, g in zip(want, got, strict=False))
    if got_dtype != want_dtype or not fits:
        return f"{what}: entry has {_render(got_dtype, got)}, expected {_render(want_dtype, want)}"
    return None


def signature_problems(
    manifest: Manifest,
    variant: int | None,
    batch: int,
    weights: Sequence[WeightSpec],
    signature: Any,
) -> list[str]:
    """Every way ``signature`` (the worker backend's ``Signature``) breaks the manifest."""
    problems: list[str] = []
    inputs = manifest.executable_inputs
    expected = len(inputs) + len(weights)
    got_inputs = signature.inputs
    if len(got_inputs) != expected:
        problems.append(
            f"UNSERVABLE: entry has {len(got_inputs)} arguments, manifest + weights declare "
            f"{expected} (inputs {len(inputs)} + weights {len(weights)})"
        )
    sizes = variant_sizes(manifest, variant)
    for index, (spec, got) in enumerate(zip(inputs, got_inputs, strict=False)):
        letters = manifest.letters.executable_inputs[index]
        want = expected_shape(spec, letters, batch, sizes)
        problem = _compare(
            f"input {spec.name!r} (argument {index})", spec.dtype, want, got.dtype, got.shape
        )
        if problem:
            problems.append(problem)
    for offset, (weight, got) in enumerate(zip(weights, got_inputs[len(inputs) :], strict=False)):
        index = len(inputs) + offset
        problem = _compare(
            f"weight {weight.name!r} (argument {index}; argument_order position {offset})",
            weight.dtype,
            weight.shape,
            got.dtype,
            got.shape,
        )
        if problem:
            problems.append(problem + " (weights file)")
    outputs = manifest.executable_outputs
    if len(signature.results) != len(outputs):
        problems.append(
            f"entry returns {len(signature.results)} results, manifest declares {len(outputs)}"
        )
    for index, (spec, got) in enumerate(zip(outputs, signature.results, strict=False)):
        letters = manifest.letters.executable_outputs[index]
        # Letters are scoped to one tensor: an output's variable axis may take any extent.
        want = expected_shape(spec, letters, batch, {})
        problem = _compare(
            f"output {spec.name!r} (result {index})", spec.dtype, want, got.dtype, got.shape
        )
        if problem:
            problems.append(problem)
    if not signature.static:
        problems.append("UNSERVABLE: the entry signature has dynamic extents (shape polymorphism)")
    return problems
