"""encode_response / encode_request: output selection, shared-memory outputs, parameters."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import grpc
import ml_dtypes
import numpy as np
import pytest

from reactantserver.core.codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from reactantserver.core.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    RegionNotRegisteredError,
)
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.shm import SharedMemoryRegistry
from reactantserver.core.types import InferRequest, InferResponse, OutputRequest, ShmRef

REGION_SIZE = 4096


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    """A registry with region 'reg' over a fresh 4096-byte /dev/shm object."""
    name = f"rs-test-enc-{os.getpid()}-{uuid.uuid4().hex[:12]}"
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


def _response() -> InferResponse:
    return InferResponse(
        model_name="m",
        model_version="ignored",
        id="abc",
        outputs=[
            NamedTensor("a", np.arange(4, dtype=np.float32).reshape(2, 2)),
            NamedTensor("b", np.array([1, 2, 3], dtype=np.int8)),
            NamedTensor("c", np.array([b"x", b"yz"], dtype=object)),
        ],
    )


def test_all_outputs_in_order() -> None:
    msg = encode_response(_response(), requested=[], registry=None)
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "1", "abc")
    assert [o.name for o in msg.outputs] == ["a", "b", "c"]
    assert [o.datatype for o in msg.outputs] == ["FP32", "INT8", "BYTES"]
    assert [list(o.shape) for o in msg.outputs] == [[2, 2], [3], [2]]
    assert len(msg.raw_output_contents) == 3
    assert msg.raw_output_contents[1] == b"\x01\x02\x03"
    assert len(msg.parameters) == 0
    assert all(len(o.parameters) == 0 for o in msg.outputs)


def test_requested_outputs_in_requested_order() -> None:
    msg = encode_response(
        _response(), requested=[OutputRequest("c"), OutputRequest("a")], registry=None
    )
    assert [o.name for o in msg.outputs] == ["c", "a"]
    decoded = decode_response(msg)
    assert decoded.outputs[0].data.tolist() == [b"x", b"yz"]
    assert decoded.outputs[1].data.tolist() == [[0.0, 1.0], [2.0, 3.0]]


def test_unknown_requested_output() -> None:
    with pytest.raises(
        InvalidArgumentError, match="model 'm': unknown requested output 'zz'"
    ) as info:
        encode_response(
            _response(), requested=[OutputRequest("a"), OutputRequest("zz")], registry=None
        )
    assert info.value.status == grpc.StatusCode.INVALID_ARGUMENT


def test_shm_outputs_written_and_index_aligned(registry: SharedMemoryRegistry) -> None:
    requested = [
        OutputRequest("b"),
        OutputRequest("a", ShmRef("reg", 100, 64)),
        OutputRequest("c", ShmRef("reg", 200, 64)),
    ]
    msg = encode_response(_response(), requested=requested, registry=registry)
    assert [o.name for o in msg.outputs] == ["b", "a", "c"]
    assert list(msg.raw_output_contents) == [b"\x01\x02\x03", b"", b""]
    a_params = msg.outputs[1].parameters
    assert a_params["shared_memory_region"].string_param == "reg"
    assert a_params["shared_memory_offset"].int64_param == 100
    # The actual size, not the byte_size that was asked for.
    assert a_params["shared_memory_byte_size"].int64_param == 16
    assert msg.outputs[2].parameters["shared_memory_byte_size"].int64_param == 4 + 1 + 4 + 2
    with registry.read("reg", 100, 16) as lease:
        assert np.frombuffer(lease.view, "<f4").tolist() == [0.0, 1.0, 2.0, 3.0]
    with registry.read("reg", 200, 11) as lease:
        assert bytes(lease.view) == b"\x01\0\0\0x\x02\0\0\0yz"
    # A client holding the same regions reads them back.
    decoded = decode_response(msg, registry=registry)
    assert [o.name for o in decoded.outputs] == ["b", "a", "c"]
    assert decoded.outputs[1].data.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert decoded.outputs[2].data.tolist() == [b"x", b"yz"]
    # Without the regions the shared-memory outputs are left out.
    assert [o.name for o in decode_response(msg).outputs] == ["b"]


def test_shm_output_exact_fit(registry: SharedMemoryRegistry) -> None:
    requested = [OutputRequest("a", ShmRef("reg", REGION_SIZE - 16, 16))]
    msg = encode_response(_response(), requested=requested, registry=registry)
    assert msg.outputs[0].parameters["shared_memory_byte_size"].int64_param == 16


def test_shm_output_too_small(registry: SharedMemoryRegistry) -> None:
    requested = [OutputRequest("a", ShmRef("reg", 0, 15))]
    with pytest.raises(InvalidArgumentError, match=r"output 'a'.*16 bytes.*15.*'reg'") as info:
        encode_response(_response(), requested=requested, registry=registry)
    assert info.value.status == grpc.StatusCode.INVALID_ARGUMENT


def test_shm_output_region_gone(registry: SharedMemoryRegistry) -> None:
    requested = [OutputRequest("a", ShmRef("reg", 0, 64))]
    registry.unregister("reg")
    with pytest.raises(RegionNotRegisteredError, match=r"output 'a'.*region 'reg'") as info:
        encode_response(_response(), requested=requested, registry=registry)
    assert info.value.status == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(RegionNotRegisteredError, match="output 'a'"):
        encode_response(_response(), requested=requested, registry=None)


def test_shm_output_past_region_end(registry: SharedMemoryRegistry) -> None:
    requested = [OutputRequest("a", ShmRef("reg", REGION_SIZE - 8, 64))]
    with pytest.raises(InvalidArgumentError, match=r"output 'a'.*exceeds"):
        encode_response(_response(), requested=requested, registry=registry)


def test_outputs_without_wire_dtype_are_internal_errors() -> None:
    fp8 = NamedTensor("f8", np.zeros(2, dtype=ml_dtypes.float8_e4m3fn))
    with pytest.raises(ValueError, match="output 'f8'") as info:
        encode_response(InferResponse(model_name="m", outputs=[fp8]), requested=[], registry=None)
    assert not isinstance(info.value, InvalidArgumentError)
    bad = NamedTensor("o", np.array([1, 2], dtype=object))
    with pytest.raises(ValueError, match=r"output 'o'.*int"):
        encode_response(InferResponse(model_name="m", outputs=[bad]), requested=[], registry=None)


def test_bf16_output() -> None:
    data = np.array([1.0, 0.5], dtype=ml_dtypes.bfloat16)
    msg = encode_response(
        InferResponse(model_name="m", outputs=[NamedTensor("y", data)]), requested=[], registry=None
    )
    assert msg.outputs[0].datatype == "BF16"
    assert msg.raw_output_contents[0] == data.tobytes()


# --- encode_request -----------------------------------------------------------------------


def test_encode_request_fields() -> None:
    request = InferRequest(
        model_name="m",
        model_version="1",
        id="q",
        inputs=[
            NamedTensor("x", np.ones(3, dtype=np.float32)),
            NamedTensor("s", np.zeros((2, 2), dtype=np.int32)),
        ],
        outputs=[OutputRequest("y"), OutputRequest("z", ShmRef("reg", 8, 32))],
        priority=5,
        parameters={"flag": True, "n": -3, "big": 2**64 - 1, "ratio": 0.5, "tag": "t"},
    )
    msg = encode_request(request, shm_inputs={"s": ShmRef("reg", 64, 16)})
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "1", "q")
    assert [t.name for t in msg.inputs] == ["x", "s"]
    assert len(msg.raw_input_contents) == 1
    s_params = msg.inputs[1].parameters
    assert s_params["shared_memory_region"].string_param == "reg"
    assert s_params["shared_memory_offset"].int64_param == 64
    assert s_params["shared_memory_byte_size"].int64_param == 16
    assert [o.name for o in msg.outputs] == ["y", "z"]
    assert msg.outputs[1].parameters["shared_memory_byte_size"].int64_param == 32
    params = msg.parameters
    assert params["priority"].uint64_param == 5
    assert params["flag"].bool_param is True
    assert params["n"].int64_param == -3
    assert params["big"].uint64_param == 2**64 - 1
    assert params["ratio"].double_param == 0.5
    assert params["tag"].string_param == "t"
    assert "reactant_timeout_ns" not in params


def test_encode_request_sends_remaining_budget() -> None:
    request = InferRequest(model_name="m", deadline_ns=5_000)
    msg = encode_request(request, now_ns=1_000)
    assert msg.parameters["reactant_timeout_ns"].int64_param == 4_000
    # The receiving side turns it back into an absolute deadline on its own clock.
    decoded = decode_request(msg, registry=None, max_recv_msg_bytes=1 << 20, now_ns=50)
    assert decoded.deadline_ns == 4_050


def test_encode_request_expired_deadline() -> None:
    with pytest.raises(DeadlineExceededError, match="model 'm'"):
        encode_request(InferRequest(model_name="m", deadline_ns=10), now_ns=10)


def test_encode_request_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="priority"):
        encode_request(InferRequest(model_name="m", priority=-1))
    with pytest.raises(ValueError, match="'huge'"):
        encode_request(InferRequest(model_name="m", parameters={"huge": 2**64}))


def test_encode_then_decode_shm_request(registry: SharedMemoryRegistry) -> None:
    data = np.arange(4, dtype=np.int32)
    registry.write("reg", 64, data)
    request = InferRequest(
        model_name="m",
        inputs=[NamedTensor("x", data), NamedTensor("raw", np.array([9], dtype=np.uint16))],
        outputs=[OutputRequest("y", ShmRef("reg", 128, 64))],
    )
    msg = encode_request(request, shm_inputs={"x": ShmRef("reg", 64, 16)})
    wire = pb.ModelInferRequest.FromString(msg.SerializeToString())
    decoded = decode_request(wire, registry=registry, max_recv_msg_bytes=1 << 20, now_ns=0)
    try:
        assert decoded.inputs[0].data.tolist() == [0, 1, 2, 3]
        assert decoded.inputs[1].data.tolist() == [9]
        assert decoded.outputs == [OutputRequest("y", ShmRef("reg", 128, 64))]
    finally:
        decoded.inputs.clear()
        decoded.release()
