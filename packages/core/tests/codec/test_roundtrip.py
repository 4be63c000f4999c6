"""Codec round trips for every wire dtype, typed contents, and tritonclient wire compatibility."""

from __future__ import annotations

import struct
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from reactantserver.core.codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from reactantserver.core.dtypes import DType
from reactantserver.core.errors import InvalidArgumentError
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.types import InferRequest, InferResponse

MAX_RECV = 64 << 20


def _wire(msg: Any) -> Any:
    """The message as a peer would see it: serialized and parsed again."""
    return type(msg).FromString(msg.SerializeToString())


def _sample(dtype: DType) -> np.ndarray[Any, Any]:
    shape = (2, 3)
    if dtype is DType.BYTES:
        return np.array(
            [[b"", b"a", b"\x00\xff"], [b"long" * 50, b"x", "é".encode()]], dtype=object
        )
    if dtype is DType.BOOL:
        return np.array([[True, False, True], [False, False, True]])
    np_dtype = dtype.numpy
    if dtype in (DType.F16, DType.F32, DType.F64, DType.BF16):
        return np.array([[-1.5, 0.0, 0.25], [2.0, -0.0, 1024.0]], dtype=np_dtype)
    info = np.iinfo(np_dtype)
    return np.array([[info.min, 0, 1], [info.max, 2, 7]], dtype=np_dtype).reshape(shape)


WIRE_DTYPES = [d for d in DType if d not in (DType.F8_E4M3, DType.F8_E5M2)]


def _decode(msg: Any) -> InferRequest:
    return decode_request(_wire(msg), registry=None, max_recv_msg_bytes=MAX_RECV, now_ns=0)


@pytest.mark.parametrize("dtype", WIRE_DTYPES, ids=lambda d: d.kserve)
def test_request_round_trip(dtype: DType) -> None:
    data = _sample(dtype)
    request = InferRequest(model_name="m", id="7", inputs=[NamedTensor("x", data)])
    msg = encode_request(request)
    assert msg.inputs[0].datatype == dtype.kserve
    assert list(msg.inputs[0].shape) == [2, 3]
    assert not msg.inputs[0].HasField("contents")
    assert len(msg.raw_input_contents) == 1
    decoded = _decode(msg)
    (x,) = decoded.inputs
    assert x.data.shape == (2, 3)
    assert x.dtype is dtype
    if dtype is DType.BYTES:
        assert x.data.dtype == object
        assert x.data.tolist() == data.tolist()
    else:
        assert x.data.dtype == dtype.numpy
        assert x.data.tobytes() == data.tobytes()
        assert not x.data.flags.writeable


@pytest.mark.parametrize("dtype", WIRE_DTYPES, ids=lambda d: d.kserve)
def test_response_round_trip(dtype: DType) -> None:
    data = _sample(dtype)
    response = InferResponse(model_name="m", id="7", outputs=[NamedTensor("y", data)])
    msg = _wire(encode_response(response, requested=[], registry=None))
    assert msg.model_version == "1"
    assert msg.outputs[0].datatype == dtype.kserve
    assert len(msg.raw_output_contents) == 1
    assert not msg.outputs[0].HasField("contents")
    decoded = decode_response(msg)
    (y,) = decoded.outputs
    assert y.dtype is dtype
    if dtype is DType.BYTES:
        assert y.data.tolist() == data.tolist()
    else:
        assert y.data.tobytes() == data.tobytes()


def test_bytes_raw_form_is_length_prefixed() -> None:
    data = np.array([[b"ab", b""], [b"c", b"def"]], dtype=object)
    msg = encode_request(InferRequest(model_name="m", inputs=[NamedTensor("s", data)]))
    expected = b"".join(struct.pack("<I", len(b)) + b for b in [b"ab", b"", b"c", b"def"])
    assert msg.raw_input_contents[0] == expected


def test_bytes_from_str_and_fixed_width_arrays() -> None:
    request = InferRequest(
        model_name="m",
        inputs=[
            NamedTensor("u", np.array(["hé", ""], dtype=np.str_)),
            NamedTensor("s", np.array([b"ab", b"c"], dtype=np.bytes_)),
        ],
    )
    u, s = _decode(encode_request(request)).inputs
    assert u.data.tolist() == ["hé".encode(), b""]
    assert s.data.tolist() == [b"ab", b"c"]


def test_bf16_raw_carries_ml_dtypes_values() -> None:
    data = np.array([1.0, -2.5, 3.140625], dtype=ml_dtypes.bfloat16)
    (x,) = _decode(
        encode_request(InferRequest(model_name="m", inputs=[NamedTensor("x", data)]))
    ).inputs
    assert x.data.dtype == ml_dtypes.bfloat16
    assert x.data.astype(np.float32).tolist() == [1.0, -2.5, 3.140625]


def test_big_endian_arrays_go_out_little_endian() -> None:
    data = np.array([1, 256], dtype=">i4")
    msg = encode_request(InferRequest(model_name="m", inputs=[NamedTensor("x", data)]))
    assert msg.raw_input_contents[0] == np.array([1, 256], dtype="<i4").tobytes()
    response = encode_response(
        InferResponse(model_name="m", outputs=[NamedTensor("y", data)]), requested=[], registry=None
    )
    assert response.raw_output_contents[0] == np.array([1, 256], dtype="<i4").tobytes()


def test_non_contiguous_arrays_go_out_row_major() -> None:
    data = np.arange(6, dtype=np.int16).reshape(2, 3).T
    msg = encode_request(InferRequest(model_name="m", inputs=[NamedTensor("x", data)]))
    assert list(msg.inputs[0].shape) == [3, 2]
    assert msg.raw_input_contents[0] == np.ascontiguousarray(data).tobytes()


def test_scalar_round_trip() -> None:
    msg = encode_request(InferRequest(model_name="m", inputs=[NamedTensor("x", np.float64(2.5))]))
    assert list(msg.inputs[0].shape) == []
    (x,) = _decode(msg).inputs
    assert x.data.shape == ()
    assert float(x.data) == 2.5


# --- typed contents -----------------------------------------------------------------------

TYPED_CASES: list[tuple[str, str, list[Any], Any]] = [
    ("BOOL", "bool_contents", [True, False, True, True], np.bool_),
    ("UINT8", "uint_contents", [0, 255, 7, 1], np.uint8),
    ("UINT16", "uint_contents", [0, 65535, 7, 1], np.uint16),
    ("UINT32", "uint_contents", [0, 2**32 - 1, 7, 1], np.uint32),
    ("UINT64", "uint64_contents", [0, 2**64 - 1, 7, 1], np.uint64),
    ("INT8", "int_contents", [-128, 127, 0, -1], np.int8),
    ("INT16", "int_contents", [-32768, 32767, 0, -1], np.int16),
    ("INT32", "int_contents", [-(2**31), 2**31 - 1, 0, -1], np.int32),
    ("INT64", "int64_contents", [-(2**63), 2**63 - 1, 0, -1], np.int64),
    ("FP32", "fp32_contents", [1.5, -0.25, 0.0, 3.0], np.float32),
    ("FP64", "fp64_contents", [1e300, -0.25, 0.0, 3.0], np.float64),
    ("BYTES", "bytes_contents", [b"a", b"", b"\x00", b"xyz"], object),
]


@pytest.mark.parametrize(("datatype", "field", "values", "np_type"), TYPED_CASES, ids=str)
def test_typed_contents(datatype: str, field: str, values: list[Any], np_type: Any) -> None:
    msg = pb.ModelInferRequest(model_name="m")
    tensor = msg.inputs.add(name="x", datatype=datatype, shape=[2, 2])
    getattr(tensor.contents, field).extend(values)
    (x,) = _decode(msg).inputs
    assert x.data.shape == (2, 2)
    assert x.data.dtype == np.dtype(np_type)
    assert x.data.reshape(-1).tolist() == values


def test_typed_and_raw_inputs_do_not_mix_across_a_request() -> None:
    # Raw contents present: every data input must use them, typed values on one is an error.
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="a", datatype="INT32", shape=[1])
    msg.raw_input_contents.append(b"\x01\x00\x00\x00")
    typed = msg.inputs.add(name="b", datatype="INT32", shape=[1])
    typed.contents.int_contents.append(1)
    with pytest.raises(InvalidArgumentError, match="raw_input_contents has 1 entries"):
        _decode(msg)


def test_all_typed_inputs() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="a", datatype="INT32", shape=[2]).contents.int_contents.extend([1, 2])
    msg.inputs.add(name="b", datatype="FP64", shape=[1]).contents.fp64_contents.append(0.5)
    a, b = _decode(msg).inputs
    assert a.data.tolist() == [1, 2]
    assert b.data.tolist() == [0.5]


def test_decode_response_typed_contents() -> None:
    msg = pb.ModelInferResponse(model_name="m", model_version="1", id="i")
    out = msg.outputs.add(name="y", datatype="INT64", shape=[3])
    out.contents.int64_contents.extend([1, 2, 3])
    response = decode_response(msg)
    assert response.outputs[0].data.tolist() == [1, 2, 3]
    assert (response.model_name, response.model_version, response.id) == ("m", "1", "i")


def test_decode_response_rejects_misaligned_raw() -> None:
    msg = pb.ModelInferResponse(model_name="m")
    msg.outputs.add(name="a", datatype="INT8", shape=[1])
    msg.outputs.add(name="b", datatype="INT8", shape=[1])
    msg.raw_output_contents.append(b"\x01")
    with pytest.raises(InvalidArgumentError, match="1 entries for 2 outputs"):
        decode_response(msg)
    msg.raw_output_contents.append(b"\x01\x02")
    with pytest.raises(InvalidArgumentError, match="output 'b'"):
        decode_response(msg)


# --- tritonclient on the same wire --------------------------------------------------------


def test_tritonclient_request_decodes() -> None:
    import tritonclient.grpc as tc
    from tritonclient.grpc import _utils

    f32 = np.arange(6, dtype=np.float32).reshape(2, 3)
    words = np.array([b"hello", b"", b"world"], dtype=object)
    bf16 = np.array([0.5, -1.0], dtype=ml_dtypes.bfloat16)
    flags = np.array([True, False])
    inputs = []
    for name, array, datatype in [
        ("f32", f32, "FP32"),
        ("words", words, "BYTES"),
        ("bf16", bf16, "BF16"),
        ("flags", flags, "BOOL"),
    ]:
        infer_input = tc.InferInput(name, list(array.shape), datatype)
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    outputs = [tc.InferRequestedOutput("y")]
    theirs = _utils._get_inference_request(
        model_name="m",
        inputs=inputs,
        model_version="",
        request_id="rid",
        outputs=outputs,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=4,
        timeout=2_000_000,
        parameters={"custom": "v"},
    )
    ours = pb.ModelInferRequest.FromString(theirs.SerializeToString())
    request = decode_request(ours, registry=None, max_recv_msg_bytes=MAX_RECV, now_ns=1000)
    got = {t.name: t.data for t in request.inputs}
    np.testing.assert_array_equal(got["f32"], f32)
    assert got["words"].tolist() == words.tolist()
    assert got["bf16"].dtype == ml_dtypes.bfloat16
    assert got["bf16"].tobytes() == bf16.tobytes()
    assert got["flags"].tolist() == [True, False]
    assert [o.name for o in request.outputs] == ["y"]
    assert request.priority == 4
    assert request.deadline_ns == 1000 + 2_000_000 * 1000
    assert request.parameters == {"custom": "v"}
    assert request.id == "rid"


def test_tritonclient_reads_our_response() -> None:
    import tritonclient.grpc as tc
    from tritonclient.grpc import service_pb2

    outputs = [
        NamedTensor("f16", np.array([[1.5, 2.0]], dtype=np.float16)),
        NamedTensor("words", np.array([b"a", b"bc"], dtype=object)),
        NamedTensor("i64", np.array([-1, 2**40], dtype=np.int64)),
    ]
    response = InferResponse(model_name="m", id="rid", outputs=outputs)
    ours = encode_response(response, requested=[], registry=None)
    result = tc.InferResult(service_pb2.ModelInferResponse.FromString(ours.SerializeToString()))
    np.testing.assert_array_equal(result.as_numpy("f16"), outputs[0].data)
    assert result.as_numpy("words").tolist() == [b"a", b"bc"]
    np.testing.assert_array_equal(result.as_numpy("i64"), outputs[2].data)
    assert result.get_response().model_version == "1"
    assert result.get_response().id == "rid"
