"""``POST .../infer``: the KServe V2 REST body <-> ``ModelInferRequest``/``ModelInferResponse``.

A request body is a JSON header (``Inference-Header-Content-Length`` bytes long, else the
whole body) followed by the binary blobs of the inputs that declared ``binary_data_size``, in
input order. Every input that carries data goes out in ``raw_input_contents``, as
``tritonclient.grpc`` sends it; shared-memory inputs keep their parameters and carry none.
REST-only parameters (``binary_data_size``, ``binary_data``, ``binary_data_output``) are
consumed here; ``classification`` is refused. Nothing is checked against the model: the
service does that and answers with its status.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import grpc
import numpy as np

from reactantserver.core.codec._bytes import parse_bytes
from reactantserver.core.codec._contents import typed_to_array
from reactantserver.core.codec._params import param_value
from reactantserver.core.codec._tensor import SHM_REGION, wire_payload
from reactantserver.core.dtypes import DType
from reactantserver.core.errors import ReactantError
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.rest._json import (
    bad_request,
    infer_parameter,
    json_type,
    parse_json_object,
)
from reactantserver.core.rest._types import (
    CONTENT_TYPE,
    JSON,
    OCTET_STREAM,
    RestCallError,
    RestResponse,
)

__all__ = ["HEADER_LENGTH", "OutputPlan", "infer_request", "infer_response"]

#: The binary tensor extension's header: how many leading body bytes are the JSON header.
HEADER_LENGTH = "Inference-Header-Content-Length"
_BINARY_DATA_SIZE = "binary_data_size"
_BINARY_DATA = "binary_data"
_BINARY_DATA_OUTPUT = "binary_data_output"
_CLASSIFICATION = "classification"
_LENGTH = struct.Struct("<I")


@attrs.frozen
class OutputPlan:
    """How the client wants outputs back: binary or JSON, per output name or by default."""

    binary_default: bool = False
    binary: Mapping[str, bool] = attrs.field(factory=dict)

    def is_binary(self, name: str) -> bool:
        """Whether output ``name`` goes in the binary section of the response body."""
        return self.binary.get(name, self.binary_default)


def infer_request(
    model: str, version: str, headers: Mapping[str, str], body: bytes
) -> tuple[pb.ModelInferRequest, OutputPlan]:
    """The ``ModelInferRequest`` an infer body stands for, and how to shape the answer.

    Malformed bodies raise :class:`RestCallError` (``INVALID_ARGUMENT``).
    """
    header, blobs = _split_body(headers, body)
    doc = parse_json_object(header, "inference request", empty_ok=False)
    msg = pb.ModelInferRequest(model_name=model, model_version=version)
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise bad_request(f"inference request: 'id' must be a string, got {json_type(request_id)}")
    msg.id = request_id
    params = _object(doc, "parameters", "inference request")
    binary_default = params.pop(_BINARY_DATA_OUTPUT, False)
    if not isinstance(binary_default, bool):
        raise bad_request(f"inference request: parameter {_BINARY_DATA_OUTPUT!r} must be a bool")
    for key, value in params.items():
        if key == "priority" and type(value) is int and 0 <= value < 1 << 64:
            msg.parameters[key].uint64_param = value  # as tritonclient.grpc sends it
            continue
        infer_parameter(msg.parameters, key, value, "inference request")
    cursor = 0
    for i, tensor in enumerate(_list(doc, "inputs", "inference request", required=True)):
        cursor = _add_input(msg, tensor, i, blobs, cursor)
    if cursor != len(blobs):
        raise bad_request(
            f"inference request: {len(blobs) - cursor} bytes of binary data follow the inputs' "
            f"{cursor} (check '{_BINARY_DATA_SIZE}' and {HEADER_LENGTH})"
        )
    binary: dict[str, bool] = {}
    for i, tensor in enumerate(_list(doc, "outputs", "inference request", required=False)):
        name, wants_binary = _add_output(msg, tensor, i)
        if wants_binary is not None:
            binary[name] = wants_binary
    return msg, OutputPlan(binary_default, binary)


def _split_body(headers: Mapping[str, str], body: bytes) -> tuple[bytes, memoryview]:
    wanted = HEADER_LENGTH.lower()
    length = next((v for k, v in headers.items() if k.lower() == wanted), None)
    if length is None:
        return body, memoryview(b"")
    try:
        size = int(length)
    except ValueError:
        raise bad_request(f"{HEADER_LENGTH} {length!r} is not an integer") from None
    if not 0 <= size <= len(body):
        raise bad_request(f"{HEADER_LENGTH} {size} is outside the {len(body)}-byte body")
    view = memoryview(body)
    return bytes(view[:size]), view[size:]


def _object(doc: Mapping[str, Any], key: str, what: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise bad_request(f"{what}: {key!r} must be an object, got {json_type(value)}")
    return dict(value)


def _list(doc: Mapping[str, Any], key: str, what: str, *, required: bool) -> list[Any]:
    if key not in doc and required:
        raise bad_request(f"{what}: missing {key!r}")
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise bad_request(f"{what}: {key!r} must be an array, got {json_type(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise bad_request(f"{what}: {key}[{i}] must be an object, got {json_type(item)}")
    return value


def _add_input(
    msg: pb.ModelInferRequest, tensor: Mapping[str, Any], index: int, blobs: memoryview, at: int
) -> int:
    name = tensor.get("name")
    if not isinstance(name, str):
        raise bad_request(f"input #{index}: 'name' must be a string, got {json_type(name)}")
    what = f"input {name!r}"
    datatype = tensor.get("datatype")
    if not isinstance(datatype, str):
        raise bad_request(f"{what}: 'datatype' must be a string, got {json_type(datatype)}")
    try:
        dtype = DType.from_kserve(datatype)
    except ValueError:
        raise bad_request(f"{what}: unknown datatype {datatype!r}") from None
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise bad_request(f"{what}: 'shape' must be an array of non-negative integers")
    wire = msg.inputs.add(name=name, datatype=datatype, shape=shape)
    params = _object(tensor, "parameters", what)
    size = params.pop(_BINARY_DATA_SIZE, None)
    for key, value in params.items():
        infer_parameter(wire.parameters, key, value, what)
    has_data = "data" in tensor
    sources = [has_data, size is not None, SHM_REGION in params]
    if sum(sources) > 1:
        raise bad_request(
            f"{what}: give only one of 'data', '{_BINARY_DATA_SIZE}' and '{SHM_REGION}'"
        )
    if SHM_REGION in params:
        return at
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise bad_request(f"{what}: '{_BINARY_DATA_SIZE}' must be a non-negative integer")
        if at + size > len(blobs):
            raise bad_request(
                f"{what}: '{_BINARY_DATA_SIZE}' is {size} but only {len(blobs) - at} bytes of "
                "binary data are left in the body"
            )
        msg.raw_input_contents.append(bytes(blobs[at : at + size]))
        return at + size
    if not has_data:
        raise bad_request(f"{what}: no 'data', '{_BINARY_DATA_SIZE}' or '{SHM_REGION}'")
    msg.raw_input_contents.append(_json_to_raw(tensor["data"], dtype, shape, what))
    return at


def _add_output(
    msg: pb.ModelInferRequest, tensor: Mapping[str, Any], index: int
) -> tuple[str, bool | None]:
    name = tensor.get("name")
    if not isinstance(name, str):
        raise bad_request(f"output #{index}: 'name' must be a string, got {json_type(name)}")
    what = f"output {name!r}"
    wanted = msg.outputs.add(name=name)
    params = _object(tensor, "parameters", what)
    binary = params.pop(_BINARY_DATA, None)
    if binary is not None and not isinstance(binary, bool):
        raise bad_request(f"{what}: parameter '{_BINARY_DATA}' must be a bool")
    if params.pop(_CLASSIFICATION, 0) not in (0, False):
        raise bad_request(f"{what}: parameter '{_CLASSIFICATION}' is not supported")
    for key, value in params.items():
        infer_parameter(wanted.parameters, key, value, what)
    return name, binary


def _flatten(data: Any, out: list[Any]) -> None:
    if isinstance(data, list):
        for item in data:
            _flatten(item, out)
    else:
        out.append(data)


def _json_to_raw(data: Any, dtype: DType, shape: Sequence[int], what: str) -> bytes:
    """The raw (little-endian) bytes of JSON tensor data, checked against shape and type."""
    if dtype is DType.BF16:
        raise bad_request(f"{what}: BF16 data must be sent binary ('{_BINARY_DATA_SIZE}')")
    if not isinstance(data, list):
        raise bad_request(f"{what}: 'data' must be an array, got {json_type(data)}")
    flat: list[Any] = []
    _flatten(data, flat)
    elements = math.prod(shape)
    if len(flat) != elements:
        raise bad_request(
            f"{what}: 'data' has {len(flat)} elements, shape {list(shape)} needs {elements}"
        )
    if dtype is DType.BYTES:
        if not all(isinstance(item, str) for item in flat):
            raise bad_request(f"{what}: BYTES data must be strings")
        encoded = [item.encode("utf-8") for item in flat]
        return b"".join(_LENGTH.pack(len(item)) + item for item in encoded)
    np_dtype = dtype.numpy.newbyteorder("<")
    if dtype is DType.BOOL:
        if not all(isinstance(item, bool) for item in flat):
            raise bad_request(f"{what}: BOOL data must be true or false")
    elif np_dtype.kind in "iu":
        if not all(isinstance(item, int) and not isinstance(item, bool) for item in flat):
            raise bad_request(f"{what}: {dtype.kserve} data must be integers")
        info = np.iinfo(np_dtype)
        if flat and not info.min <= min(flat) <= max(flat) <= info.max:
            raise bad_request(f"{what}: {dtype.kserve} data out of range")
    elif not all(isinstance(item, int | float) and not isinstance(item, bool) for item in flat):
        raise bad_request(f"{what}: {dtype.kserve} data must be numbers")
    with np.errstate(over="ignore"):  # a float beyond FP16/FP32 range becomes inf, as in numpy
        return np.array(flat, dtype=np_dtype).tobytes()


def infer_response(msg: pb.ModelInferResponse, plan: OutputPlan) -> RestResponse:
    """The REST answer for ``msg``: JSON, or JSON header + blobs when any output is binary."""
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for index, tensor in enumerate(msg.outputs):
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        params = _plain(tensor.parameters)
        if SHM_REGION not in params:
            raw = _output_bytes(msg, index)
            data = None if plan.is_binary(tensor.name) else _raw_to_json(raw, tensor)
            if data is None:
                params[_BINARY_DATA_SIZE] = len(raw)
                blobs.append(raw)
            else:
                entry["data"] = data
        if params:
            entry["parameters"] = params
        outputs.append(entry)
    doc: dict[str, Any] = {"model_name": msg.model_name, "model_version": msg.model_version}
    if msg.id:
        doc["id"] = msg.id
    if msg.parameters:
        doc["parameters"] = _plain(msg.parameters)
    doc["outputs"] = outputs
    header = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return RestResponse(200, header, {CONTENT_TYPE: JSON})
    return RestResponse(
        200,
        b"".join([header, *blobs]),
        {CONTENT_TYPE: OCTET_STREAM, HEADER_LENGTH: str(len(header))},
    )


def _plain(params: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in sorted(params):
        value = param_value(params[key])
        if value is not None:
            out[key] = value
    return out


def _malformed(msg: pb.ModelInferResponse, detail: str) -> RestCallError:
    return RestCallError(
        grpc.StatusCode.INTERNAL,
        f"malformed inference response for model {msg.model_name!r}: {detail}",
    )


def _output_bytes(msg: pb.ModelInferResponse, index: int) -> bytes:
    """Output ``index``'s raw bytes: index-aligned raw, raw for non-shm outputs only, or typed."""
    raw = msg.raw_output_contents
    tensor = msg.outputs[index]
    if len(raw) == len(msg.outputs):
        return raw[index]
    data_outputs = [i for i, t in enumerate(msg.outputs) if SHM_REGION not in t.parameters]
    if raw and len(raw) == len(data_outputs):
        return raw[data_outputs.index(index)]
    if raw:
        raise _malformed(msg, f"{len(raw)} raw_output_contents for {len(msg.outputs)} outputs")
    what = f"output {tensor.name!r}"
    try:
        dtype = DType.from_kserve(tensor.datatype)
        shape = tuple(tensor.shape)
        elements = math.prod(shape)
        array = typed_to_array(tensor.contents, dtype, shape, elements, what)
        return bytes(wire_payload(array, dtype, what))
    except (ReactantError, ValueError) as exc:
        raise _malformed(msg, str(exc)) from None


def _raw_to_json(raw: bytes, tensor: pb.ModelInferResponse.InferOutputTensor) -> list[Any] | None:
    """Flat JSON data of an output, or ``None`` when it cannot be JSON (non-UTF-8 BYTES)."""
    what = f"output {tensor.name!r}"
    try:
        dtype = DType.from_kserve(tensor.datatype)
    except ValueError:
        return None  # an unknown datatype can only travel as bytes
    elements = math.prod(tensor.shape)
    if dtype is DType.BYTES:
        try:
            items = parse_bytes(raw, (elements,), what)
            return [item.decode("utf-8") for item in items]
        except (ReactantError, UnicodeDecodeError):
            # Binary-safe fallback: tritonclient reads binary_data_size outputs either way.
            return None
    if len(raw) != elements * dtype.itemsize:
        return None
    if dtype is DType.BF16:
        bits = np.frombuffer(raw, dtype="<u2").astype("<u4") << 16
        return bits.view("<f4").tolist()  # type: ignore[no-any-return]
    return np.frombuffer(raw, dtype=dtype.numpy.newbyteorder("<")).tolist()  # type: ignore[no-any-return]
