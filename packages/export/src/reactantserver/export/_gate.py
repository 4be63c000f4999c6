"""The arity/signature gate: is a lowered module servable?

The server calls a module's ``main`` with the data inputs followed by the weights, nothing
else. This module parses the exported portable artifact (not jax's own bookkeeping) and
refuses, before anything is written, a module whose entry takes other arguments, reads a
weight never (dropped or constant-folded), needs device values captured from the closure,
has dynamic shapes or carries effects. Platform-specific custom calls only warn.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import jax
from jax.extend.core import ClosedJaxpr, Jaxpr
from jax.interpreters import mlir as _jax_mlir
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from reactantserver.core.dtypes import DType
from reactantserver.export._errors import UnservableError

__all__ = [
    "NEUTRAL_CUSTOM_CALLS",
    "ArgSpec",
    "EntryFacts",
    "captured_device_values",
    "check_entry",
    "entry_facts",
]

NEUTRAL_CUSTOM_CALLS = frozenset(
    {
        "Sharding",
        "SPMDFullToShardShape",
        "SPMDShardToFullShape",
        "annotate_device_placement",
        "shape_assertion",
        "MoveToHost",
        "MoveToDevice",
    }
)
"""Custom-call targets every platform implements; any other ties the module to one platform."""

# MLIR contexts must not be shared across threads.
_local = threading.local()


def _context() -> ir.Context:
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = _jax_mlir.make_ir_context()
        _local.ctx = ctx
    return ctx


@attrs.frozen
class ArgSpec:
    """One expected entry argument: its role, name, shape and dtype."""

    role: str
    name: str
    shape: tuple[int, ...]
    dtype: DType

    def __str__(self) -> str:
        return f"{self.dtype.token}{list(self.shape)}"


@attrs.frozen
class EntryFacts:
    """What the module's ``main`` really is: argument and result types (``None`` for an
    unsupported type, ``-1`` extents for dynamic ones), which arguments it reads, and the
    custom-call targets anywhere in the module."""

    arguments: tuple[tuple[str, tuple[int, ...], DType | None], ...]
    results: tuple[tuple[str, tuple[int, ...], DType | None], ...]
    read: tuple[bool, ...]
    custom_calls: tuple[str, ...]


def _type_facts(mlir_type: ir.Type) -> tuple[str, tuple[int, ...], DType | None]:
    try:
        ranked = ir.RankedTensorType(mlir_type)
    except ValueError:
        return str(mlir_type), (), None
    shape = tuple(
        -1 if ranked.is_dynamic_dim(i) else int(ranked.get_dim_size(i)) for i in range(ranked.rank)
    )
    try:
        dtype: DType | None = DType.from_mlir(str(ranked.element_type))
    except ValueError:
        dtype = None
    return str(mlir_type), shape, dtype


def _walk(operation: Any) -> Iterator[Any]:
    for region in operation.regions:
        for block in region.blocks:
            for op in block.operations:
                yield op
                yield from _walk(op.operation)


def _functions(module: ir.Module) -> dict[str, Any]:
    functions = {}
    for op in module.body.operations:
        attributes = op.operation.attributes
        if "sym_name" in attributes and "function_type" in attributes:
            functions[ir.StringAttr(attributes["sym_name"]).value] = op.operation
    return functions


def _reads(functions: dict[str, Any], name: str, index: int, seen: set[tuple[str, int]]) -> bool:
    """Whether argument ``index`` of function ``name`` is used, looking through calls."""
    argument = functions[name].regions[0].blocks[0].arguments[index]
    for use in argument.uses:
        # Owners come back as OpViews or plain Operations; both reach the Operation.
        owner = getattr(use.owner, "operation", use.owner)
        if owner.name != "func.call":
            return True
        callee = ir.FlatSymbolRefAttr(owner.attributes["callee"]).value
        key = (callee, use.operand_number)
        if callee not in functions:
            return True
        if key not in seen:
            seen.add(key)
            if _reads(functions, callee, use.operand_number, seen):
                return True
    return False


def entry_facts(module: bytes) -> EntryFacts:
    """Parse a StableHLO portable artifact (or text) and describe its ``main``."""
    ctx = _context()
    with ctx:
        if module[:4] == b"ML\xefR":
            parsed = stablehlo.deserialize_portable_artifact(ctx, module)
        else:
            parsed = ir.Module.parse(module.decode())
        functions = _functions(parsed)
        if "main" not in functions:
            raise UnservableError("UNSERVABLE: the lowered module has no 'main' function")
        main = functions["main"]
        ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        arguments = tuple(_type_facts(t) for t in ftype.inputs)
        results = tuple(_type_facts(t) for t in ftype.results)
        read = tuple(_reads(functions, "main", i, set()) for i in range(len(arguments)))
        targets = sorted(
            {
                ir.StringAttr(op.operation.attributes["call_target_name"]).value
                for op in _walk(parsed.operation)
                if op.operation.name == "stablehlo.custom_call"
            }
        )
    return EntryFacts(arguments, results, read, tuple(targets))


def _closed_jaxprs(jaxpr: Any) -> Iterator[Any]:
    for eqn in jaxpr.eqns:
        for value in eqn.params.values():
            for item in value if isinstance(value, tuple | list) else (value,):
                if isinstance(item, ClosedJaxpr):
                    yield item
                    yield from _closed_jaxprs(item.jaxpr)
                elif isinstance(item, Jaxpr):
                    yield from _closed_jaxprs(item)


def captured_device_values(closed_jaxpr: Any) -> list[str]:
    """Describe the device arrays (``jax.Array``, typed PRNG keys) a traced function closes
    over: jax bakes them into the module, so their values never reach the weights file."""
    found = []
    for closed in (closed_jaxpr, *_closed_jaxprs(closed_jaxpr.jaxpr)):
        for const in closed.consts:
            if isinstance(const, jax.Array):
                found.append(f"{const.dtype}{list(const.shape)}")
    return found


def check_entry(
    facts: EntryFacts,
    expected: Sequence[ArgSpec],
    *,
    inputs: int,
    weights: int,
    captured: Sequence[str] = (),
    where: str,
) -> None:
    """Refuse a module whose entry is not exactly ``inputs`` data inputs + ``weights`` weights.

    The message starts ``UNSERVABLE: compiled entry arguments : X / expected : Y (inputs I +
    weights W)``, where X counts the entry arguments the module actually reads or needs (its
    arguments, minus weights it never reads, plus captured device values), then names every
    problem found.
    """
    problems: list[str] = []
    args = facts.arguments
    if len(args) != len(expected):
        problems.append(f"the entry function takes {len(args)} arguments")
    for index, (want, (text, shape, dtype)) in enumerate(zip(expected, args, strict=False)):
        if dtype != want.dtype or shape != want.shape:
            problems.append(
                f"argument {index} ({want.role} {want.name!r}) is {text}, expected {want}"
            )
    unread = [
        want.name
        for index, want in enumerate(expected)
        if want.role == "weight" and index < len(facts.read) and not facts.read[index]
    ]
    problems += [
        f"weight {name!r} is never read by the module (dropped or constant-folded: does the "
        "function read a closed-over copy instead of its params argument?)"
        for name in unread
    ]
    if captured:
        problems.append(
            f"{len(captured)} device value(s) captured from the closure "
            f"({', '.join(captured)}) would be extra entry arguments (an RNG key or model "
            "state?): pass them through params"
        )
    if problems:
        compiled = len(args) - len(unread) + len(captured)
        raise UnservableError(
            f"UNSERVABLE: compiled entry arguments : {compiled} / expected : {inputs + weights} "
            f"(inputs {inputs} + weights {weights}) in {where}: " + "; ".join(problems)
        )
    for role, tensors in (("argument", facts.arguments), ("result", facts.results)):
        for index, (text, shape, dtype) in enumerate(tensors):
            if dtype is None:
                raise UnservableError(f"UNSERVABLE: {where}: entry {role} {index} is {text}")
            if any(d < 0 for d in shape):
                raise UnservableError(
                    f"UNSERVABLE: {where}: entry {role} {index} has a dynamic shape ({text}); "
                    "shape polymorphism is not supported, export one module per shape"
                )
