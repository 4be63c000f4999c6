"""The codec's short cuts: the same result as the full steps for plain messages, else None.

Each plain message is decoded both ways (the short cut, and the full steps it stands in
for) and compared tensor by tensor; each kind of message the short cut must leave to the
full decoder is checked to be declined, and that ``decode_request`` still answers it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from reactantserver.core import codec
from reactantserver.core.codec._decode import input_data, input_headers, requested_outputs
from reactantserver.core.codec._fast import plain_inputs, plain_outputs, plain_payloads
from reactantserver.core.dtypes import DType
from reactantserver.core.errors import InvalidArgumentError, RegionNotRegisteredError
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.types import InferResponse, OutputRequest, ShmRef

LIMIT = 1 << 20
Array = np.ndarray[Any, Any]


def _request(
    *arrays: tuple[str, str, Array], outputs: tuple[str, ...] = ()
) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m")
    for name, datatype, array in arrays:
        msg.inputs.add(name=name, datatype=datatype, shape=array.shape)
        msg.raw_input_contents.append(array.tobytes())
    for name in outputs:
        msg.outputs.add(name=name)
    return msg


def _full_inputs(msg: pb.ModelInferRequest) -> list[NamedTensor]:
    headers = input_headers(msg, "model 'm'", LIMIT)
    return input_data(msg, headers, None, [], "model 'm'")


PLAIN = {
    "one fp32 row": _request(("x", "FP32", np.arange(16, dtype=np.float32).reshape(1, 16))),
    "two inputs": _request(
        ("ids", "INT64", np.arange(6, dtype=np.int64).reshape(2, 3)),
        ("mask", "UINT8", np.ones((2, 3), np.uint8)),
    ),
    "fp16 image": _request(("img", "FP16", np.ones((1, 3, 4, 4), np.float16))),
    "bf16": _request(("x", "BF16", np.arange(4, dtype=np.uint16))),
    "scalar": _request(("s", "INT32", np.array(7, np.int32))),
    "no rows": _request(("x", "FP32", np.zeros((0, 4), np.float32))),
    "with outputs": _request(("x", "FP32", np.ones((1, 2), np.float32)), outputs=("a", "b")),
}


@pytest.mark.parametrize("msg", PLAIN.values(), ids=PLAIN.keys())
def test_plain_inputs_match_the_full_steps(msg: pb.ModelInferRequest) -> None:
    fast = plain_inputs(msg, LIMIT)
    assert fast is not None
    full = _full_inputs(msg)
    assert [t.name for t in fast] == [t.name for t in full]
    for got, want in zip(fast, full, strict=True):
        assert got.data.dtype == want.data.dtype
        assert got.data.shape == want.data.shape
        assert not got.data.flags.writeable  # zero-copy over the message, like the full path
        np.testing.assert_array_equal(got.data, want.data)


@pytest.mark.parametrize("msg", PLAIN.values(), ids=PLAIN.keys())
def test_plain_outputs_match_the_full_step(msg: pb.ModelInferRequest) -> None:
    assert plain_outputs(msg) == requested_outputs(msg, None, "model 'm'")


def _declined_inputs() -> dict[str, Callable[[pb.ModelInferRequest], None]]:
    def set_(field: str, value: Any) -> Callable[[pb.ModelInferRequest], None]:
        def change(msg: pb.ModelInferRequest) -> None:
            setattr(msg.inputs[0], field, value)

        return change

    def shm(msg: pb.ModelInferRequest) -> None:
        msg.inputs[0].parameters["shared_memory_region"].string_param = "r"

    def typed(msg: pb.ModelInferRequest) -> None:
        msg.inputs[0].contents.fp32_contents.extend([1.0] * 16)

    def extra_raw(msg: pb.ModelInferRequest) -> None:
        msg.raw_input_contents.append(b"")

    def short(msg: pb.ModelInferRequest) -> None:
        msg.raw_input_contents[0] = msg.raw_input_contents[0][:-1]

    def negative(msg: pb.ModelInferRequest) -> None:
        msg.inputs[0].shape[:] = [-1, 16]

    def repeated(msg: pb.ModelInferRequest) -> None:
        msg.inputs.add(name="x", datatype="FP32", shape=[1, 16])
        msg.raw_input_contents.append(bytes(64))

    return {
        "bytes": set_("datatype", "BYTES"),
        "bool": set_("datatype", "BOOL"),
        "unknown datatype": set_("datatype", "FP128"),
        "no name": set_("name", ""),
        "shared memory": shm,
        "typed contents": typed,
        "raw count": extra_raw,
        "size": short,
        "negative dim": negative,
        "repeated name": repeated,
    }


DECLINED = _declined_inputs()


@pytest.mark.parametrize("change", DECLINED.values(), ids=DECLINED.keys())
def test_anything_else_is_left_to_the_full_decoder(
    change: Callable[[pb.ModelInferRequest], None],
) -> None:
    msg = _request(("x", "FP32", np.ones((1, 16), np.float32)))
    change(msg)
    assert plain_inputs(msg, LIMIT) is None
    error: Exception | None = None
    try:  # the full decoder answers it: decoded, or refused with its own message
        codec.decode_request(msg, registry=None, max_recv_msg_bytes=LIMIT)
    except (InvalidArgumentError, RegionNotRegisteredError) as exc:
        error = exc
    if error is not None:
        assert "model 'm'" in str(error)


def test_the_message_limit_is_left_to_the_full_decoder() -> None:
    msg = _request(("x", "FP32", np.ones((1, 16), np.float32)))
    assert plain_inputs(msg, 63) is None
    with pytest.raises(InvalidArgumentError, match=r"grpc\.max_recv_msg_bytes"):
        codec.decode_request(msg, registry=None, max_recv_msg_bytes=63)


def _with_parameter(msg: pb.ModelInferRequest) -> None:
    msg.outputs[0].parameters["classification"].int64_param = 2


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.outputs.add(name=""),
        lambda m: m.outputs.add(name="a"),
        _with_parameter,
    ],
    ids=["no name", "repeated", "parameters"],
)
def test_outputs_with_anything_but_a_name_are_left_to_the_full_step(
    change: Callable[[pb.ModelInferRequest], object],
) -> None:
    msg = _request(("x", "FP32", np.ones((1, 2), np.float32)), outputs=("a",))
    change(msg)
    assert plain_outputs(msg) is None


def _response(*outputs: tuple[str, Array]) -> InferResponse:
    return InferResponse(
        model_name="m",
        model_version="1",
        id="r",
        outputs=[NamedTensor(name, array) for name, array in outputs],
    )


def test_plain_payloads_match_the_wire_form() -> None:
    logits = np.arange(8, dtype=np.float32).reshape(2, 4)
    ids = np.arange(3, dtype=np.int64)[::-1]  # not contiguous: the bytes are still C order
    flags = np.array([True, False])
    msg = codec.encode_response(
        _response(("logits", logits), ("ids", ids), ("flags", flags)),
        requested=[OutputRequest("ids"), OutputRequest("logits"), OutputRequest("flags")],
        registry=None,
    )
    assert [(o.name, o.datatype, list(o.shape)) for o in msg.outputs] == [
        ("ids", "INT64", [3]),
        ("logits", "FP32", [2, 4]),
        ("flags", "BOOL", [2]),
    ]
    assert msg.raw_output_contents == [ids.tobytes(), logits.tobytes(), flags.tobytes()]
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "1", "r")


@pytest.mark.parametrize(
    ("array", "ref"),
    [
        (np.array([b"a", b"bc"], dtype=object), None),
        (np.arange(3, dtype=">i4"), None),
        (np.ones(2, np.float32), ShmRef("r", 0, 8)),
    ],
    ids=["bytes", "big-endian", "shared memory"],
)
def test_plain_payloads_leave_the_rest_untouched(array: Array, ref: ShmRef | None) -> None:
    msg = pb.ModelInferResponse()
    plain = (NamedTensor("a", np.ones(2, np.float32)), None)
    assert not plain_payloads([plain, (NamedTensor("b", array), ref)], msg)
    assert not msg.outputs
    assert not msg.raw_output_contents


def test_big_endian_outputs_still_go_out_little_endian() -> None:
    array = np.arange(3, dtype=">i4")
    msg = codec.encode_response(_response(("a", array)), requested=[], registry=None)
    assert msg.outputs[0].datatype == "INT32"
    assert msg.raw_output_contents[0] == array.astype("<i4").tobytes()
    assert DType.from_kserve(msg.outputs[0].datatype) is DType.I32
