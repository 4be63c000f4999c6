"""Lowering one (variant, batch size) to a StableHLO portable artifact with ``jax.export``.

The function is wrapped as ``flat(*inputs, *weights)`` under ``jax.jit(keep_unused=True)``,
exported for one platform, and gated (:mod:`._gate`) before the caller writes anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import jax
import numpy as np

from reactantserver.core.dtypes import DType
from reactantserver.export._errors import ExportError, UnservableError
from reactantserver.export._gate import (
    NEUTRAL_CUSTOM_CALLS,
    ArgSpec,
    captured_device_values,
    check_entry,
    entry_facts,
)

__all__ = ["FlatCall", "LoweredModule", "flatten_outputs", "lower_module", "weights_read"]

FlatCall = Callable[[Sequence[Any], Sequence[Any]], Any]
"""``call(weights, inputs)``: the model with its weights as a flat list in argument order."""


@attrs.frozen
class LoweredModule:
    """One exported module: portable-artifact bytes, readable text, and its results."""

    module: bytes
    text: str
    out_shapes: tuple[tuple[int, ...], ...]
    out_dtypes: tuple[DType, ...]
    out_keys: tuple[str, ...] | None
    warnings: tuple[str, ...] = ()


def flatten_outputs(result: Any) -> tuple[list[Any], tuple[str, ...] | None]:
    """A function's result as a list of arrays, plus the dict keys when it returned a dict
    (sorted, the order of the results)."""
    if isinstance(result, dict):
        keys = sorted(result)
        for key in keys:
            if not isinstance(key, str):
                raise ExportError(f"output dict keys must be strings, got {key!r}")
        values, names = [result[k] for k in keys], tuple(keys)
    elif isinstance(result, tuple | list):
        values, names = list(result), None
    else:
        values, names = [result], None
    for index, value in enumerate(values):
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise ExportError(
                f"result {index} is a {type(value).__name__}: the function must return an "
                "array, a tuple/list of arrays or a dict of arrays"
            )
    if not values:
        raise ExportError("the function returns no outputs")
    return values, names


def _refuse_effects(effects: Any, where: str) -> None:
    if effects:
        raise UnservableError(
            f"UNSERVABLE: {where}: the function has effects "
            f"({', '.join(sorted(map(str, effects)))}); effects and tokens (printing, host "
            "callbacks, ordered I/O) cannot be served"
        )


def lower_module(
    call: FlatCall,
    inputs: Sequence[ArgSpec],
    weights: Sequence[ArgSpec],
    *,
    platform: str,
    where: str,
) -> LoweredModule:
    """Export ``call`` for concrete input shapes and gate the result (raises
    :class:`UnservableError` with the diagnosis)."""
    n_inputs = len(inputs)
    keys: list[tuple[str, ...] | None] = [None]

    def flat(*args: Any) -> tuple[Any, ...]:
        values, keys[0] = flatten_outputs(call(args[n_inputs:], args[:n_inputs]))
        return tuple(values)

    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype.numpy) for a in (*inputs, *weights)]
    jitted = jax.jit(flat, keep_unused=True)
    try:
        traced = jitted.trace(*avals).jaxpr
    except ExportError:
        raise
    except Exception as exc:
        raise ExportError(f"{where}: tracing failed: {type(exc).__name__}: {exc}") from exc
    _refuse_effects(traced.effects, where)
    captured = captured_device_values(traced)
    try:
        exported = jax.export.export(jitted, platforms=(platform,))(*avals)
    except ExportError:
        raise
    except Exception as exc:
        raise ExportError(f"{where}: lowering failed: {type(exc).__name__}: {exc}") from exc
    _refuse_effects([*exported.ordered_effects, *exported.unordered_effects], where)
    expected = [*inputs, *weights]
    in_avals = exported.in_avals
    if len(in_avals) != len(expected) or any(
        tuple(aval.shape) != want.shape or np.dtype(aval.dtype) != want.dtype.numpy
        for aval, want in zip(in_avals, expected, strict=False)
    ):
        raise UnservableError(
            f"UNSERVABLE: compiled entry arguments : {len(in_avals)} / expected : "
            f"{len(expected)} (inputs {n_inputs} + weights {len(weights)}) in {where}: "
            f"jax reports the entry avals {[str(a) for a in in_avals]}"
        )
    module = bytes(exported.mlir_module_serialized)
    facts = entry_facts(module)
    check_entry(
        facts,
        expected,
        inputs=n_inputs,
        weights=len(weights),
        captured=captured,
        where=where,
    )
    warnings = tuple(
        f"{where}: custom call {target!r} is platform-specific: the bundle runs only on {platform}"
        for target in facts.custom_calls
        if target not in NEUTRAL_CUSTOM_CALLS
    )
    out_shapes = tuple(tuple(int(d) for d in a.shape) for a in exported.out_avals)
    out_dtypes = tuple(DType.from_numpy(a.dtype) for a in exported.out_avals)
    return LoweredModule(
        module=module,
        text=exported.mlir_module(),
        out_shapes=out_shapes,
        out_dtypes=out_dtypes,
        out_keys=keys[0],
        warnings=warnings,
    )


def weights_read(
    call: FlatCall, inputs: Sequence[ArgSpec], weights: Sequence[ArgSpec], *, platform: str
) -> tuple[bool, ...]:
    """Which weights the lowered module reads (a probe, without the gate): the PyTorch path
    keeps only these, as a state dict may hold entries the computation never uses."""
    n_inputs = len(inputs)

    def flat(*args: Any) -> tuple[Any, ...]:
        values, _ = flatten_outputs(call(args[n_inputs:], args[:n_inputs]))
        return tuple(values)

    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype.numpy) for a in (*inputs, *weights)]
    try:
        exported = jax.export.export(jax.jit(flat, keep_unused=True), platforms=(platform,))(*avals)
    except Exception as exc:
        raise ExportError(f"lowering failed: {type(exc).__name__}: {exc}") from exc
    read = entry_facts(bytes(exported.mlir_module_serialized)).read
    return tuple(read[n_inputs:])
