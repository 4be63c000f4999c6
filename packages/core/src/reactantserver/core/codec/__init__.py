"""Conversion between KServe V2 inference messages and the boundary types.

The worker decodes what clients send and encodes what it answers::

    request = decode_request(msg, registry=shm, max_recv_msg_bytes=512 << 20,
                             grpc_time_remaining=context.time_remaining())
    try:
        response = ...  # run the model
        return encode_response(response, requested=request.outputs, registry=shm)
    finally:
        request.release()  # ends the shared-memory leases its inputs view

Clients and tests use the inverse pair, :func:`encode_request` and :func:`decode_response`.
Decoding validates every size before allocating anything of that size; raw and
shared-memory inputs become zero-copy read-only arrays.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from reactantserver.core.codec._contents import typed_to_array
from reactantserver.core.codec._deadline import MAX_BUDGET_NS, effective_deadline_ns
from reactantserver.core.codec._decode import (
    input_data,
    input_headers,
    request_parameters,
    requested_outputs,
)
from reactantserver.core.codec._fast import plain_inputs, plain_outputs, plain_payloads
from reactantserver.core.codec._params import int_param, set_param
from reactantserver.core.codec._tensor import (
    MAX_ELEMENTS,
    SHM_BYTE_SIZE,
    SHM_OFFSET,
    SHM_REGION,
    TensorHeader,
    checked_shape,
    raw_array,
    require_registry,
    set_shm_params,
    shm_ref,
    wire_array,
    wire_dtype,
    wire_payload,
)
from reactantserver.core.dtypes import DType
from reactantserver.core.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    ReactantError,
)
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.shm import SharedMemoryRegistry
from reactantserver.core.types import (
    InferRequest,
    InferResponse,
    OutputRequest,
    ShmRef,
)

__all__ = [
    "MAX_BUDGET_NS",
    "MAX_ELEMENTS",
    "SHM_BYTE_SIZE",
    "SHM_OFFSET",
    "SHM_REGION",
    "decode_output",
    "decode_request",
    "decode_response",
    "effective_deadline_ns",
    "encode_request",
    "encode_response",
    "int_param",
]


def decode_request(
    msg: pb.ModelInferRequest,
    *,
    registry: SharedMemoryRegistry | None,
    max_recv_msg_bytes: int,
    now_ns: int | None = None,
    grpc_time_remaining: float | None = None,
) -> InferRequest:
    """Validate and decode a ``ModelInferRequest``.

    ``registry`` resolves shared-memory inputs and outputs (``None``: nothing is registered);
    the leases of shared-memory inputs are in ``InferRequest.leases`` and end with
    ``InferRequest.release()``. ``now_ns`` defaults to ``time.monotonic_ns()``;
    ``grpc_time_remaining`` is the handler's ``context.time_remaining()``.

    Raises ``InvalidArgumentError`` for malformed requests, ``RegionNotRegisteredError`` for
    unknown regions and ``DeadlineExceededError`` when the deadline has already passed.
    """
    now = time.monotonic_ns() if now_ns is None else now_ns
    model = msg.model_name
    if not model:
        raise InvalidArgumentError("model_name must not be empty")
    where = f"model {model!r}"
    leases: list[Callable[[], None]] = []
    try:
        # The short cuts take the common message as the full steps would, or decline it.
        inputs = plain_inputs(msg, max_recv_msg_bytes)
        if inputs is None:
            tensors = input_headers(msg, where, max_recv_msg_bytes)
            inputs = input_data(msg, tensors, registry, leases, where)
        outputs = plain_outputs(msg)
        if outputs is None:
            outputs = requested_outputs(msg, registry, where)
        if msg.parameters:
            priority, timeout_us, timeout_ns, parameters = request_parameters(msg, where)
        else:
            priority, timeout_us, timeout_ns, parameters = 0, None, None, {}
        deadline = effective_deadline_ns(
            now,
            grpc_time_remaining=grpc_time_remaining,
            timeout_us=timeout_us,
            timeout_ns=timeout_ns,
        )
        if deadline is not None and deadline <= now:
            raise DeadlineExceededError(f"deadline exceeded at decode for {where}")
    except BaseException:
        for release in leases:
            release()
        raise
    return InferRequest(
        model_name=model,
        model_version=msg.model_version,
        id=msg.id,
        inputs=inputs,
        outputs=outputs,
        deadline_ns=deadline,
        priority=priority,
        parameters=parameters,
        leases=leases,
    )


def encode_response(
    resp: InferResponse,
    *,
    requested: Sequence[OutputRequest],
    registry: SharedMemoryRegistry | None,
) -> pb.ModelInferResponse:
    """The ``ModelInferResponse`` for ``resp``.

    Outputs go out in ``requested`` order (empty: all of ``resp.outputs`` in order); an unknown
    requested name is an ``InvalidArgumentError``. Data always travel in
    ``raw_output_contents``; an output requested into shared memory is written there instead
    and leaves an empty raw entry so the raw list stays index-aligned with ``outputs``.
    """
    where = f"model {resp.model_name!r}"
    chosen: list[tuple[NamedTensor, ShmRef | None]]
    if requested:
        by_name: dict[str, NamedTensor] = {}
        for tensor in resp.outputs:
            by_name.setdefault(tensor.name, tensor)
        chosen = []
        for request in requested:
            found = by_name.get(request.name)
            if found is None:
                raise InvalidArgumentError(f"{where}: unknown requested output {request.name!r}")
            chosen.append((found, request.shm))
    else:
        chosen = [(tensor, None) for tensor in resp.outputs]
    msg = pb.ModelInferResponse(model_name=resp.model_name, model_version="1", id=resp.id)
    if plain_payloads(chosen, msg):
        return msg
    for tensor, ref in chosen:
        what = f"{where}: output {tensor.name!r}"
        array, dtype = wire_array(tensor.data, what)
        out = msg.outputs.add(name=tensor.name, datatype=dtype.kserve, shape=array.shape)
        payload = wire_payload(array, dtype, what)
        if ref is None:
            msg.raw_output_contents.append(payload.tobytes())
            continue
        if payload.nbytes > ref.byte_size:
            raise InvalidArgumentError(
                f"{what}: needs {payload.nbytes} bytes but {SHM_BYTE_SIZE} is {ref.byte_size} "
                f"in shared memory region {ref.region!r}"
            )
        registry = require_registry(registry, ref, what)
        try:
            registry.write(ref.region, ref.offset, payload)
        except ReactantError as exc:
            raise type(exc)(f"{what}: {exc}") from exc
        set_shm_params(out.parameters, ShmRef(ref.region, ref.offset, payload.nbytes))
        msg.raw_output_contents.append(b"")
    return msg


def encode_request(
    request: InferRequest,
    *,
    shm_inputs: Mapping[str, ShmRef] | None = None,
    now_ns: int | None = None,
) -> pb.ModelInferRequest:
    """The ``ModelInferRequest`` a client or gateway sends for ``request`` (raw contents).

    Inputs named in ``shm_inputs`` reference that shared-memory range instead of carrying
    bytes (the caller has written them there; their arrays give only dtype and shape).
    ``priority`` goes out as a ``uint64`` parameter and a deadline as the *remaining*
    ``reactant_timeout_ns``; an already passed deadline raises ``DeadlineExceededError``.
    """
    shm_inputs = shm_inputs or {}
    where = f"model {request.model_name!r}"
    msg = pb.ModelInferRequest(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    for tensor in request.inputs:
        what = f"{where}: input {tensor.name!r}"
        array, dtype = wire_array(tensor.data, what)
        wire = msg.inputs.add(name=tensor.name, datatype=dtype.kserve, shape=array.shape)
        ref = shm_inputs.get(tensor.name)
        if ref is None:
            msg.raw_input_contents.append(wire_payload(array, dtype, what).tobytes())
        else:
            set_shm_params(wire.parameters, ref)
    for output in request.outputs:
        wanted = msg.outputs.add(name=output.name)
        if output.shm is not None:
            set_shm_params(wanted.parameters, output.shm)
    for key, value in request.parameters.items():
        set_param(msg.parameters, key, value)
    if request.priority:
        if request.priority < 0:
            raise ValueError(f"{where}: priority must not be negative")
        msg.parameters["priority"].uint64_param = request.priority
    if request.deadline_ns is not None:
        now = time.monotonic_ns() if now_ns is None else now_ns
        remaining = request.deadline_ns - now
        if remaining <= 0:
            raise DeadlineExceededError(f"deadline exceeded before sending for {where}")
        msg.parameters["reactant_timeout_ns"].int64_param = remaining
    return msg


def decode_response(
    msg: pb.ModelInferResponse, *, registry: SharedMemoryRegistry | None = None
) -> InferResponse:
    """The :class:`InferResponse` a ``ModelInferResponse`` carries.

    Raw outputs become zero-copy read-only arrays; typed contents are accepted too. Outputs
    the server wrote into shared memory are copied out of ``registry`` (the caller's own
    registrations) or, without a registry, left out. Malformed tensors raise
    ``InvalidArgumentError``.
    """
    outputs: list[NamedTensor] = []
    for i, tensor in enumerate(msg.outputs):
        array = decode_output(msg, i, registry=registry)
        if array is not None:
            outputs.append(NamedTensor(tensor.name, array))
    return InferResponse(
        model_name=msg.model_name, model_version=msg.model_version, id=msg.id, outputs=outputs
    )


def decode_output(
    msg: pb.ModelInferResponse, index: int, *, registry: SharedMemoryRegistry | None = None
) -> np.ndarray[Any, Any] | None:
    """Output ``index`` of ``msg`` as an array in its wire shape and dtype.

    Raw contents give a zero-copy read-only view (BYTES: an object array of ``bytes``);
    typed contents are converted. An output the server wrote into shared memory is copied
    out of ``registry``, or is ``None`` without one. Malformed tensors raise
    ``InvalidArgumentError``.
    """
    where = f"model {msg.model_name!r}"
    raw = msg.raw_output_contents
    if raw and len(raw) != len(msg.outputs):
        raise InvalidArgumentError(
            f"{where}: raw_output_contents has {len(raw)} entries for {len(msg.outputs)} outputs"
        )
    tensor = msg.outputs[index]
    what = f"{where}: output {tensor.name!r}"
    dtype = wire_dtype(tensor.datatype, what)
    shape, elements = checked_shape(tensor.shape, what)
    ref = shm_ref(tensor.parameters, what)
    nbytes = None if dtype is DType.BYTES else elements * dtype.itemsize
    header = TensorHeader(tensor.name, dtype, shape, elements, nbytes, ref, what)
    if ref is not None:
        if registry is None:
            return None
        with registry.read(ref.region, ref.offset, ref.byte_size) as lease:
            return raw_array(lease.view.tobytes(), header, "shared memory")
    if raw:
        return raw_array(raw[index], header, "raw_output_contents entry")
    return typed_to_array(tensor.contents, dtype, shape, elements, what)
