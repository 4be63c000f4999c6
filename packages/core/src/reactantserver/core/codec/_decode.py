"""The steps of ``decode_request``, one function per step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from reactantserver.core.codec._bytes import parse_bytes
from reactantserver.core.codec._contents import typed_fields_set, typed_to_array
from reactantserver.core.codec._params import int_param, param_value
from reactantserver.core.codec._tensor import (
    SHM_BYTE_SIZE,
    SHM_REGION,
    TensorHeader,
    checked_bool,
    checked_shape,
    raw_array,
    require_registry,
    shm_ref,
    wire_dtype,
)
from reactantserver.core.dtypes import DType
from reactantserver.core.errors import InvalidArgumentError, ReactantError
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.shm import SharedMemoryRegistry
from reactantserver.core.types import OutputRequest, ParameterValue, ShmRef

# Request parameters decoding consumes; the rest go to InferRequest.parameters.
_CONSUMED = {
    "binary_data_output",
    "priority",
    "reactant_timeout_ns",
    "sequence_end",
    "sequence_id",
    "sequence_start",
    "timeout",
}


def input_headers(msg: pb.ModelInferRequest, where: str, max_recv: int) -> list[TensorHeader]:
    """Step 2: datatype, shape and size of every input, before any data is looked at."""
    tensors: list[TensorHeader] = []
    seen: set[str] = set()
    for i, tensor in enumerate(msg.inputs):
        if not tensor.name:
            raise InvalidArgumentError(f"{where}: input #{i} has no name")
        what = f"{where}: input {tensor.name!r}"
        if tensor.name in seen:
            raise InvalidArgumentError(f"{what} appears more than once")
        seen.add(tensor.name)
        dtype = wire_dtype(tensor.datatype, what)
        shape, elements = checked_shape(tensor.shape, what)
        shm = shm_ref(tensor.parameters, what)
        nbytes = None if dtype is DType.BYTES else elements * dtype.itemsize
        if shm is None and nbytes is not None and nbytes > max_recv:
            raise InvalidArgumentError(
                f"{what}: shape {list(shape)} of {dtype.kserve} needs {nbytes} bytes, more than "
                f"the {max_recv} a message may carry (grpc.max_recv_msg_bytes)"
            )
        tensors.append(TensorHeader(tensor.name, dtype, shape, elements, nbytes, shm, what))
    return tensors


def input_data(
    msg: pb.ModelInferRequest,
    tensors: list[TensorHeader],
    registry: SharedMemoryRegistry | None,
    leases: list[Callable[[], None]],
    where: str,
) -> list[NamedTensor]:
    """Steps 3-4: the array of every input, from shared memory, raw or typed contents."""
    data_inputs = [t.name for t in tensors if t.shm is None]
    raw = msg.raw_input_contents
    if raw and len(raw) != len(data_inputs):
        raise InvalidArgumentError(
            f"{where}: raw_input_contents has {len(raw)} entries for {len(data_inputs)} "
            f"data inputs ({', '.join(repr(n) for n in data_inputs) or 'none'})"
        )
    arrays: list[NamedTensor] = []
    next_raw = 0
    for tensor, header in zip(msg.inputs, tensors, strict=True):
        typed = typed_fields_set(tensor.contents)
        if header.shm is not None:
            if typed:
                raise InvalidArgumentError(
                    f"{header.what}: carries both {SHM_REGION!r} and typed contents"
                )
            array = shm_input(header, header.shm, registry, leases)
        elif raw:
            if typed:
                raise InvalidArgumentError(
                    f"{header.what}: carries both raw_input_contents and typed contents"
                )
            array = raw_array(raw[next_raw], header, "raw_input_contents entry")
            next_raw += 1
        else:
            array = typed_to_array(
                tensor.contents, header.dtype, header.shape, header.elements, header.what
            )
        arrays.append(NamedTensor(header.name, array))
    return arrays


def shm_input(
    header: TensorHeader,
    ref: ShmRef,
    registry: SharedMemoryRegistry | None,
    leases: list[Callable[[], None]],
) -> np.ndarray[Any, Any]:
    """A shared-memory input: a leased zero-copy view (BYTES: parsed, no lease kept)."""
    if header.nbytes is not None and ref.byte_size != header.nbytes:
        raise InvalidArgumentError(
            f"{header.what}: {SHM_BYTE_SIZE} is {ref.byte_size}, shape {list(header.shape)} "
            f"of {header.dtype.kserve} needs {header.nbytes}"
        )
    registry = require_registry(registry, ref, header.what)
    try:
        lease = registry.read(ref.region, ref.offset, ref.byte_size)
    except ReactantError as exc:
        raise type(exc)(f"{header.what}: {exc}") from exc
    if header.dtype is DType.BYTES:
        # The elements are copied out as bytes objects, so the mapping is not needed after.
        with lease:
            return parse_bytes(lease.view, header.shape, f"{header.what} (shared memory)")
    leases.append(lease.release)
    return checked_bool(
        np.frombuffer(lease.view, dtype=header.dtype.numpy).reshape(header.shape), header.what
    )


def requested_outputs(
    msg: pb.ModelInferRequest, registry: SharedMemoryRegistry | None, where: str
) -> list[OutputRequest]:
    """Step 5: requested outputs, unique, with their shared-memory destinations checked."""
    outputs: list[OutputRequest] = []
    seen: set[str] = set()
    for i, tensor in enumerate(msg.outputs):
        if not tensor.name:
            raise InvalidArgumentError(f"{where}: requested output #{i} has no name")
        what = f"{where}: output {tensor.name!r}"
        if tensor.name in seen:
            raise InvalidArgumentError(f"{what} is requested more than once")
        seen.add(tensor.name)
        if "classification" in tensor.parameters:
            raise InvalidArgumentError(f"{what}: parameter 'classification' is not supported")
        shm = shm_ref(tensor.parameters, what)
        if shm is not None:
            checked = require_registry(registry, shm, what)
            try:
                checked.check(shm.region, shm.offset, shm.byte_size)
            except ReactantError as exc:
                raise type(exc)(f"{what}: {exc}") from exc
        outputs.append(OutputRequest(tensor.name, shm))
    return outputs


def request_parameters(
    msg: pb.ModelInferRequest, where: str
) -> tuple[int, int | None, int | None, dict[str, ParameterValue]]:
    """Step 6: priority, the two timeout budgets, and the parameters passed through."""
    params = msg.parameters
    if "sequence_id" in params and param_value(params["sequence_id"]) not in (None, 0, ""):
        raise InvalidArgumentError(
            f"{where}: parameter 'sequence_id' is set but sequence batching is not supported"
        )
    priority = int_param(params, "priority", where) or 0
    if priority < 0:
        raise InvalidArgumentError(f"{where}: parameter 'priority' must not be negative")
    timeout_us = int_param(params, "timeout", where)
    timeout_ns = int_param(params, "reactant_timeout_ns", where)
    rest: dict[str, ParameterValue] = {}
    for key, param in params.items():
        value = param_value(param)
        if key not in _CONSUMED and value is not None:
            rest[key] = value
    return priority, timeout_us, timeout_ns, rest
