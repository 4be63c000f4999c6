"""Partial decoding of inference bodies the gateway forwards as raw bytes.

The gateway never decodes tensors: it reads the few fields that routing needs straight from the
protobuf wire format and forwards the body unchanged::

    header = read_infer_header(body)                  # model, version, id, timeout parameters
    deadline = deadline_ns(header, now_ns=time.monotonic_ns(),
                           grpc_time_remaining=context.time_remaining())
    units = batch_units(body, "IN", 1)                # only when the policy counts items
    stream_message = stream_response(worker_reply)    # ModelStreamInferResponse, not decoded

The scanner walks ``(start, end)`` offsets into the body, so a large ``raw_input_contents``
field is stepped over by its length prefix and never copied. Duplicate fields follow protobuf's
parse rules, so the gateway sees what the worker will see: the last occurrence of a singular
field wins, the last entry of a map key wins, repeated packed and unpacked chunks concatenate,
and a known field number with an unexpected wire type is an unknown field.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from reactantserver.core.codec import effective_deadline_ns

__all__ = [
    "InferHeader",
    "WireError",
    "batch_units",
    "deadline_ns",
    "read_infer_header",
    "read_string_field",
    "stream_error",
    "stream_response",
]

# Field numbers (grpc_service.proto; tests check each against the generated descriptors).
_REQ_MODEL_NAME = 1
_REQ_MODEL_VERSION = 2
_REQ_ID = 3
_REQ_PARAMETERS = 4
_REQ_INPUTS = 5
_ENTRY_KEY = 1
_ENTRY_VALUE = 2
_INPUT_NAME = 1
_INPUT_SHAPE = 3
_PARAM_BOOL = 1
_PARAM_INT64 = 2
_PARAM_STRING = 3
_PARAM_DOUBLE = 4
_PARAM_UINT64 = 5
_STREAM_ERROR_MESSAGE = 1
_STREAM_INFER_RESPONSE = 2

#: Request parameters carrying a budget, read as the worker's codec reads them.
_TIMEOUT_US_KEY = "timeout"
_TIMEOUT_NS_KEY = "reactant_timeout_ns"

_VARINT = 0
_FIXED64 = 1
_LEN = 2
_START_GROUP = 3
_END_GROUP = 4
_FIXED32 = 5

_MASK64 = (1 << 64) - 1
_SIGN64 = 1 << 63
_MAX_VARINT_SHIFT = 63  # a varint has at most 10 bytes: shifts 0, 7, ..., 63
_MAX_FIELD_NUMBER = (1 << 29) - 1
#: Nesting limit for skipped groups, protobuf's default recursion limit.
_MAX_GROUP_DEPTH = 100


class WireError(ValueError):
    """The body is not a well-formed protobuf message (the caller answers INVALID_ARGUMENT)."""


@attrs.frozen
class InferHeader:
    """The routing-relevant fields of a ``ModelInferRequest``, read without decoding tensors.

    ``timeout_us`` is Triton's ``timeout`` parameter (µs) and ``timeout_ns`` is
    ``reactant_timeout_ns``; each is ``None`` when absent or not an int64/uint64 parameter (the
    worker rejects that type itself, so the gateway only ignores it).
    """

    model_name: str
    model_version: str
    id: str
    timeout_us: int | None
    timeout_ns: int | None


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` (masked to 64 bits) and the offset after it."""
    if pos < end and buf[pos] < 0x80:
        return buf[pos], pos + 1
    result = 0
    shift = 0
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift > _MAX_VARINT_SHIFT:
            raise WireError(f"varint longer than 10 bytes at offset {pos}")
    raise WireError(f"truncated varint at offset {pos}")


def _signed(value: int) -> int:
    """An unsigned 64-bit varint read as two's-complement int64."""
    return value - (1 << 64) if value & _SIGN64 else value


def _skip(buf: bytes, pos: int, end: int, wire_type: int) -> int:
    """The offset after a value of ``wire_type`` (not a group) starting at ``pos``."""
    if wire_type == _VARINT:
        return _varint(buf, pos, end)[1]
    if wire_type == _LEN:
        length, pos = _varint(buf, pos, end)
        stop = pos + length
    elif wire_type == _FIXED64:
        stop = pos + 8
    elif wire_type == _FIXED32:
        stop = pos + 4
    else:
        raise WireError(f"invalid wire type {wire_type} at offset {pos}")
    if stop > end:
        raise WireError(f"field at offset {pos} runs past the end of its message")
    return stop


def _key(buf: bytes, pos: int, end: int) -> tuple[int, int, int]:
    """The field number and wire type of the tag at ``pos`` and the offset after it."""
    key, pos = _varint(buf, pos, end)
    number = key >> 3
    if not 0 < number <= _MAX_FIELD_NUMBER:
        raise WireError(f"invalid field number {number} before offset {pos}")
    return number, key & 7, pos


def _skip_group(buf: bytes, pos: int, end: int, number: int) -> int:
    """The offset after the end-group tag closing the group ``number`` opened before ``pos``."""
    open_groups = [number]
    while open_groups:
        if pos >= end:
            raise WireError(f"group {open_groups[-1]} is not closed")
        inner, wire_type, pos = _key(buf, pos, end)
        if wire_type == _START_GROUP:
            if len(open_groups) >= _MAX_GROUP_DEPTH:
                raise WireError("groups nested too deeply")
            open_groups.append(inner)
        elif wire_type == _END_GROUP:
            if open_groups.pop() != inner:
                raise WireError(f"end of group {inner} does not match its start")
        else:
            pos = _skip(buf, pos, end, wire_type)
    return pos


def _fields(buf: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """Each field of the message in ``buf[pos:end]`` as ``(number, wire_type, a, b)``.

    Varint: ``a`` is the value; length-delimited: ``buf[a:b]`` is the payload; fixed: ``a`` is
    the payload start. Groups are skipped (they carry nothing the gateway reads).
    """
    while pos < end:
        key = buf[pos]
        if 0x08 <= key < 0x80:  # one-byte tag (fields 1-15), the common case, inlined
            number, wire_type = key >> 3, key & 7
            pos += 1
        else:
            number, wire_type, pos = _key(buf, pos, end)
        if wire_type == _LEN:
            if pos < end and buf[pos] < 0x80:
                length, start = buf[pos], pos + 1
            else:
                length, start = _varint(buf, pos, end)
            pos = start + length
            if pos > end:
                raise WireError(f"field {number} at offset {start} runs past its message")
            yield number, wire_type, start, pos
        elif wire_type == _VARINT:
            value, pos = _varint(buf, pos, end)
            yield number, wire_type, value, pos
        elif wire_type == _START_GROUP:
            pos = _skip_group(buf, pos, end, number)
        elif wire_type == _END_GROUP:
            raise WireError(f"end of group {number} without a start at offset {pos}")
        else:
            start = pos
            pos = _skip(buf, pos, end, wire_type)
            yield number, wire_type, start, pos


def _text(buf: bytes, start: int, stop: int) -> str:
    try:
        return str(buf[start:stop], "utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(f"invalid UTF-8 in a string field at offset {start}") from exc


def _int_parameter(buf: bytes, values: list[tuple[int, int]]) -> int | None:
    """The integer an ``InferParameter`` holds (its occurrences merged), else ``None``."""
    kind = 0
    value = 0
    for start, stop in values:
        for number, wire_type, a, _ in _fields(buf, start, stop):
            # Every member of the oneof counts: the last one set wins, as in a merge.
            if number in (_PARAM_BOOL, _PARAM_INT64, _PARAM_UINT64) and wire_type == _VARINT:
                kind, value = number, a
            elif (number == _PARAM_STRING and wire_type == _LEN) or (
                number == _PARAM_DOUBLE and wire_type == _FIXED64
            ):
                kind = number
    if kind == _PARAM_INT64:
        return _signed(value)
    if kind == _PARAM_UINT64:
        return value
    return None


def read_infer_header(body: bytes) -> InferHeader:
    """Read model name, version, id and the two timeout parameters of a ``ModelInferRequest``.

    Validates the top-level structure and the parameter entries; tensors (``inputs``,
    ``outputs``, ``raw_input_contents``) are stepped over. An empty model name is returned as
    is. Raises :class:`WireError` on truncation, invalid wire types or invalid UTF-8.
    """
    model_name = model_version = request_id = ""
    timeout_us: int | None = None
    timeout_ns: int | None = None
    for number, wire_type, start, stop in _fields(body, 0, len(body)):
        if wire_type != _LEN:
            continue
        if number == _REQ_MODEL_NAME:
            model_name = _text(body, start, stop)
        elif number == _REQ_MODEL_VERSION:
            model_version = _text(body, start, stop)
        elif number == _REQ_ID:
            request_id = _text(body, start, stop)
        elif number == _REQ_PARAMETERS:
            key = ""
            values: list[tuple[int, int]] = []
            for inner, inner_type, a, b in _fields(body, start, stop):
                if inner == _ENTRY_KEY and inner_type == _LEN:
                    key = _text(body, a, b)
                elif inner == _ENTRY_VALUE and inner_type == _LEN:
                    values.append((a, b))
            # A later entry of the same key replaces the earlier one, as protobuf maps do.
            if key == _TIMEOUT_US_KEY:
                timeout_us = _int_parameter(body, values)
            elif key == _TIMEOUT_NS_KEY:
                timeout_ns = _int_parameter(body, values)
    return InferHeader(model_name, model_version, request_id, timeout_us, timeout_ns)


def _input_tensor(buf: bytes, start: int, stop: int) -> tuple[bytes, list[int]]:
    """The raw name and the shape of an ``InferInputTensor`` (packed or unpacked)."""
    name = b""
    shape: list[int] = []
    for number, wire_type, a, b in _fields(buf, start, stop):
        if number == _INPUT_NAME and wire_type == _LEN:
            name = buf[a:b]
        elif number == _INPUT_SHAPE and wire_type == _VARINT:
            shape.append(_signed(a))
        elif number == _INPUT_SHAPE and wire_type == _LEN:
            pos = a
            while pos < b:
                dim, pos = _varint(buf, pos, b)
                shape.append(_signed(dim))
    return name, shape


def batch_units(body: bytes, input_name: str, axis: int) -> int:
    """Items in a request: the extent at 1-based ``axis`` of ``input_name``.

    1 when the axis is not positive, the input is missing, the axis is past its rank, the
    extent is not positive, or the body is malformed; never raises.
    """
    if axis <= 0:
        return 1
    try:
        target = input_name.encode("utf-8")
        for number, wire_type, start, stop in _fields(body, 0, len(body)):
            if number != _REQ_INPUTS or wire_type != _LEN:
                continue
            name, shape = _input_tensor(body, start, stop)
            if name == target:
                return shape[axis - 1] if axis <= len(shape) and shape[axis - 1] > 0 else 1
    except (WireError, UnicodeEncodeError):
        return 1
    return 1


def read_string_field(body: bytes, number: int) -> str:
    """The top-level string field ``number`` of a message, ``""`` when absent.

    Used for the ``name`` (1) of ``ModelReady``/``ModelMetadata``/``ModelConfig`` and the shared
    memory register/unregister requests. When the field repeats, the last occurrence wins, as
    the workers' parser decides. Raises :class:`WireError` on a malformed body.
    """
    value = ""
    for field, wire_type, start, stop in _fields(body, 0, len(body)):
        if field == number and wire_type == _LEN:
            value = _text(body, start, stop)
    return value


def _length_prefix(number: int, length: int) -> bytes:
    """Tag and length of a length-delimited field."""
    out = bytearray()
    for field in ((number << 3) | _LEN, length):
        rest = field
        while rest >= 0x80:
            out.append((rest & 0x7F) | 0x80)
            rest >>= 7
        out.append(rest)
    return bytes(out)


def stream_response(infer_response: bytes) -> bytes:
    """A ``ModelStreamInferResponse`` whose ``infer_response`` is the given serialized reply."""
    return _length_prefix(_STREAM_INFER_RESPONSE, len(infer_response)) + infer_response


def stream_error(message: str) -> bytes:
    """A ``ModelStreamInferResponse`` carrying only ``error_message``."""
    encoded = message.encode("utf-8")
    return _length_prefix(_STREAM_ERROR_MESSAGE, len(encoded)) + encoded


def deadline_ns(
    header: InferHeader, *, now_ns: int, grpc_time_remaining: float | None
) -> int | None:
    """The request's absolute ``time.monotonic_ns()`` deadline, ``None`` when unbounded.

    The tightest of the inbound gRPC deadline and the two timeout parameters, computed exactly
    as the worker computes it (:func:`reactantserver.core.codec.effective_deadline_ns`).
    """
    return effective_deadline_ns(
        now_ns,
        grpc_time_remaining=grpc_time_remaining,
        timeout_us=header.timeout_us,
        timeout_ns=header.timeout_ns,
    )
