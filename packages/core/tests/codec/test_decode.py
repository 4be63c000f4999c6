"""decode_request: every rejection, check order, zero-copy, no early allocation."""

from __future__ import annotations

import os
import struct
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from reactantserver.core import codec
from reactantserver.core.codec import decode_request
from reactantserver.core.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    ReactantError,
    RegionNotRegisteredError,
)
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.shm import SharedMemoryRegistry
from reactantserver.core.types import OutputRequest, ShmRef

MAX_RECV = 64 << 20
REGION_SIZE = 4096

Request = pb.ModelInferRequest
Builder = Callable[[Request], None]


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    """A registry with region 'reg' (4096 bytes of a fresh /dev/shm object, offset 0)."""
    name = f"rs-test-codec-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    path = os.path.join("/dev/shm", name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, REGION_SIZE)
    finally:
        os.close(fd)
    reg = SharedMemoryRegistry()
    try:
        reg.register("reg", "/" + name, 0, REGION_SIZE)
        yield reg
    finally:
        reg.close()
        os.unlink(path)


def _request(model: str = "m") -> Request:
    return pb.ModelInferRequest(model_name=model, id="req-1")


def _add(
    msg: Request,
    name: str,
    datatype: str,
    shape: list[int],
    raw: bytes | None = None,
    **params: int | str,
) -> pb.ModelInferRequest.InferInputTensor:
    tensor = msg.inputs.add(name=name, datatype=datatype, shape=shape)
    for key, value in params.items():
        if isinstance(value, str):
            tensor.parameters[key].string_param = value
        else:
            tensor.parameters[key].int64_param = value
    if raw is not None:
        msg.raw_input_contents.append(raw)
    return tensor


def _shm_input(
    msg: Request, name: str, datatype: str, shape: list[int], **params: int | str
) -> None:
    params.setdefault("shared_memory_region", "reg")
    _add(msg, name, datatype, shape, None, **params)


def _output(msg: Request, name: str, **params: int | str | bool) -> None:
    out = msg.outputs.add(name=name)
    for key, value in params.items():
        if isinstance(value, bool):
            out.parameters[key].bool_param = value
        elif isinstance(value, str):
            out.parameters[key].string_param = value
        else:
            out.parameters[key].int64_param = value


def _decode(msg: Request, registry: SharedMemoryRegistry | None = None, **kw: Any) -> Any:
    kw.setdefault("max_recv_msg_bytes", MAX_RECV)
    kw.setdefault("now_ns", 10**12)
    return decode_request(msg, registry=registry, **kw)


def _bytes_raw(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def _f32(n: int) -> bytes:
    return np.arange(n, dtype="<f4").tobytes()


# --- the error table ----------------------------------------------------------------------
# Each case builds a request, and names the exception type and the words the message must
# contain (the model and the offending input, output or parameter).


def _empty_model(msg: Request) -> None:
    msg.model_name = ""


def _unknown_datatype(msg: Request) -> None:
    _add(msg, "x", "FP128", [1], b"\0" * 16)


def _fp8_datatype(msg: Request) -> None:
    _add(msg, "x", "F8_E4M3", [1], b"\0")


def _negative_dim(msg: Request) -> None:
    _add(msg, "x", "FP32", [2, -1], b"")


def _overflow_shape(msg: Request) -> None:
    _add(msg, "x", "FP32", [2**31, 2**31], b"\0" * 4)


def _overflow_shape_int64(msg: Request) -> None:
    _add(msg, "x", "INT8", [2**62, 2**62, 4], b"\0")


def _too_many_bytes(msg: Request) -> None:
    _add(msg, "x", "FP32", [2**30, 2**30], b"\0" * 4)


def _raw_size_short(msg: Request) -> None:
    _add(msg, "x", "FP32", [2, 3], _f32(5))


def _raw_size_long(msg: Request) -> None:
    _add(msg, "x", "INT64", [2], b"\0" * 17)


def _raw_count_low(msg: Request) -> None:
    _add(msg, "a", "FP32", [1], _f32(1))
    _add(msg, "b", "FP32", [1])


def _raw_count_high(msg: Request) -> None:
    _add(msg, "a", "FP32", [1], _f32(1))
    msg.raw_input_contents.append(_f32(1))


def _raw_count_with_shm(msg: Request) -> None:
    # The SHM input takes no raw entry, so two entries for one data input are too many.
    _shm_input(msg, "s", "FP32", [1], shared_memory_byte_size=4)
    _add(msg, "a", "FP32", [1], _f32(1))
    msg.raw_input_contents.append(_f32(1))


def _raw_and_typed(msg: Request) -> None:
    tensor = _add(msg, "x", "FP32", [1], _f32(1))
    tensor.contents.fp32_contents.append(1.0)


def _missing_data(msg: Request) -> None:
    _add(msg, "x", "FP32", [3])


def _typed_fp16(msg: Request) -> None:
    _add(msg, "x", "FP16", [1]).contents.fp32_contents.append(1.0)


def _typed_bf16(msg: Request) -> None:
    _add(msg, "x", "BF16", [2]).contents.uint_contents.extend([1, 2])


def _untyped_fp16_without_data(msg: Request) -> None:
    _add(msg, "x", "FP16", [2])


def _typed_count(msg: Request) -> None:
    _add(msg, "x", "INT32", [2, 2]).contents.int_contents.extend([1, 2, 3])


def _typed_wrong_field(msg: Request) -> None:
    _add(msg, "x", "INT32", [1]).contents.int64_contents.append(1)


def _typed_out_of_range(msg: Request) -> None:
    _add(msg, "x", "UINT8", [2]).contents.uint_contents.extend([1, 256])


def _typed_negative_int8(msg: Request) -> None:
    _add(msg, "x", "INT8", [1]).contents.int_contents.append(-129)


def _bytes_short_prefix(msg: Request) -> None:
    _add(msg, "x", "BYTES", [1], b"\x01\x00")


def _bytes_past_end(msg: Request) -> None:
    _add(msg, "x", "BYTES", [1], struct.pack("<I", 10) + b"abc")


def _bytes_truncated_prefix(msg: Request) -> None:
    # Enough bytes for two prefixes overall, but the second one is cut off after "ab".
    _add(msg, "x", "BYTES", [2], _bytes_raw(b"ab") + b"\x03\x00")


def _bytes_trailing(msg: Request) -> None:
    _add(msg, "x", "BYTES", [1], _bytes_raw(b"ab") + b"z")


def _bytes_too_few(msg: Request) -> None:
    _add(msg, "x", "BYTES", [3], _bytes_raw(b"a", b"b"))


def _bytes_huge_shape(msg: Request) -> None:
    _add(msg, "x", "BYTES", [2**40], _bytes_raw(b"a"))


def _bytes_typed_count(msg: Request) -> None:
    _add(msg, "x", "BYTES", [2]).contents.bytes_contents.append(b"a")


def _bool_raw_garbage(msg: Request) -> None:
    _add(msg, "x", "BOOL", [2], b"\x01\x02")


def _duplicate_input(msg: Request) -> None:
    _add(msg, "x", "FP32", [1], _f32(1))
    _add(msg, "x", "FP32", [1], _f32(1))


def _unnamed_input(msg: Request) -> None:
    _add(msg, "", "FP32", [1], _f32(1))


def _duplicate_output(msg: Request) -> None:
    _add(msg, "x", "FP32", [1], _f32(1))
    _output(msg, "y")
    _output(msg, "y")


def _unnamed_output(msg: Request) -> None:
    _output(msg, "")


def _classification(msg: Request) -> None:
    _output(msg, "y", classification=3)


def _sequence_id_int(msg: Request) -> None:
    msg.parameters["sequence_id"].int64_param = 7


def _sequence_id_uint(msg: Request) -> None:
    msg.parameters["sequence_id"].uint64_param = 7


def _sequence_id_str(msg: Request) -> None:
    msg.parameters["sequence_id"].string_param = "corr-1"


def _priority_type(msg: Request) -> None:
    msg.parameters["priority"].string_param = "high"


def _priority_negative(msg: Request) -> None:
    msg.parameters["priority"].int64_param = -1


def _timeout_type(msg: Request) -> None:
    msg.parameters["timeout"].double_param = 1.5


def _reactant_timeout_type(msg: Request) -> None:
    msg.parameters["reactant_timeout_ns"].bool_param = True


def _shm_unregistered(msg: Request) -> None:
    _shm_input(msg, "x", "FP32", [1], shared_memory_region="ghost", shared_memory_byte_size=4)


def _shm_out_unregistered(msg: Request) -> None:
    _output(msg, "y", shared_memory_region="ghost", shared_memory_byte_size=4)


def _shm_missing_byte_size(msg: Request) -> None:
    _shm_input(msg, "x", "FP32", [1])


def _shm_out_missing_byte_size(msg: Request) -> None:
    _output(msg, "y", shared_memory_region="reg")


def _shm_negative_offset(msg: Request) -> None:
    _shm_input(msg, "x", "FP32", [1], shared_memory_byte_size=4, shared_memory_offset=-4)


def _shm_out_negative_offset(msg: Request) -> None:
    _output(
        msg, "y", shared_memory_region="reg", shared_memory_byte_size=4, shared_memory_offset=-1
    )


def _shm_outside(msg: Request) -> None:
    _shm_input(
        msg, "x", "FP32", [4], shared_memory_byte_size=16, shared_memory_offset=REGION_SIZE - 8
    )


def _shm_offset_huge(msg: Request) -> None:
    tensor = msg.inputs.add(name="x", datatype="FP32", shape=[1])
    tensor.parameters["shared_memory_region"].string_param = "reg"
    tensor.parameters["shared_memory_byte_size"].int64_param = 4
    tensor.parameters["shared_memory_offset"].uint64_param = 2**64 - 4


def _shm_out_outside(msg: Request) -> None:
    _output(msg, "y", shared_memory_region="reg", shared_memory_byte_size=REGION_SIZE + 1)


def _shm_size_mismatch(msg: Request) -> None:
    _shm_input(msg, "x", "FP32", [2], shared_memory_byte_size=12)


def _shm_and_typed(msg: Request) -> None:
    _shm_input(msg, "x", "FP32", [1], shared_memory_byte_size=4)
    msg.inputs[0].contents.fp32_contents.append(1.0)


def _shm_offset_without_region(msg: Request) -> None:
    _add(msg, "x", "FP32", [1], _f32(1), shared_memory_offset=0)


def _shm_region_not_string(msg: Request) -> None:
    _add(msg, "x", "FP32", [1], shared_memory_region=3, shared_memory_byte_size=4)


def _shm_empty_region(msg: Request) -> None:
    _shm_input(msg, "x", "FP32", [1], shared_memory_region="", shared_memory_byte_size=4)


def _shm_bytes_malformed(msg: Request) -> None:
    _shm_input(msg, "x", "BYTES", [2], shared_memory_byte_size=12)


INVALID = InvalidArgumentError
UNREGISTERED = RegionNotRegisteredError

ERROR_CASES: list[tuple[Builder, type[ReactantError], list[str]]] = [
    (_empty_model, INVALID, ["model_name"]),
    (_unknown_datatype, INVALID, ["'x'", "'FP128'", "model 'm'"]),
    (_fp8_datatype, INVALID, ["'x'", "F8_E4M3"]),
    (_negative_dim, INVALID, ["'x'", "negative"]),
    (_overflow_shape, INVALID, ["'x'", "too many elements"]),
    (_overflow_shape_int64, INVALID, ["'x'", "too many elements"]),
    (_too_many_bytes, INVALID, ["'x'", "max_recv_msg_bytes"]),
    (_raw_size_short, INVALID, ["'x'", "20 bytes", "needs 24"]),
    (_raw_size_long, INVALID, ["'x'", "17 bytes", "needs 16"]),
    (_raw_count_low, INVALID, ["raw_input_contents", "'a', 'b'"]),
    (_raw_count_high, INVALID, ["2 entries", "'a'"]),
    (_raw_count_with_shm, INVALID, ["2 entries", "1 data inputs ('a')"]),
    (_raw_and_typed, INVALID, ["'x'", "typed contents"]),
    (_missing_data, INVALID, ["'x'", "missing data"]),
    (_typed_fp16, INVALID, ["'x'", "FP16 has no typed contents"]),
    (_typed_bf16, INVALID, ["'x'", "BF16 has no typed contents"]),
    (_untyped_fp16_without_data, INVALID, ["'x'", "FP16"]),
    (_typed_count, INVALID, ["'x'", "3 values", "needs 4"]),
    (_typed_wrong_field, INVALID, ["'x'", "int_contents", "int64_contents"]),
    (_typed_out_of_range, INVALID, ["'x'", "UINT8 range"]),
    (_typed_negative_int8, INVALID, ["'x'", "INT8 range"]),
    (_bytes_short_prefix, INVALID, ["'x'", "cannot hold 1 elements"]),
    (_bytes_past_end, INVALID, ["'x'", "element 0", "past the end"]),
    (_bytes_truncated_prefix, INVALID, ["'x'", "element 1", "truncated length prefix"]),
    (_bytes_trailing, INVALID, ["'x'", "1 trailing bytes"]),
    (_bytes_too_few, INVALID, ["'x'", "3 elements"]),
    (_bytes_huge_shape, INVALID, ["'x'", "cannot hold"]),
    (_bytes_typed_count, INVALID, ["'x'", "bytes_contents has 1 values"]),
    (_bool_raw_garbage, INVALID, ["'x'", "BOOL"]),
    (_duplicate_input, INVALID, ["'x'", "more than once"]),
    (_unnamed_input, INVALID, ["input #0"]),
    (_duplicate_output, INVALID, ["output 'y'", "more than once"]),
    (_unnamed_output, INVALID, ["output #0"]),
    (_classification, INVALID, ["output 'y'", "'classification'"]),
    (_sequence_id_int, INVALID, ["'sequence_id'"]),
    (_sequence_id_uint, INVALID, ["'sequence_id'"]),
    (_sequence_id_str, INVALID, ["'sequence_id'"]),
    (_priority_type, INVALID, ["'priority'", "string_param"]),
    (_priority_negative, INVALID, ["'priority'", "negative"]),
    (_timeout_type, INVALID, ["'timeout'", "double_param"]),
    (_reactant_timeout_type, INVALID, ["'reactant_timeout_ns'"]),
    (_shm_unregistered, UNREGISTERED, ["input 'x'", "unregistered shared memory region 'ghost'"]),
    (_shm_out_unregistered, UNREGISTERED, ["output 'y'", "region 'ghost'"]),
    (_shm_missing_byte_size, INVALID, ["'x'", "'shared_memory_byte_size' is required"]),
    (_shm_out_missing_byte_size, INVALID, ["output 'y'", "'shared_memory_byte_size'"]),
    (_shm_negative_offset, INVALID, ["'x'", "'shared_memory_offset' is negative"]),
    (_shm_out_negative_offset, INVALID, ["output 'y'", "'shared_memory_offset'"]),
    (_shm_outside, INVALID, ["input 'x'", "region 'reg'", "exceeds"]),
    (_shm_offset_huge, INVALID, ["input 'x'", "region 'reg'", "overflow"]),
    (_shm_out_outside, INVALID, ["output 'y'", "region 'reg'", "exceeds"]),
    (_shm_size_mismatch, INVALID, ["'x'", "shared_memory_byte_size is 12", "needs 8"]),
    (_shm_and_typed, INVALID, ["'x'", "typed contents"]),
    (_shm_offset_without_region, INVALID, ["'x'", "'shared_memory_offset' without"]),
    (_shm_region_not_string, INVALID, ["'x'", "'shared_memory_region'", "string"]),
    (_shm_empty_region, INVALID, ["'x'", "empty"]),
    (_shm_bytes_malformed, INVALID, ["'x'", "shared memory", "BYTES"]),
]


@pytest.mark.parametrize(
    ("build", "exc_type", "words"), ERROR_CASES, ids=[c[0].__name__.strip("_") for c in ERROR_CASES]
)
def test_decode_errors(
    registry: SharedMemoryRegistry,
    build: Builder,
    exc_type: type[ReactantError],
    words: list[str],
) -> None:
    msg = _request()
    build(msg)
    with pytest.raises(exc_type) as info:
        _decode(msg, registry)
    assert type(info.value) is exc_type
    expected = (
        grpc.StatusCode.FAILED_PRECONDITION
        if exc_type is RegionNotRegisteredError
        else grpc.StatusCode.INVALID_ARGUMENT
    )
    assert info.value.status == expected
    text = str(info.value)
    assert "\n" not in text
    for word in words:
        assert word in text, (word, text)
    if build is not _empty_model:
        assert "model 'm'" in text
    # Whatever failed, no lease of the request is left behind.
    registry.unregister("")
    assert registry.live_mappings() == 0


def test_shm_without_registry_is_unregistered() -> None:
    msg = _request()
    _shm_input(msg, "x", "FP32", [1], shared_memory_byte_size=4)
    with pytest.raises(RegionNotRegisteredError, match=r"input 'x'.*'reg'"):
        _decode(msg, None)
    msg = _request()
    _output(msg, "y", shared_memory_region="reg", shared_memory_byte_size=4)
    with pytest.raises(RegionNotRegisteredError, match="output 'y'"):
        _decode(msg, None)


def test_expired_grpc_deadline() -> None:
    msg = _request()
    _add(msg, "x", "FP32", [1], _f32(1))
    with pytest.raises(DeadlineExceededError, match="model 'm'") as info:
        _decode(msg, grpc_time_remaining=0.0)
    assert info.value.status == grpc.StatusCode.DEADLINE_EXCEEDED


# --- order of checks ----------------------------------------------------------------------


def test_model_name_checked_first() -> None:
    msg = _request(model="")
    _add(msg, "x", "NOPE", [1])
    with pytest.raises(InvalidArgumentError, match="model_name"):
        _decode(msg)


def test_headers_checked_before_data() -> None:
    # Input 'a' has a raw size problem (step 3), input 'b' a bad datatype (step 2): step 2 wins.
    msg = _request()
    _add(msg, "a", "FP32", [2], _f32(1))
    _add(msg, "b", "WHAT", [1], b"")
    with pytest.raises(InvalidArgumentError, match=r"'b'.*unknown datatype"):
        _decode(msg)


def test_inputs_before_outputs_before_parameters() -> None:
    msg = _request()
    _add(msg, "x", "FP32", [1])  # missing data
    _output(msg, "y", classification=1)
    msg.parameters["sequence_id"].int64_param = 1
    with pytest.raises(InvalidArgumentError, match="missing data"):
        _decode(msg)
    del msg.inputs[:]
    with pytest.raises(InvalidArgumentError, match="classification"):
        _decode(msg)
    del msg.outputs[:]
    with pytest.raises(InvalidArgumentError, match="sequence_id"):
        _decode(msg)


def test_leases_released_when_a_later_step_fails(registry: SharedMemoryRegistry) -> None:
    msg = _request()
    _shm_input(msg, "x", "FP32", [4], shared_memory_byte_size=16)
    _output(msg, "y", classification=2)
    with pytest.raises(InvalidArgumentError):
        _decode(msg, registry)
    registry.unregister("reg")
    assert registry.live_mappings() == 0


# --- nothing is allocated from a declared size --------------------------------------------


@pytest.mark.parametrize(
    ("datatype", "shape", "raw"),
    [
        ("FP32", [2**30, 2**30], b"\0" * 4),
        ("INT8", [2**20, 2**20], b"\0"),
        ("BYTES", [2**30, 2**30], _bytes_raw(b"a")),
        ("BYTES", [2**40], None),
        ("FP64", [2**40], None),
    ],
)
def test_huge_declared_shape_fails_fast(datatype: str, shape: list[int], raw: bytes | None) -> None:
    msg = _request()
    tensor = _add(msg, "x", datatype, shape, raw)
    if raw is None and datatype == "BYTES":
        tensor.contents.bytes_contents.append(b"a")
    elif raw is None:
        tensor.contents.fp64_contents.append(1.0)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidArgumentError, match="'x'"):
            _decode(msg, max_recv_msg_bytes=1 << 62)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_huge_shm_declared_shape_fails_fast(registry: SharedMemoryRegistry) -> None:
    msg = _request()
    _shm_input(msg, "x", "FP32", [2**30, 2**30], shared_memory_byte_size=16)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidArgumentError, match=r"'x'.*needs 4611686018427387904"):
            _decode(msg, registry)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


# --- successful decoding ------------------------------------------------------------------


def test_raw_inputs_are_zero_copy_read_only_views() -> None:
    msg = _request()
    data = np.arange(6, dtype="<f4").reshape(2, 3)
    _add(msg, "x", "FP32", [2, 3], data.tobytes())
    wire = pb.ModelInferRequest.FromString(msg.SerializeToString())
    request = _decode(wire)
    (x,) = request.inputs
    np.testing.assert_array_equal(x.data, data)
    assert not x.data.flags.writeable
    root: Any = x.data
    while isinstance(root, np.ndarray):
        root = root.base
    # The array views the bytes the message holds: no copy was made to build it.
    assert isinstance(root, bytes)
    assert root == data.tobytes()
    assert np.shares_memory(x.data, np.frombuffer(root, dtype=np.uint8))


def test_shm_inputs_view_the_mapping(registry: SharedMemoryRegistry) -> None:
    data = np.arange(8, dtype="<i8")
    registry.write("reg", 64, data)
    msg = _request()
    _add(msg, "a", "FP32", [2], _f32(2))
    _shm_input(msg, "x", "INT64", [2, 4], shared_memory_byte_size=64, shared_memory_offset=64)
    _add(msg, "b", "INT8", [1], b"\x07")
    request = _decode(msg, registry)
    a, x, b = request.inputs
    assert (a.name, x.name, b.name) == ("a", "x", "b")
    np.testing.assert_array_equal(x.data, data.reshape(2, 4))
    assert not x.data.flags.writeable
    assert b.data.tolist() == [7]
    # A zero-copy view: a later write to the region shows through.
    registry.write("reg", 64, np.array([42], dtype="<i8"))
    assert x.data[0, 0] == 42
    assert len(request.leases) == 1
    registry.unregister("reg")
    assert registry.live_mappings() == 1
    del a, x, b
    request.inputs.clear()
    request.release()
    assert request.leases == []
    assert registry.live_mappings() == 0


def test_shm_bytes_input(registry: SharedMemoryRegistry) -> None:
    serialized = _bytes_raw(b"alpha", b"", b"\x00\xff")
    registry.write("reg", 10, serialized)
    msg = _request()
    _shm_input(
        msg,
        "s",
        "BYTES",
        [3],
        shared_memory_byte_size=len(serialized),
        shared_memory_offset=10,
    )
    request = _decode(msg, registry)
    assert request.inputs[0].data.dtype == object
    assert request.inputs[0].data.tolist() == [b"alpha", b"", b"\x00\xff"]
    # BYTES are copied out, so no lease is held.
    assert request.leases == []


def test_shm_offset_and_byte_size_as_uint64(registry: SharedMemoryRegistry) -> None:
    registry.write("reg", 8, np.array([3.5], dtype="<f4"))
    msg = _request()
    tensor = msg.inputs.add(name="x", datatype="FP32", shape=[1])
    tensor.parameters["shared_memory_region"].string_param = "reg"
    tensor.parameters["shared_memory_byte_size"].uint64_param = 4
    tensor.parameters["shared_memory_offset"].uint64_param = 8
    request = _decode(msg, registry)
    assert request.inputs[0].data.tolist() == [3.5]
    request.release()


def test_requested_outputs(registry: SharedMemoryRegistry) -> None:
    msg = _request()
    _output(msg, "plain", binary_data=True)
    _output(msg, "to_shm", shared_memory_region="reg", shared_memory_byte_size=128)
    _output(
        msg,
        "offset",
        shared_memory_region="reg",
        shared_memory_byte_size=16,
        shared_memory_offset=REGION_SIZE - 16,
    )
    request = _decode(msg, registry)
    assert request.outputs == [
        OutputRequest("plain"),
        OutputRequest("to_shm", ShmRef("reg", 0, 128)),
        OutputRequest("offset", ShmRef("reg", REGION_SIZE - 16, 16)),
    ]
    assert request.leases == []


def test_request_fields_and_parameters() -> None:
    msg = _request()
    msg.model_version = "1"
    msg.parameters["priority"].uint64_param = 3
    msg.parameters["sequence_id"].int64_param = 0
    msg.parameters["sequence_start"].bool_param = False
    msg.parameters["sequence_end"].bool_param = False
    msg.parameters["binary_data_output"].bool_param = True
    msg.parameters["custom_str"].string_param = "v"
    msg.parameters["custom_int"].int64_param = -5
    msg.parameters["custom_uint"].uint64_param = 2**64 - 1
    msg.parameters["custom_bool"].bool_param = True
    msg.parameters["custom_double"].double_param = 0.25
    msg.parameters["unset"].CopyFrom(pb.InferParameter())
    request = _decode(msg)
    assert (request.model_name, request.model_version, request.id) == ("m", "1", "req-1")
    assert request.priority == 3
    assert request.deadline_ns is None
    assert request.inputs == []
    assert request.outputs == []
    assert request.parameters == {
        "custom_str": "v",
        "custom_int": -5,
        "custom_uint": 2**64 - 1,
        "custom_bool": True,
        "custom_double": 0.25,
    }


@pytest.mark.parametrize("kind", ["int64_param", "uint64_param"])
def test_priority_int_kinds(kind: str) -> None:
    msg = _request()
    setattr(msg.parameters["priority"], kind, 9)
    assert _decode(msg).priority == 9


def test_empty_sequence_id_string_is_accepted() -> None:
    msg = _request()
    msg.parameters["sequence_id"].string_param = ""
    assert _decode(msg).parameters == {}


def test_zero_element_inputs() -> None:
    msg = _request()
    _add(msg, "raw", "FP32", [0, 3], b"")
    _add(msg, "b", "BYTES", [0], b"")
    request = _decode(msg)
    assert request.inputs[0].data.shape == (0, 3)
    assert request.inputs[1].data.shape == (0,)
    msg = _request()
    _add(msg, "typed", "FP16", [2, 0])
    _add(msg, "t2", "INT32", [0])
    request = _decode(msg)
    assert request.inputs[0].data.shape == (2, 0)
    assert request.inputs[0].data.dtype == np.float16
    assert request.inputs[1].data.shape == (0,)


def test_scalar_input() -> None:
    msg = _request()
    _add(msg, "s", "INT32", [], np.array(5, dtype="<i4").tobytes())
    (s,) = _decode(msg).inputs
    assert s.data.shape == ()
    assert int(s.data) == 5


def test_public_surface_sorted() -> None:
    assert codec.__all__ == [
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
    for name in codec.__all__:
        assert hasattr(codec, name)
