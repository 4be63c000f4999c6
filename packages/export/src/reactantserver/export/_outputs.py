"""Output declarations from the lowered modules.

An output's batch axis is the axis whose extent equals B and follows B across the compiled
batch sizes; with one batch size it is the axis at the position of the first input's batch
axis when that extent is B. Anything ambiguous must be declared (``--output NAME=DTYPE[AXES]``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from reactantserver.core.dtypes import DType
from reactantserver.core.types import Batch, Fixed
from reactantserver.export._errors import ExportError
from reactantserver.export._lower import LoweredModule
from reactantserver.export._spec import TensorDecl

__all__ = ["ModuleIndex", "declare_outputs"]

ModuleIndex = tuple[int | None, int]
"""(variant index or ``None``, batch size or 0)."""


def _names(
    outputs: Sequence[str | TensorDecl] | None, count: int, keys: tuple[str, ...] | None
) -> list[str | TensorDecl]:
    if outputs is None:
        if keys is not None:
            return list(keys)
        return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]
    given: list[str | TensorDecl] = [
        TensorDecl.parse(o) if isinstance(o, str) and "[" in o else o for o in outputs
    ]
    if len(given) != count:
        raise ExportError(f"{len(given)} output names given but the function returns {count}")
    return given


def _check_declared(
    decl: TensorDecl, dtype: DType, shapes: Mapping[ModuleIndex, tuple[int, ...]]
) -> None:
    if decl.dtype != dtype:
        raise ExportError(
            f"output {decl.name!r}: declared {decl.dtype.token}, lowered {dtype.token}"
        )
    for (_, batch), shape in shapes.items():
        where = f"output {decl.name!r} ({decl}) at batch size {batch}"
        if len(shape) != decl.rank:
            raise ExportError(f"{where}: the lowered output has shape {list(shape)}")
        for axis, dim in enumerate(decl.dims):
            if isinstance(dim, Batch) and (batch == 0 or shape[axis] != batch):
                raise ExportError(f"{where}: the lowered output has shape {list(shape)}")
            if isinstance(dim, Fixed) and shape[axis] != dim.size:
                raise ExportError(f"{where}: the lowered output has shape {list(shape)}")


def _batch_axis(
    name: str,
    shapes: Mapping[ModuleIndex, tuple[int, ...]],
    input_batch_axis: int | None,
) -> int | None:
    batches = sorted({b for _, b in shapes})
    if batches == [0]:
        return None
    rank = len(next(iter(shapes.values())))
    following = [a for a in range(rank) if all(s[a] == b for (_, b), s in shapes.items())]
    if len(batches) > 1:
        if following:
            return input_batch_axis if input_batch_axis in following else following[0]
        by_variant: dict[int | None, set[tuple[int, ...]]] = {}
        for (variant, _), shape in shapes.items():
            by_variant.setdefault(variant, set()).add(shape)
        if all(len(s) == 1 for s in by_variant.values()):
            return None  # the same shape at every batch size: an unbatched output
        raise ExportError(
            f"output {name!r} changes shape with the batch size but no axis equals it "
            f"({ {b: list(s) for (_, b), s in shapes.items()} }); declare it with "
            "--output NAME=DTYPE[AXES]"
        )
    batch = batches[0]
    if input_batch_axis is not None and input_batch_axis in following:
        return input_batch_axis
    if not following:
        return None
    raise ExportError(
        f"output {name!r}: with one batch size ({batch}) the batch axis is ambiguous (shape "
        f"{list(next(iter(shapes.values())))}); declare it with --output NAME=DTYPE[AXES]"
    )


def declare_outputs(
    lowered: Mapping[ModuleIndex, LoweredModule],
    outputs: Sequence[str | TensorDecl] | None,
    *,
    input_batch_axis: int | None,
) -> tuple[TensorDecl, ...]:
    """One declaration per result, consistent over every lowered module."""
    first = next(iter(lowered.values()))
    count = len(first.out_shapes)
    for index, module in lowered.items():
        if module.out_dtypes != first.out_dtypes:
            raise ExportError(
                f"module {index} returns {[d.token for d in module.out_dtypes]} but another "
                f"returns {[d.token for d in first.out_dtypes]}"
            )
    decls = []
    for i, item in enumerate(_names(outputs, count, first.out_keys)):
        dtype = first.out_dtypes[i]
        shapes = {index: module.out_shapes[i] for index, module in lowered.items()}
        if isinstance(item, TensorDecl):
            _check_declared(item, dtype, shapes)
            decls.append(item)
            continue
        ranks = {len(s) for s in shapes.values()}
        if len(ranks) > 1:
            raise ExportError(f"output {item!r}: the rank changes between modules ({shapes})")
        axis = _batch_axis(item, shapes, input_batch_axis)
        variable: list[int] = []
        rank = ranks.pop()
        for a in range(rank):
            if a == axis:
                continue
            per_variant: dict[int | None, set[int]] = {}
            for (variant, _), shape in shapes.items():
                per_variant.setdefault(variant, set()).add(shape[a])
            if any(len(sizes) > 1 for sizes in per_variant.values()):
                raise ExportError(
                    f"output {item!r}: axis {a} changes with the batch size but is not the "
                    "batch axis; declare it with --output NAME=DTYPE[AXES]"
                )
            if len({next(iter(s)) for s in per_variant.values()}) > 1:
                variable.append(a)
        decls.append(
            TensorDecl.from_extents(
                item, dtype, first.out_shapes[i], batch_axis=axis, variable_axes=variable
            )
        )
    return tuple(decls)
