"""InferInput, RequestedOutput and InferOutput: wire dtypes, placements, zero-copy reads.

Requests are built the way the client sends them (``Call.build`` over ``codec.encode_request``);
responses are built by hand from them, so every dtype makes a full trip through the wire
format without a server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from reactantserver import client
from reactantserver.client import (
    InferInput,
    InferOutput,
    KServeModel,
    RequestedOutput,
    ShmRegion,
    StagingPool,
    StagingSlot,
    create_region,
)
from reactantserver.client._request import Call
from reactantserver.core import codec
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.types import ShmRef

SHM = Path("/dev/shm")
URL = "grpc://127.0.0.1:1"  # never dialled: building a request needs no connection


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    client.shutdown()
    left = sorted(SHM.glob(f"reactantserver-client-{os.getpid()}-*"))
    assert not left, f"staging pools left behind: {left}"


@pytest.fixture
def region() -> Iterator[ShmRegion]:
    with create_region(f"/rsclient-unit-{uuid.uuid4().hex[:12]}", 4096) as r:
        yield r


@pytest.fixture
def shm_pool() -> Iterator[StagingPool]:
    with closing(StagingPool(4096, 4)) as pool:
        yield pool


@pytest.fixture
def plain_pool() -> Iterator[StagingPool]:
    with closing(StagingPool(4096, 4, shm=False)) as pool:
        yield pool


def _build(
    inputs: Sequence[InferInput],
    outputs: Sequence[RequestedOutput] = (),
    shm_pools: frozenset[str] = frozenset(),
) -> tuple[pb.ModelInferRequest, list[str]]:
    with KServeModel(URL, "m") as model:
        call = Call(model, inputs, outputs, time.monotonic_ns() + 60 * 1_000_000_000)
        return call.build(shm_pools)


def _echo(request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    """What an identity model returns: every inline input as an output of the same name."""
    response = pb.ModelInferResponse(model_name=request.model_name)
    for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(raw)
    return response


def _shm_params(params: Any) -> ShmRef | None:
    if codec.SHM_REGION not in params:
        return None
    return ShmRef(
        params[codec.SHM_REGION].string_param,
        params[codec.SHM_OFFSET].int64_param,
        params[codec.SHM_BYTE_SIZE].int64_param,
    )


def _root(array: npt.NDArray[Any]) -> object:
    base: object = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base


def _response(datatype: str, shape: Sequence[int], raw: bytes) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name="m")
    response.outputs.add(name="y", datatype=datatype, shape=shape)
    response.raw_output_contents.append(raw)
    return response


# -- round trips through the wire -------------------------------------------------------------

PLAIN = [
    (np.bool_, "BOOL"),
    (np.uint8, "UINT8"),
    (np.uint16, "UINT16"),
    (np.uint32, "UINT32"),
    (np.uint64, "UINT64"),
    (np.int8, "INT8"),
    (np.int16, "INT16"),
    (np.int32, "INT32"),
    (np.int64, "INT64"),
    (np.float16, "FP16"),
    (np.float32, "FP32"),
    (np.float64, "FP64"),
]


@pytest.mark.parametrize(("dtype", "datatype"), PLAIN, ids=[d for _, d in PLAIN])
def test_dtype_round_trip(dtype: npt.DTypeLike, datatype: str) -> None:
    flat = np.arange(6) % 2 if dtype is np.bool_ else np.arange(6) - 2
    data = flat.astype(dtype).reshape(2, 3)
    tensor = InferInput("x", data)
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, (2, 3))
    msg, regions = _build([tensor])
    assert regions == []
    assert msg.inputs[0].datatype == datatype
    assert list(msg.inputs[0].shape) == [2, 3]
    assert msg.raw_input_contents[0] == data.tobytes()
    out = InferOutput(_echo(msg), "x")
    assert out.dtype == np.dtype(dtype)
    assert out.shape == (2, 3)
    np.testing.assert_array_equal(out, data)


def test_big_endian_input_arrives_little_endian() -> None:
    data = np.arange(4, dtype=">i4")
    msg, _ = _build([InferInput("x", data)])
    assert msg.raw_input_contents[0] == np.arange(4, dtype="<i4").tobytes()
    out = InferOutput(_echo(msg), "x")
    assert out.dtype == np.dtype("<i4")
    np.testing.assert_array_equal(out, data)


def test_non_contiguous_input_goes_out_row_major() -> None:
    data = np.arange(6, dtype=np.int16).reshape(2, 3)
    msg, _ = _build([InferInput("x", data.T)])
    assert list(msg.inputs[0].shape) == [3, 2]
    assert msg.raw_input_contents[0] == np.ascontiguousarray(data.T).tobytes()
    np.testing.assert_array_equal(InferOutput(_echo(msg), "x"), data.T)


def test_python_lists_become_arrays() -> None:
    tensor = InferInput("x", [[1.5, 2.5]])
    assert (tensor.datatype, tensor.shape) == ("FP64", (1, 2))


def test_scalar_input_has_an_empty_shape() -> None:
    msg, _ = _build([InferInput("x", np.float32(3.0))])
    assert list(msg.inputs[0].shape) == []
    assert InferOutput(_echo(msg), "x").shape == ()


def test_bytes_round_trip_as_object_arrays() -> None:
    data = np.array([[b"a", b"bc"], [b"", b"\x00\xff"]], dtype=object)
    tensor = InferInput("s", data)
    assert (tensor.datatype, tensor.shape) == ("BYTES", (2, 2))
    msg, _ = _build([tensor])
    out = InferOutput(_echo(msg), "s")
    assert out.dtype == np.dtype(object)
    assert out.shape == (2, 2)
    assert out.tolist() == data.tolist()
    assert InferOutput(_echo(msg), "s", dtype=object).tolist() == data.tolist()


def test_str_arrays_go_out_as_utf8_bytes() -> None:
    msg, _ = _build([InferInput("s", np.array(["x", "yé"]))])
    assert msg.inputs[0].datatype == "BYTES"
    assert InferOutput(_echo(msg), "s").tolist() == [b"x", "yé".encode()]


def test_inputs_and_outputs_keep_their_order() -> None:
    a, b = np.ones(2, np.float32), np.arange(3, dtype=np.int64)
    msg, _ = _build([InferInput("a", a), InferInput("b", b)])
    response = _echo(msg)
    np.testing.assert_array_equal(InferOutput(response, "b"), b)
    np.testing.assert_array_equal(InferOutput(response, "a"), a)


def test_bf16_with_ml_dtypes() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    data = np.array([1.0, -2.5, 0.5], dtype=ml_dtypes.bfloat16)
    tensor = InferInput("h", data)
    assert tensor.datatype == "BF16"
    msg, _ = _build([tensor])
    out = InferOutput(_echo(msg), "h")
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out, data)
    bits = InferOutput(_echo(msg), "h", dtype=np.uint16)
    np.testing.assert_array_equal(bits, data.view(np.uint16))


def test_fp8_has_no_wire_form() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with pytest.raises(ValueError, match="'q'"):
        InferInput("q", np.zeros(2, dtype=ml_dtypes.float8_e4m3fn))


_NO_ML_DTYPES = """
import json, sys
sys.modules["ml_dtypes"] = None  # import ml_dtypes now raises ImportError
import numpy as np
from reactantserver.client import InferOutput
from reactantserver.core.protocol import grpc_service_pb2 as pb
response = pb.ModelInferResponse(model_name="m")
response.outputs.add(name="h", datatype="BF16", shape=[3])
response.raw_output_contents.append(np.array([0x3F80, 0xC020, 0x3F00], "<u2").tobytes())
out = InferOutput(response, "h")
half = InferOutput(response, "h", dtype=np.float16)
print(json.dumps([str(out.dtype), out.tolist(), str(half.dtype)]))
"""


def test_bf16_without_ml_dtypes_is_uint16_bits() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _NO_ML_DTYPES],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    dtype, bits, half = json.loads(done.stdout)
    assert dtype == "uint16"
    assert bits == [0x3F80, 0xC020, 0x3F00]
    assert half == "float16"


@pytest.mark.parametrize("dtype", [np.complex64, np.dtype("datetime64[s]"), np.void])
def test_unsupported_input_dtypes(dtype: npt.DTypeLike) -> None:
    with pytest.raises(ValueError, match="'x'"):
        InferInput("x", np.zeros(2, dtype=dtype))


# -- InferOutput ------------------------------------------------------------------------------


def test_output_is_a_zero_copy_read_only_view() -> None:
    data = np.arange(12, dtype=np.float32)
    out = InferOutput(_response("FP32", [3, 4], data.tobytes()), "y")
    assert out.shape == (3, 4)
    assert not out.flags.writeable
    root = _root(out)
    assert isinstance(root, bytes)
    assert np.shares_memory(out, np.frombuffer(root, np.uint8))
    np.testing.assert_array_equal(out.reshape(-1), data)


def test_dtype_views_the_same_bytes() -> None:
    data = np.array([1.0, -0.0, 2.5], np.float32)
    response = _response("FP32", [3], data.tobytes())
    bits = InferOutput(response, "y", dtype=np.uint32)
    assert bits.dtype == np.uint32
    np.testing.assert_array_equal(bits, data.view(np.uint32))
    root = _root(bits)
    assert isinstance(root, bytes)
    assert np.shares_memory(bits, np.frombuffer(root, np.uint8))
    same = InferOutput(response, "y", dtype="float32")
    np.testing.assert_array_equal(same, data)


@pytest.mark.parametrize("dtype", [np.float64, np.int16, np.uint8])
def test_dtype_with_another_itemsize(dtype: npt.DTypeLike) -> None:
    response = _response("FP32", [2], np.zeros(2, np.float32).tobytes())
    with pytest.raises(ValueError, match="'y'"):
        InferOutput(response, "y", dtype=dtype)


def test_bytes_output_cannot_be_viewed_as_numbers() -> None:
    msg, _ = _build([InferInput("y", np.array([b"abcd"], dtype=object))])
    with pytest.raises(ValueError, match="'y'"):
        InferOutput(_echo(msg), "y", dtype=np.int32)


def test_unknown_output_name() -> None:
    response = _response("FP32", [1], np.zeros(1, np.float32).tobytes())
    with pytest.raises(KeyError, match="'z'"):
        InferOutput(response, "z")


def test_shm_output_points_at_shm_region_read() -> None:
    response = pb.ModelInferResponse(model_name="m")
    placed = response.outputs.add(name="a", datatype="FP32", shape=[4])
    placed.parameters[codec.SHM_REGION].string_param = "my_outputs"
    placed.parameters[codec.SHM_OFFSET].int64_param = 64
    placed.parameters[codec.SHM_BYTE_SIZE].int64_param = 16
    response.outputs.add(name="b", datatype="INT32", shape=[2])
    response.raw_output_contents.extend([b"", np.array([7, 8], np.int32).tobytes()])
    with pytest.raises(ValueError, match=r"ShmRegion\.read") as info:
        InferOutput(response, "a")
    assert "my_outputs" in str(info.value)
    np.testing.assert_array_equal(InferOutput(response, "b"), [7, 8])


# -- InferInput sources -----------------------------------------------------------------------


def test_inline_input_keeps_the_callers_array() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = InferInput("x", data)
    assert tensor.array is data
    assert tensor.pool is None
    assert tensor.placement(frozenset()) is None
    assert repr(tensor) == "InferInput('x', FP32[2, 3])"


def test_from_shm(region: ShmRegion) -> None:
    tensor = InferInput.from_shm("x", region, 128, (2, 3), np.float32)
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", "FP32", (2, 3))
    assert tensor.pool is None
    ref = ShmRef(region.name, 128, 24)
    assert tensor.placement(frozenset()) == ref
    assert tensor.placement(frozenset({"anything"})) == ref
    msg, regions = _build([tensor])
    assert regions == [region.name]
    assert _shm_params(msg.inputs[0].parameters) == ref
    assert msg.inputs[0].datatype == "FP32"
    assert list(msg.inputs[0].shape) == [2, 3]
    assert list(msg.raw_input_contents) == []


def test_from_shm_next_to_an_inline_input(region: ShmRegion) -> None:
    placed = InferInput.from_shm("x", region, 0, [4], "int32")
    inline = InferInput("y", np.ones(2, np.int8))
    msg, regions = _build([placed, inline])
    assert regions == [region.name]
    assert _shm_params(msg.inputs[0].parameters) == ShmRef(region.name, 0, 16)
    assert _shm_params(msg.inputs[1].parameters) is None
    assert list(msg.raw_input_contents) == [np.ones(2, np.int8).tobytes()]


def test_from_shm_exactly_fills_the_region(region: ShmRegion) -> None:
    tensor = InferInput.from_shm("x", region, 4096 - 16, (4,), np.float32)
    assert tensor.placement(frozenset()) == ShmRef(region.name, 4080, 16)


@pytest.mark.parametrize(
    ("offset", "shape"),
    [(-1, (4,)), (4096 - 15, (4,)), (0, (1025,)), (4096, (1,)), (10**12, (1,))],
)
def test_from_shm_bounds(region: ShmRegion, offset: int, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="do not fit"):
        InferInput.from_shm("x", region, offset, shape, np.float32)


def test_from_shm_rejects_bytes(region: ShmRegion) -> None:
    with pytest.raises(ValueError, match="BYTES"):
        InferInput.from_shm("s", region, 0, (2,), object)


def test_from_slot_on_an_shm_pool(shm_pool: StagingPool) -> None:
    with shm_pool.acquire() as raw_slot:
        slot = StagingSlot(raw_slot)
        buffer = slot.scratch((2, 4), np.float32)
        buffer[...] = np.arange(8).reshape(2, 4)
        tensor = InferInput.from_slot("x", buffer)
        assert tensor.pool is shm_pool
        assert tensor.array is buffer
        offset = shm_pool.offset_of(buffer)
        assert offset == raw_slot.offset
        ref = ShmRef(shm_pool.name, raw_slot.offset, 32)
        assert tensor.placement(frozenset({shm_pool.name})) == ref
        assert tensor.placement(frozenset()) is None
        assert tensor.placement(frozenset({"some-other-pool"})) is None
        # Sent in place when the endpoint uses the pool, as bytes when it does not.
        msg, regions = _build([tensor], shm_pools=frozenset({shm_pool.name}))
        assert regions == [shm_pool.name]
        assert _shm_params(msg.inputs[0].parameters) == ref
        assert list(msg.raw_input_contents) == []
        msg, regions = _build([tensor])
        assert regions == []
        assert _shm_params(msg.inputs[0].parameters) is None
        assert msg.raw_input_contents[0] == buffer.tobytes()


def test_from_slot_second_carve_has_its_own_offset(shm_pool: StagingPool) -> None:
    with shm_pool.acquire() as raw_slot:
        a, b = StagingSlot(raw_slot).scratch([((3,), np.int32), ((5,), np.uint8)])
        tb = InferInput.from_slot("b", b)
        assert tb.placement(frozenset({shm_pool.name})) == ShmRef(
            shm_pool.name, raw_slot.offset + 12, 5
        )
        assert InferInput.from_slot("a", a).placement(frozenset({shm_pool.name})) == ShmRef(
            shm_pool.name, raw_slot.offset, 12
        )


def test_from_slot_on_a_plain_pool_is_always_inline(plain_pool: StagingPool) -> None:
    with plain_pool.acquire() as raw_slot:
        buffer = StagingSlot(raw_slot).scratch((3,), np.int64)
        buffer[...] = [1, 2, 3]
        tensor = InferInput.from_slot("x", buffer)
        assert tensor.pool is None
        assert tensor.placement(frozenset({plain_pool.name})) is None
        msg, regions = _build([tensor], shm_pools=frozenset({plain_pool.name}))
        assert regions == []
        assert msg.raw_input_contents[0] == np.array([1, 2, 3], np.int64).tobytes()


def test_from_slot_rejects_a_foreign_array(shm_pool: StagingPool) -> None:
    with pytest.raises(ValueError, match="StagingPool"):
        InferInput.from_slot("x", np.zeros(4, np.float32))


def test_from_slot_rejects_a_non_contiguous_buffer(shm_pool: StagingPool) -> None:
    with shm_pool.acquire() as raw_slot:
        buffer = StagingSlot(raw_slot).scratch((4, 4), np.float32)
        with pytest.raises(ValueError, match="contiguous"):
            InferInput.from_slot("x", buffer[:, ::2])
        with pytest.raises(ValueError, match="contiguous"):
            InferInput.from_slot("x", buffer.T)


def test_from_slot_after_the_pool_closed() -> None:
    pool = StagingPool(4096, 4)
    slot = pool.acquire()
    buffer = StagingSlot(slot).scratch((4,), np.float32)
    slot.release()
    pool.close()
    with pytest.raises(ValueError, match="StagingPool"):
        InferInput.from_slot("x", buffer)


# -- RequestedOutput --------------------------------------------------------------------------


def test_requested_output_inline() -> None:
    wanted = RequestedOutput("y")
    assert wanted.shm is None
    assert wanted.placement(frozenset()) is None
    msg, regions = _build([InferInput("x", np.zeros(1, np.float32))], [wanted])
    assert regions == []
    assert [o.name for o in msg.outputs] == ["y"]
    assert _shm_params(msg.outputs[0].parameters) is None


def test_requested_output_to_shm(region: ShmRegion) -> None:
    wanted = RequestedOutput.to_shm("y", region, 256, 64)
    ref = ShmRef(region.name, 256, 64)
    assert wanted.shm == ref
    assert wanted.placement(frozenset()) == ref
    msg, regions = _build([InferInput("x", np.zeros(1, np.float32))], [wanted])
    assert regions == [region.name]
    assert _shm_params(msg.outputs[0].parameters) == ref


def test_requested_output_to_shm_exactly_fills_the_region(region: ShmRegion) -> None:
    assert RequestedOutput.to_shm("y", region, 0, 4096).shm == ShmRef(region.name, 0, 4096)


@pytest.mark.parametrize(("offset", "byte_size"), [(-1, 8), (0, 0), (4090, 8), (0, 4097)])
def test_requested_output_to_shm_bounds(region: ShmRegion, offset: int, byte_size: int) -> None:
    with pytest.raises(ValueError, match="do not fit"):
        RequestedOutput.to_shm("y", region, offset, byte_size)


def test_hand_requested_shm_output_is_read_from_the_region(region: ShmRegion) -> None:
    # What the server does for a to_shm output: bytes into the region, a placeholder inline.
    result = np.array([1.5, 2.5], np.float32)
    region.write(512, result)
    response = pb.ModelInferResponse(model_name="m")
    out = response.outputs.add(name="y", datatype="FP32", shape=[2])
    out.parameters[codec.SHM_REGION].string_param = region.name
    out.parameters[codec.SHM_OFFSET].int64_param = 512
    out.parameters[codec.SHM_BYTE_SIZE].int64_param = 8
    response.raw_output_contents.append(b"")
    with pytest.raises(ValueError, match=r"ShmRegion\.read"):
        InferOutput(response, "y")
    np.testing.assert_array_equal(region.read(512, (2,), np.float32), result)
