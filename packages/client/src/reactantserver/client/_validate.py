"""Check an :class:`InferenceIO` against a model before sending anything; a model's spec offline.

::

    spec = manifest_io_spec("build/models/mlp")      # or KServeModel(...).metadata()
    validate_io(spec, MyIO(images), items=4)         # ValueError listing every mismatch

``validate_io`` dry-runs ``encode_chunk`` on a slot of a temporary plain-memory pool and
``decode_chunk`` on a synthetic all-zero response, and compares what it saw with the model's
inputs and outputs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from reactantserver.client._io import InferenceIO, OutputSpec, chunk_plan, output_specs
from reactantserver.client._model import KServeModel
from reactantserver.client._spec import ModelIOSpec, TensorInfo
from reactantserver.client._staging import StagingPool, StagingSlot
from reactantserver.client._tensors import InferInput
from reactantserver.core.dtypes import DType
from reactantserver.core.manifest import MANIFEST_FILENAME, load_manifest
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.types import TensorSpec

__all__ = ["META_PLATFORM", "MODEL_VERSION", "manifest_io_spec", "validate_io"]

META_PLATFORM = "reactantserver_meta"
"""``platform`` a worker reports for a meta model (the worker's ``model_info.META_PLATFORM``)."""
MODEL_VERSION = "1"
"""The one version a worker serves of every model."""

_ANY = -1
"""A metadata extent that matches any size (batch and variable axes)."""
_HEADROOM = 1 << 20
"""Extra bytes in the dry-run slot: alignment padding, and room to *report* an input that is
larger than ``item_input_bytes`` says instead of failing to carve it (the mapping is anonymous,
so untouched pages cost nothing)."""
_BYTES_LENGTH_PREFIX = 4
"""Each BYTES element on the wire is a little-endian uint32 length, then its bytes."""


def validate_io(spec_or_model: ModelIOSpec | KServeModel, io: InferenceIO, items: int = 1) -> None:
    """Dry-run ``io`` on ``items`` items against a model's inputs and outputs.

    ``spec_or_model`` is a :class:`ModelIOSpec` (e.g. from :func:`manifest_io_spec`) or a
    :class:`KServeModel` (its :meth:`~KServeModel.metadata` is fetched). ``encode_chunk`` runs
    on a slot of a temporary plain-memory pool; the inputs it returns are checked for unknown,
    missing and duplicate names, datatype, shape (metadata ``-1`` matches any extent; the leading
    batch axis must be ``items``) and ``item_input_bytes()`` against the bytes actually sent
    (BYTES inputs are not counted: they never live in a slot). Declared ``output_specs`` are
    checked for name, dtype and per-item shape (a 2-D per-item shape declared the wrong way round
    gets a hint containing "reversed"). Then ``decode_chunk`` gets an all-zero response shaped
    as the server would send it: the declared outputs, or every output of the model, with
    ``-1`` replaced by ``items`` (a declared extent where there is one for a non-batch axis).
    ``decode_chunk`` really runs, so the io's results for those items are overwritten with zeros.

    Every problem found goes into one ``ValueError``, one line each. An exception raised by
    ``encode_chunk`` or ``decode_chunk`` itself propagates with a note naming the step, unless
    problems were already found: then it becomes one more line of that ``ValueError``.
    """
    if items < 1:
        raise ValueError(f"items must be >= 1, got {items}")
    if items > len(io):
        raise ValueError(f"items ({items}) exceeds the io's {len(io)} items")
    spec = spec_or_model if isinstance(spec_or_model, ModelIOSpec) else spec_or_model.metadata()
    declared = output_specs(io)
    batch = range(items)

    problems: list[str] = []
    inputs = _encode(io, batch, declared)
    problems += _input_problems(spec, inputs, items)
    problems += _byte_problems(io.item_input_bytes(), inputs, items)
    problems += _output_problems(spec, declared, items)

    response = _synthetic_response(spec, declared, items)
    try:
        io.decode_chunk(batch, response)
    except Exception as exc:
        if not problems:
            exc.add_note(f"validate_io: decode_chunk({batch}) failed on a synthetic zero response")
            raise
        problems.append(f"decode_chunk({batch}) raised {type(exc).__name__}: {exc}")
        raise ValueError(_report(spec, io, items, problems)) from exc
    if problems:
        raise ValueError(_report(spec, io, items, problems))


def _report(spec: ModelIOSpec, io: InferenceIO, items: int, problems: Sequence[str]) -> str:
    head = (
        f"{type(io).__name__} does not match model {spec.name!r} "
        f"({len(problems)} problem{'s' if len(problems) != 1 else ''}, items={items}):"
    )
    return "\n".join([head, *(f"  - {line}" for line in problems)])


def _encode(io: InferenceIO, batch: range, declared: Sequence[OutputSpec]) -> list[InferInput]:
    """``encode_chunk`` on a slot of a fresh plain pool sized for ``batch`` by ``chunk_plan``."""
    per_item = max(io.item_input_bytes(), 1)
    items = len(batch)
    pool = StagingPool(2 * per_item * items + _HEADROOM, 1, shm=False)
    try:
        plan = chunk_plan(io.item_input_bytes(), declared, pool, items)
        assert plan.chunk == items, f"dry-run pool too small: {plan}"
        with pool.acquire(plan.span) as slot:
            try:
                returned = list(io.encode_chunk(batch, StagingSlot(slot)))
            except Exception as exc:
                exc.add_note(
                    f"validate_io: encode_chunk({batch}) failed (item_input_bytes() = "
                    f"{io.item_input_bytes()}, slot of {slot.nbytes} bytes)"
                )
                raise
            for value in returned:
                if not isinstance(value, InferInput):
                    raise TypeError(
                        f"validate_io: encode_chunk({batch}) must return InferInput objects, "
                        f"got {type(value).__name__}"
                    )
            return returned
    finally:
        pool.close()


# -- inputs ------------------------------------------------------------------------------------


def _input_problems(spec: ModelIOSpec, inputs: Sequence[InferInput], items: int) -> list[str]:
    problems: list[str] = []
    expected = {t.name: t for t in spec.inputs}
    seen: set[str] = set()
    for given in inputs:
        name = given.name
        if name in seen:
            problems.append(f"input {name!r}: returned more than once by encode_chunk")
            continue
        seen.add(name)
        tensor = expected.get(name)
        if tensor is None:
            problems.append(
                f"input {name!r}: not an input of model {spec.name!r} "
                f"(expected one of {list(expected)}), got {given!r}"
            )
            continue
        if given.datatype != tensor.datatype:
            problems.append(
                f"input {name!r}: datatype: expected {tensor.datatype}, got {given.datatype} "
                f"(NumPy {given.array.dtype})"
            )
        if not _batch_shape_matches(tensor.shape, given.shape, items):
            problems.append(
                f"input {name!r}: shape: expected {_expected_shape(tensor.shape, items)} "
                f"(model {list(tensor.shape)}, batch axis = items = {items}), "
                f"got {list(given.shape)}"
            )
    for tensor in spec.inputs:
        if tensor.name not in seen:
            problems.append(
                f"input {tensor.name!r}: missing: expected {tensor.datatype}"
                f"{_expected_shape(tensor.shape, items)}, encode_chunk did not return it"
            )
    return problems


def _byte_problems(declared: int, inputs: Sequence[InferInput], items: int) -> list[str]:
    sized = [i for i in inputs if i.datatype != DType.BYTES.kserve]
    actual = sum(int(i.array.nbytes) for i in sized)
    if actual == declared * items:
        return []
    per_item = actual / items
    shown = int(per_item) if per_item.is_integer() else round(per_item, 2)
    parts = " + ".join(f"{i.name} {int(i.array.nbytes)}" for i in sized) or "none"
    return [
        f"item_input_bytes(): expected {shown} (the inputs hold {actual} bytes for {items} "
        f"item{'s' if items != 1 else ''}: {parts}), got {declared}"
    ]


def _batch_shape_matches(model: Sequence[int], shape: Sequence[int], items: int) -> bool:
    """``shape`` fits ``model`` with the leading axis holding the ``items`` of a chunk."""
    if len(model) != len(shape) or not shape or shape[0] != items:
        return False
    return _dims_match(model, shape)


def _dims_match(model: Sequence[int], dims: Sequence[int]) -> bool:
    return len(model) == len(dims) and all(m in (_ANY, d) for m, d in zip(model, dims, strict=True))


def _expected_shape(model: Sequence[int], items: int) -> list[int]:
    return [items if axis == 0 and dim == _ANY else dim for axis, dim in enumerate(model)]


# -- outputs -----------------------------------------------------------------------------------


def _wire_datatype(output: OutputSpec) -> str | None:
    try:
        return DType.from_numpy(output.dtype).kserve
    except ValueError:
        return None


def _output_problems(spec: ModelIOSpec, declared: Sequence[OutputSpec], items: int) -> list[str]:
    problems: list[str] = []
    expected = {t.name: t for t in spec.outputs}
    seen: set[str] = set()
    for output in declared:
        name = output.name
        if name in seen:
            problems.append(f"output {name!r}: declared more than once in output_specs()")
            continue
        seen.add(name)
        tensor = expected.get(name)
        if tensor is None:
            problems.append(
                f"output {name!r}: not an output of model {spec.name!r} "
                f"(expected one of {list(expected)}), got {output}"
            )
            continue
        datatype = _wire_datatype(output)
        if datatype != tensor.datatype:
            problems.append(
                f"output {name!r}: dtype: expected {tensor.datatype}, "
                f"got {output.dtype} ({datatype or 'no wire datatype'})"
            )
        if DType.BYTES.kserve in (datatype, tensor.datatype):
            problems.append(
                f"output {name!r}: BYTES outputs have data-dependent sizes and cannot be declared "
                "in output_specs() (read them inline from the response)"
            )
        problems += _per_item_problems(tensor, output, items)
    return problems


def _per_item_problems(tensor: TensorInfo, output: OutputSpec, items: int) -> list[str]:
    name, model = tensor.name, tensor.shape
    if not model:
        return [f"output {name!r}: shape: the model's output is a scalar, it has no batch axis"]
    problems = []
    if model[0] not in (_ANY, items):
        problems.append(
            f"output {name!r}: shape: the model's leading axis is fixed at {model[0]}, "
            f"so it is not a batch axis of {items} items (model {list(model)})"
        )
    per_item, got = model[1:], output.per_item_shape
    if _dims_match(per_item, got):
        return problems
    line = (
        f"output {name!r}: per_item_shape: expected {_shape(per_item)} "
        f"(model {list(model)} without the batch axis), got {_shape(got)}"
    )
    if len(got) == 2 and _dims_match(per_item, got[::-1]):
        line += f"; the axes look reversed: NumPy shapes are row-major, declare {_shape(per_item)}"
    problems.append(line)
    return problems


def _shape(dims: Sequence[int]) -> str:
    return str(tuple(dims))


def _synthetic_response(
    spec: ModelIOSpec, declared: Sequence[OutputSpec], items: int
) -> pb.ModelInferResponse:
    """An all-zero response to ``items`` items, as a server would send it.

    The declared outputs (explicit-output mode) or else every output of ``spec``, in that
    order, with the model's datatype and shape; ``-1`` becomes ``items`` on the batch axis and
    elsewhere the declared extent if the ranks agree (else ``items``). A declared output the
    model does not have is shaped by its declaration.
    """
    by_name = {t.name: t for t in spec.outputs}
    version = spec.versions[0] if spec.versions else MODEL_VERSION
    response = pb.ModelInferResponse(model_name=spec.name, model_version=version)
    wanted: list[tuple[str, str, list[int]]] = []
    if declared:
        for output in declared:
            tensor = by_name.get(output.name)
            if tensor is not None:
                wanted.append((tensor.name, tensor.datatype, _fill(tensor.shape, output, items)))
                continue
            datatype = _wire_datatype(output)
            if datatype is not None:
                wanted.append((output.name, datatype, [items, *output.per_item_shape]))
    else:
        wanted = [(t.name, t.datatype, _fill(t.shape, None, items)) for t in spec.outputs]
    for name, datatype, shape in wanted:
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        elements = math.prod(shape)
        if datatype == DType.BYTES.kserve:
            response.raw_output_contents.append(bytes(_BYTES_LENGTH_PREFIX * elements))
        else:
            itemsize = DType.from_kserve(datatype).itemsize
            response.raw_output_contents.append(bytes(elements * itemsize))
    return response


def _fill(model: Sequence[int], output: OutputSpec | None, items: int) -> list[int]:
    per_item = output.per_item_shape if output is not None else None
    dims = []
    for axis, dim in enumerate(model):
        if dim != _ANY:
            dims.append(dim)
        elif axis > 0 and per_item is not None and len(per_item) == len(model) - 1:
            dims.append(per_item[axis - 1])
        else:
            dims.append(items)
    return dims


# -- offline spec -------------------------------------------------------------------------------


def manifest_io_spec(path: str | os.PathLike[str]) -> ModelIOSpec:
    """The :class:`ModelIOSpec` a worker would report for a bundle, without a server.

    ``path`` is the bundle directory or its ``manifest.yaml``. Mirrors the worker's
    ``ModelMetadata``: the model name is the bundle directory's name, the tensors are the
    *client-facing* ones with KServe datatypes and ``-1`` for batch and variable axes, and
    ``versions`` is ``("1",)``. ``platform`` is ``"reactantserver_meta"`` for a meta model;
    for a plain model it is ``""``, because a worker reports its runtime's backend there
    (``"cpu"``/``"cuda"``), which the bundle does not decide.
    """
    where = Path(path)
    bundle = where.parent if where.name == MANIFEST_FILENAME and where.is_file() else where
    manifest = load_manifest(bundle)
    return ModelIOSpec(
        name=manifest.name,
        inputs=tuple(_tensor_info(t) for t in manifest.client_inputs),
        outputs=tuple(_tensor_info(t) for t in manifest.client_outputs),
        platform=META_PLATFORM if manifest.is_meta else "",
        versions=(MODEL_VERSION,),
    )


def _tensor_info(spec: TensorSpec) -> TensorInfo:
    return TensorInfo(spec.name, spec.dtype.kserve, tuple(spec.wire_shape))
