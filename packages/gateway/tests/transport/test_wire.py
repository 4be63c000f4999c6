"""Raw-bytes scanning of inference bodies, checked against the generated protobuf parser."""

from __future__ import annotations

import random
import time
import tracemalloc

import pytest
from google.protobuf.message import DecodeError

from reactantserver.core.codec import effective_deadline_ns, int_param
from reactantserver.core.errors import InvalidArgumentError
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.gateway.transport import wire as wire_module
from reactantserver.gateway.transport.wire import (
    InferHeader,
    WireError,
    batch_units,
    deadline_ns,
    read_infer_header,
    read_string_field,
    stream_error,
    stream_response,
)

Request = pb.ModelInferRequest
Tensor = pb.ModelInferRequest.InferInputTensor


def worker_timeout(msg: pb.ModelInferRequest, key: str) -> int | None:
    """What the worker's codec reads for ``key``; a wrongly typed value is ignored (None)."""
    try:
        return int_param(msg.parameters, key, "test")
    except InvalidArgumentError:
        return None


def expected_header(msg: pb.ModelInferRequest) -> InferHeader:
    return InferHeader(
        msg.model_name,
        msg.model_version,
        msg.id,
        worker_timeout(msg, "timeout"),
        worker_timeout(msg, "reactant_timeout_ns"),
    )


def expected_units(msg: pb.ModelInferRequest, name: str, axis: int) -> int:
    for tensor in msg.inputs:
        if tensor.name == name:
            if 0 < axis <= len(tensor.shape) and tensor.shape[axis - 1] > 0:
                return int(tensor.shape[axis - 1])
            return 1
    return 1


def typical_request() -> pb.ModelInferRequest:
    msg = Request(model_name="resnet", model_version="3", id="req-7")
    msg.parameters["timeout"].int64_param = 250_000
    msg.parameters["reactant_timeout_ns"].uint64_param = 2_000_000_000
    msg.parameters["priority"].int64_param = 2
    msg.parameters["note"].string_param = "x" * 40
    msg.inputs.add(name="IN", datatype="FP32", shape=[5, 3, 768, 1024])
    msg.inputs.add(name="MASK", datatype="BOOL", shape=[5])
    msg.outputs.add(name="OUT")
    msg.raw_input_contents.append(b"\x01" * 800)
    msg.raw_input_contents.append(b"\x00" * 5)
    return msg


# --- field numbers -----------------------------------------------------------------------------


def test_field_numbers_match_the_generated_descriptors() -> None:
    req = Request.DESCRIPTOR.fields_by_name
    assert req["model_name"].number == wire_module._REQ_MODEL_NAME
    assert req["model_version"].number == wire_module._REQ_MODEL_VERSION
    assert req["id"].number == wire_module._REQ_ID
    assert req["parameters"].number == wire_module._REQ_PARAMETERS
    assert req["inputs"].number == wire_module._REQ_INPUTS
    entry_type = req["parameters"].message_type
    assert entry_type is not None
    entry = entry_type.fields_by_name
    assert entry["key"].number == wire_module._ENTRY_KEY
    assert entry["value"].number == wire_module._ENTRY_VALUE
    tensor = Tensor.DESCRIPTOR.fields_by_name
    assert tensor["name"].number == wire_module._INPUT_NAME
    assert tensor["shape"].number == wire_module._INPUT_SHAPE
    param = pb.InferParameter.DESCRIPTOR.fields_by_name
    assert param["bool_param"].number == wire_module._PARAM_BOOL
    assert param["int64_param"].number == wire_module._PARAM_INT64
    assert param["string_param"].number == wire_module._PARAM_STRING
    assert param["double_param"].number == wire_module._PARAM_DOUBLE
    assert param["uint64_param"].number == wire_module._PARAM_UINT64
    assert set(pb.InferParameter.DESCRIPTOR.oneofs_by_name["parameter_choice"].fields) == set(
        pb.InferParameter.DESCRIPTOR.fields
    )
    stream = pb.ModelStreamInferResponse.DESCRIPTOR.fields_by_name
    assert stream["error_message"].number == wire_module._STREAM_ERROR_MESSAGE
    assert stream["infer_response"].number == wire_module._STREAM_INFER_RESPONSE
    for message in (
        pb.SystemSharedMemoryRegisterRequest,
        pb.SystemSharedMemoryUnregisterRequest,
        pb.ModelReadyRequest,
        pb.ModelMetadataRequest,
        pb.ModelConfigRequest,
    ):
        assert message.DESCRIPTOR.fields_by_name["name"].number == 1


# --- read_infer_header -------------------------------------------------------------------------


def test_header_of_a_typical_request() -> None:
    header = read_infer_header(typical_request().SerializeToString())
    assert header == InferHeader("resnet", "3", "req-7", 250_000, 2_000_000_000)


def test_empty_body_is_an_empty_header_not_an_error() -> None:
    assert read_infer_header(b"") == InferHeader("", "", "", None, None)


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        ("int64_param", 1_500, 1_500),
        ("int64_param", -7, -7),
        ("int64_param", -(1 << 63), -(1 << 63)),
        ("uint64_param", (1 << 64) - 1, (1 << 64) - 1),
        ("uint64_param", 0, 0),
        ("bool_param", True, None),
        ("string_param", "100", None),
        ("double_param", 1.5, None),
    ],
)
def test_timeout_parameters_are_read_as_the_worker_reads_them(
    kind: str, value: object, expected: int | None
) -> None:
    for key in ("timeout", "reactant_timeout_ns"):
        msg = Request(model_name="m")
        setattr(msg.parameters[key], kind, value)
        header = read_infer_header(msg.SerializeToString())
        got = header.timeout_us if key == "timeout" else header.timeout_ns
        assert got == expected == worker_timeout(msg, key)


def test_a_timeout_parameter_with_no_value_is_ignored() -> None:
    msg = Request(model_name="m")
    msg.parameters["timeout"].SetInParent()
    assert read_infer_header(msg.SerializeToString()).timeout_us is None
    assert worker_timeout(msg, "timeout") is None


def random_parameter(rng: random.Random, param: pb.InferParameter) -> None:
    choice = rng.randrange(6)
    if choice == 0:
        param.int64_param = rng.randint(-(1 << 63), (1 << 63) - 1)
    elif choice == 1:
        param.uint64_param = rng.randrange(1 << 64)
    elif choice == 2:
        param.int64_param = rng.randint(-5, 10**12)
    elif choice == 3:
        param.bool_param = rng.random() < 0.5
    elif choice == 4:
        param.string_param = rng.choice(["", "5", "é∂"])
    # choice 5: no member set


def random_request(rng: random.Random) -> pb.ModelInferRequest:
    text = ["", "m", "model-ü", "x" * 200, "名前"]
    msg = Request(model_name=rng.choice(text), model_version=rng.choice(text), id=rng.choice(text))
    for key in rng.sample(
        ["timeout", "reactant_timeout_ns", "priority", "other"], rng.randrange(5)
    ):
        random_parameter(rng, msg.parameters[key])
    for _ in range(rng.randrange(4)):
        tensor = msg.inputs.add(name=rng.choice(["IN", "IN2", "", "é"]), datatype="FP32")
        tensor.shape.extend(
            rng.choice([0, -1, 1, 7, 300, 1 << 40]) for _ in range(rng.randrange(5))
        )
        tensor.parameters["p"].int64_param = 3
        if rng.random() < 0.3:
            tensor.contents.fp32_contents.extend([1.0, 2.0])
    for _ in range(rng.randrange(3)):
        msg.outputs.add(name="OUT")
    for _ in range(rng.randrange(3)):
        msg.raw_input_contents.append(rng.randbytes(rng.choice([0, 3, 200, 5000])))
    return msg


def test_random_requests_and_their_concatenations_match_protobuf() -> None:
    """A concatenation is a merge: last singular field and last map entry win, repeats add."""
    rng = random.Random(20240611)
    for _ in range(400):
        parts = [random_request(rng).SerializeToString() for _ in range(rng.choice([1, 1, 2, 3]))]
        body = b"".join(parts)
        msg = Request.FromString(body)
        assert read_infer_header(body) == expected_header(msg)
        for name in ("IN", "IN2", "", "é", "absent"):
            for axis in range(-1, 6):
                assert batch_units(body, name, axis) == expected_units(msg, name, axis)


def test_oneof_members_merge_across_repeated_values_of_one_entry() -> None:
    # One map entry whose value field appears twice: the two InferParameters merge, so the
    # later member of the oneof wins (here int64 after string).
    first = pb.InferParameter(string_param="9").SerializeToString()
    second = pb.InferParameter(int64_param=9).SerializeToString()
    entry = b"\x0a\x07timeout" + b"\x12" + bytes([len(first)]) + first
    entry += b"\x12" + bytes([len(second)]) + second
    body = b"\x22" + bytes([len(entry)]) + entry
    msg = Request.FromString(body)
    assert msg.parameters["timeout"].int64_param == 9
    assert read_infer_header(body).timeout_us == 9 == worker_timeout(msg, "timeout")


UNKNOWN_FIELDS = [
    b"\x98\x06\x96\x01",  # field 99 varint
    b"\x99\x06" + b"\x01" * 8,  # field 99 fixed64
    b"\x9a\x06\x03abc",  # field 99 length-delimited
    b"\x9d\x06" + b"\x02" * 4,  # field 99 fixed32
    b"\x9b\x06\x08\x01\xa3\x06\x0a\x01z\xa4\x06\x9c\x06",  # group 99 holding group 100
    b"\x08\x05",  # known field 1 (model_name) with a varint wire type: unknown to protobuf
    b"\x25\x00\x00\x00\x00",  # known field 4 (parameters) as fixed32
]


@pytest.mark.parametrize("unknown", UNKNOWN_FIELDS)
def test_unknown_fields_of_every_wire_type_are_skipped(unknown: bytes) -> None:
    base = typical_request().SerializeToString()
    for body in (unknown + base, base + unknown, unknown + base + unknown):
        msg = Request.FromString(body)
        assert read_infer_header(body) == expected_header(msg)
        assert batch_units(body, "IN", 1) == 5


@pytest.mark.parametrize(
    "body",
    [
        b"\x0e",  # wire type 6
        b"\x0f",  # wire type 7
        b"\x0c",  # end of group without a start
        b"\x0b\x14",  # end of group 2 closing group 1
        b"\x0b\x08\x01",  # group never closed
        b"\x00\x00",  # field number 0
        b"\x80\x80\x80\x80\x10\x00",  # field number 2**29
        b"\x08" + b"\xff" * 10 + b"\x01",  # an 11-byte varint
        b"\x08\xff",  # truncated varint
        b"\x0a",  # truncated length
        b"\x0a\x05abc",  # length past the end
        b"\x0a\x02\xff\xfe",  # invalid UTF-8 in model_name
        b"\x12\x01\x80",  # invalid UTF-8 in model_version
        b"\x1a\x01\xc3",  # invalid UTF-8 in id
        b"\x22\x04\x0a\x02\xff\xfe",  # invalid UTF-8 in a parameter key
        b"\x22\x02\x0a\x05",  # parameter entry longer than its message
        b"\x09\x01\x02",  # truncated fixed64
        b"\x0d\x01",  # truncated fixed32
    ],
)
def test_malformed_bodies_raise_wire_error_like_protobuf_rejects_them(body: bytes) -> None:
    with pytest.raises(DecodeError):
        Request.FromString(body)
    with pytest.raises(WireError):
        read_infer_header(body)
    assert batch_units(body, "IN", 1) == 1


def test_every_truncation_is_rejected_exactly_when_protobuf_rejects_it() -> None:
    body = typical_request().SerializeToString()
    for cut in range(len(body)):
        prefix = body[:cut]
        try:
            msg = Request.FromString(prefix)
        except DecodeError:
            with pytest.raises(WireError):
                read_infer_header(prefix)
        else:
            assert read_infer_header(prefix) == expected_header(msg)
        assert batch_units(prefix, "IN", 1) in (1, 5)


def test_garbage_never_escapes_as_another_exception() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        body = rng.randbytes(rng.randrange(40))
        try:
            header = read_infer_header(body)
        except WireError:
            continue
        try:
            msg = Request.FromString(body)
        except DecodeError:
            continue  # the worker rejects what the gateway let through: fine
        assert header == expected_header(msg)
        assert batch_units(body, "IN", 1) >= 1


def test_a_64_mib_body_is_scanned_without_copying_its_contents() -> None:
    big = Request(raw_input_contents=[bytes(64 << 20)]).SerializeToString()
    # The big field first and last: the scanner must step over it to reach the header.
    body = big + typical_request().SerializeToString() + big
    tracemalloc.start()
    try:
        header = read_infer_header(body)
        units = batch_units(body, "IN", 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert header == InferHeader("resnet", "3", "req-7", 250_000, 2_000_000_000)
    assert units == 5
    assert peak < 1 << 20  # a copy of the contents would be 64 MiB


# --- batch_units -------------------------------------------------------------------------------


def test_units_are_the_extent_at_the_one_based_axis() -> None:
    body = typical_request().SerializeToString()
    assert batch_units(body, "IN", 1) == 5
    assert batch_units(body, "IN", 2) == 3
    assert batch_units(body, "IN", 4) == 1024
    assert batch_units(body, "MASK", 1) == 5


@pytest.mark.parametrize(
    ("shape", "name", "axis"),
    [
        ([5, 3], "IN", 0),
        ([5, 3], "IN", -1),
        ([5, 3], "IN", 3),
        ([5, 3], "OTHER", 1),
        ([0, 3], "IN", 1),
        ([-1, 3], "IN", 1),
        ([], "IN", 1),
        ([5], "\ud800", 1),  # a name that cannot be encoded matches nothing
    ],
)
def test_units_default_to_one(shape: list[int], name: str, axis: int) -> None:
    msg = Request(model_name="m")
    msg.inputs.add(name="IN", shape=shape)
    assert batch_units(msg.SerializeToString(), name, axis) == 1


def test_units_read_unpacked_and_mixed_shapes() -> None:
    # name "IN", then shape as unpacked varints 5 and 3, then a packed chunk [7].
    tensor = b"\x0a\x02IN" + b"\x18\x05" + b"\x18\x03" + b"\x1a\x01\x07"
    body = b"\x0a\x01m" + b"\x2a" + bytes([len(tensor)]) + tensor
    msg = Request.FromString(body)
    assert list(msg.inputs[0].shape) == [5, 3, 7]
    assert [batch_units(body, "IN", axis) for axis in (1, 2, 3, 4)] == [5, 3, 7, 1]


def test_units_use_the_first_input_of_that_name() -> None:
    msg = Request(model_name="m")
    msg.inputs.add(name="IN", shape=[4])
    msg.inputs.add(name="IN", shape=[9])
    assert batch_units(msg.SerializeToString(), "IN", 1) == 4


def test_units_survive_a_malformed_tensor() -> None:
    body = b"\x0a\x01m" + b"\x2a\x04\x0a\x02IN" + b"\x2a\x03\x1a\x05\x01"
    assert batch_units(body, "IN", 1) == 1


# --- read_string_field -------------------------------------------------------------------------


def test_string_field_of_control_requests() -> None:
    register = pb.SystemSharedMemoryRegisterRequest(name="region", key="/k", byte_size=1 << 20)
    assert read_string_field(register.SerializeToString(), 1) == "region"
    assert read_string_field(register.SerializeToString(), 2) == "/k"
    unregister = pb.SystemSharedMemoryUnregisterRequest()
    assert read_string_field(unregister.SerializeToString(), 1) == ""
    ready = pb.ModelReadyRequest(name="résumé", version="2")
    assert read_string_field(ready.SerializeToString(), 1) == "résumé"


def test_string_field_follows_the_parser_on_repeats_and_wire_types() -> None:
    first = pb.ModelReadyRequest(name="a").SerializeToString()
    second = pb.ModelReadyRequest(name="b", version="1").SerializeToString()
    body = first + second + b"\x08\x07"  # and field 1 as a varint: unknown, skipped
    assert pb.ModelReadyRequest.FromString(body).name == "b"
    assert read_string_field(body, 1) == "b"


@pytest.mark.parametrize("body", [b"\x0a\x05ab", b"\x0a\x01\xff", b"\x0e", b"\x12"])
def test_string_field_rejects_malformed_bodies(body: bytes) -> None:
    with pytest.raises(WireError):
        read_string_field(body, 1)


# --- stream messages ---------------------------------------------------------------------------


@pytest.mark.parametrize("contents", [0, 1, 126, 127, 128, 16_383, 16_384, 3_000_000])
def test_stream_response_wraps_the_reply_bytes(contents: int) -> None:
    reply = pb.ModelInferResponse(model_name="m", id="r")
    reply.outputs.add(name="OUT", datatype="UINT8", shape=[contents])
    reply.raw_output_contents.append(b"\x05" * contents)
    wrapped = pb.ModelStreamInferResponse.FromString(stream_response(reply.SerializeToString()))
    assert wrapped.error_message == ""
    assert wrapped.infer_response == reply


def test_stream_response_of_an_empty_reply_still_sets_the_field() -> None:
    wrapped = pb.ModelStreamInferResponse.FromString(stream_response(b""))
    assert wrapped.HasField("infer_response")


@pytest.mark.parametrize("message", ["", "model 'm' is not ready", "é" * 300])
def test_stream_error_carries_the_message(message: str) -> None:
    wrapped = pb.ModelStreamInferResponse.FromString(stream_error(message))
    assert wrapped.error_message == message
    assert not wrapped.HasField("infer_response")


# --- deadline ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("timeout_us", "timeout_ns", "remaining"),
    [
        (None, None, None),
        (1_000, None, None),
        (None, 5_000, None),
        (1_000, 5_000, 10.0),
        (None, None, 0.25),
        (None, None, -1.0),
        (-5, 0, None),
        ((1 << 64) - 1, None, None),
    ],
)
def test_deadline_is_the_codec_deadline(
    timeout_us: int | None, timeout_ns: int | None, remaining: float | None
) -> None:
    header = InferHeader("m", "", "", timeout_us, timeout_ns)
    expected = effective_deadline_ns(
        10**12, grpc_time_remaining=remaining, timeout_us=timeout_us, timeout_ns=timeout_ns
    )
    assert deadline_ns(header, now_ns=10**12, grpc_time_remaining=remaining) == expected


def test_deadline_from_the_body() -> None:
    header = read_infer_header(typical_request().SerializeToString())
    assert deadline_ns(header, now_ns=0, grpc_time_remaining=None) == 250_000_000
    assert deadline_ns(header, now_ns=0, grpc_time_remaining=0.1) == 100_000_000


# --- cost, printed for the record --------------------------------------------------------------


def test_scanning_cost_against_full_decoding() -> None:
    msg = typical_request()
    body = msg.SerializeToString()
    assert 900 < len(body) < 1200
    rounds = 2000
    start = time.perf_counter()
    for _ in range(rounds):
        read_infer_header(body)
    scan = (time.perf_counter() - start) / rounds
    start = time.perf_counter()
    for _ in range(rounds):
        Request.FromString(body)
    parse = (time.perf_counter() - start) / rounds
    # Informative only, never asserted: the scanner's point is big bodies, not small ones.
    print(
        f"\n{len(body)} B request: read_infer_header {scan * 1e6:.2f} us, "
        f"ModelInferRequest.FromString {parse * 1e6:.2f} us"
    )
