"""REST infer translation against the real tritonclient.http encoder/decoder and tritonclient.grpc.

Request bodies come from ``tritonclient.http``'s own encoder; the protobuf produced must equal
what ``tritonclient.grpc`` sends for the same tensors. Responses are read back with
``tritonclient.http.InferResult``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import grpc
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import serialize_byte_tensor

from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.rest import RestCallError, RestResponse
from reactantserver.core.rest._infer import HEADER_LENGTH, OutputPlan, infer_request, infer_response

ARRAYS: dict[str, np.ndarray[Any, Any]] = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 7, 255]], dtype=np.uint8),
    "UINT16": np.array([0, 65535], dtype=np.uint16),
    "UINT32": np.array([1, 2**32 - 1], dtype=np.uint32),
    "UINT64": np.array([3, 2**64 - 1], dtype=np.uint64),
    "INT8": np.array([-128, 0, 127], dtype=np.int8),
    "INT16": np.array([[-(2**15)], [2**15 - 1]], dtype=np.int16),
    "INT32": np.arange(-3, 3, dtype=np.int32).reshape(2, 3),
    "INT64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
    "FP16": np.array([0.5, -2.25, 65504.0], dtype=np.float16),
    "FP32": np.array([[0.1, -1e30], [3.5, 0.0]], dtype=np.float32),
    "FP64": np.array([1e-300, -0.1, np.pi], dtype=np.float64),
    "BF16": np.array([1.0, -2.5, 0.1], dtype=ml_dtypes.bfloat16),
    "BYTES": np.array([[b"hello", b""], ["w\u00f6rld".encode(), b"x" * 300]], dtype=np.object_),
}
JSON_TYPES = [t for t in ARRAYS if t != "BF16"]


def _http_input(name: str, datatype: str, *, binary: bool) -> Any:
    array = ARRAYS[datatype]
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def _grpc_input(name: str, datatype: str) -> Any:
    array = ARRAYS[datatype]
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _http_body(
    inputs: list[Any], outputs: list[Any] | None = None, **kw: Any
) -> tuple[bytes, dict[str, str]]:
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs, **kw)
    headers = {} if json_size is None else {HEADER_LENGTH: str(json_size)}
    return body, headers


def _grpc_request(
    inputs: list[Any], outputs: list[Any] | None = None, **kw: Any
) -> pb.ModelInferRequest:
    from tritonclient.grpc._utils import _get_inference_request

    args = {
        "request_id": "",
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
        "priority": 0,
        "timeout": None,
        "parameters": None,
    }
    args.update(kw)
    theirs = _get_inference_request(
        model_name="m", inputs=inputs, model_version="", outputs=outputs, **args
    )
    return pb.ModelInferRequest.FromString(theirs.SerializeToString())


# tritonclient.http sends BF16 only as binary.
@pytest.mark.parametrize(
    ("datatype", "binary"),
    [(t, True) for t in ARRAYS] + [(t, False) for t in JSON_TYPES],
    ids=[f"{t}-binary" for t in ARRAYS] + [f"{t}-json" for t in JSON_TYPES],
)
def test_request_equals_tritonclient_grpc(datatype: str, binary: bool) -> None:
    body, headers = _http_body([_http_input("x", datatype, binary=binary)])
    ours, plan = infer_request("m", "", headers, body)
    assert ours == _grpc_request([_grpc_input("x", datatype)])
    assert plan == OutputPlan(binary_default=True)  # no outputs named: all binary


def test_mixed_inputs_outputs_and_parameters() -> None:
    http_inputs = [
        _http_input("a", "FP32", binary=True),
        _http_input("b", "BYTES", binary=False),
        _http_input("c", "INT64", binary=True),
        _http_input("d", "BOOL", binary=False),
    ]
    http_outputs = [
        httpclient.InferRequestedOutput("y", binary_data=False),
        httpclient.InferRequestedOutput("z", binary_data=True),
    ]
    params = {"custom_s": "v", "custom_i": 7, "custom_f": 0.5, "custom_b": True}
    kw: dict[str, Any] = {
        "request_id": "req-1",
        "sequence_id": 42,
        "sequence_start": True,
        "priority": 3,
        "timeout": 1500,
        "parameters": params,
    }
    body, headers = _http_body(http_inputs, http_outputs, **kw)
    ours, plan = infer_request("m", "", headers, body)
    grpc_inputs = [
        _grpc_input(n, t) for n, t in zip("abcd", ["FP32", "BYTES", "INT64", "BOOL"], strict=True)
    ]
    grpc_outputs = [grpcclient.InferRequestedOutput("y"), grpcclient.InferRequestedOutput("z")]
    assert ours == _grpc_request(grpc_inputs, grpc_outputs, **kw)
    assert ours.parameters["priority"].WhichOneof("parameter_choice") == "uint64_param"
    assert ours.parameters["timeout"].int64_param == 1500
    assert plan == OutputPlan(binary_default=False, binary={"y": False, "z": True})
    assert plan.is_binary("z")
    assert not plan.is_binary("y")
    assert not plan.is_binary("other")


def test_shared_memory_inputs_and_outputs_pass_through() -> None:
    shm_in = httpclient.InferInput("s", [2, 2], "FP32")
    shm_in.set_shared_memory("in_region", 16, offset=64)
    data_in = _http_input("x", "INT8", binary=True)
    shm_out = httpclient.InferRequestedOutput("o")
    shm_out.set_shared_memory("out_region", 32)
    body, headers = _http_body([shm_in, data_in], [shm_out])
    ours, _ = infer_request("m", "2", headers, body)

    g_in = grpcclient.InferInput("s", [2, 2], "FP32")
    g_in.set_shared_memory("in_region", 16, offset=64)
    g_out = grpcclient.InferRequestedOutput("o")
    g_out.set_shared_memory("out_region", 32)
    theirs = _grpc_request([g_in, _grpc_input("x", "INT8")], [g_out])
    theirs.model_version = "2"
    assert ours == theirs
    assert len(ours.raw_input_contents) == 1  # only the data input, as tritonclient.grpc


def test_nested_and_flat_json_data_and_no_header_length() -> None:
    doc = {
        "inputs": [
            {"name": "n", "shape": [2, 2], "datatype": "INT32", "data": [[1, 2], [3, 4]]},
            {"name": "f", "shape": [2, 2], "datatype": "FP16", "data": [1, 2.5, 3, 4]},
            {"name": "e", "shape": [0, 3], "datatype": "BYTES", "data": []},
        ]
    }
    ours, plan = infer_request("m", "", {}, json.dumps(doc).encode())
    assert ours.raw_input_contents[0] == np.array([1, 2, 3, 4], "<i4").tobytes()
    assert ours.raw_input_contents[1] == np.array([1, 2.5, 3, 4], "<f2").tobytes()
    assert ours.raw_input_contents[2] == b""
    assert plan == OutputPlan()


def test_header_length_is_case_insensitive() -> None:
    body, headers = _http_body([_http_input("x", "FP32", binary=True)])
    lowered = {k.lower(): v for k, v in headers.items()}
    assert (
        infer_request("m", "", lowered, body)[0].raw_input_contents[0] == ARRAYS["FP32"].tobytes()
    )


def _doc(**fields: Any) -> dict[str, Any]:
    tensor = {"name": "x", "shape": [2], "datatype": "INT32", "data": [1, 2]}
    tensor.update(fields)
    return {"inputs": [tensor]}


BAD_BODIES: list[tuple[str, bytes, dict[str, str], str]] = [
    ("bad json", b"{not json", {}, "malformed JSON"),
    ("not utf8", b"\xff\xfe", {}, "malformed JSON"),
    ("empty body", b"", {}, "malformed JSON"),
    ("array", b"[]", {}, "expected a JSON object"),
    ("no inputs", b"{}", {}, "missing 'inputs'"),
    ("inputs not list", b'{"inputs": {}}', {}, "'inputs' must be an array"),
    ("input not object", b'{"inputs": [1]}', {}, "inputs[0] must be an object"),
    ("no name", json.dumps(_doc(name=None)).encode(), {}, "'name' must be a string"),
    ("bad datatype", json.dumps(_doc(datatype="INT3")).encode(), {}, "unknown datatype 'INT3'"),
    ("no datatype", json.dumps(_doc(datatype=5)).encode(), {}, "'datatype' must be a string"),
    ("negative dim", json.dumps(_doc(shape=[-1])).encode(), {}, "non-negative integers"),
    ("shape not list", json.dumps(_doc(shape="2")).encode(), {}, "non-negative integers"),
    ("too few", json.dumps(_doc(data=[1])).encode(), {}, "'data' has 1 elements"),
    ("too many", json.dumps(_doc(data=[[1, 2], [3]])).encode(), {}, "'data' has 3 elements"),
    ("float for int", json.dumps(_doc(data=[1, 2.5])).encode(), {}, "must be integers"),
    ("bool for int", json.dumps(_doc(data=[1, True])).encode(), {}, "must be integers"),
    ("int range", json.dumps(_doc(data=[1, 2**31])).encode(), {}, "out of range"),
    (
        "uint negative",
        json.dumps(_doc(datatype="UINT8", data=[1, -1])).encode(),
        {},
        "out of range",
    ),
    ("bool type", json.dumps(_doc(datatype="BOOL", data=[1, 0])).encode(), {}, "true or false"),
    ("fp str", json.dumps(_doc(datatype="FP32", data=["1", 2])).encode(), {}, "must be numbers"),
    ("bytes int", json.dumps(_doc(datatype="BYTES", data=["a", 1])).encode(), {}, "strings"),
    ("bf16 json", json.dumps(_doc(datatype="BF16", data=[1, 2])).encode(), {}, "BF16"),
    ("null data", json.dumps(_doc(data=None)).encode(), {}, "'data' must be an array"),
    ("scalar data", json.dumps(_doc(data=1)).encode(), {}, "'data' must be an array"),
    (
        "data and binary",
        json.dumps(_doc(parameters={"binary_data_size": 8})).encode(),
        {},
        "only one of",
    ),
    (
        "binary past end",
        json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [2],
                        "datatype": "INT32",
                        "parameters": {"binary_data_size": 8},
                    }
                ]
            }
        ).encode(),
        {},
        "bytes of binary data are left",
    ),
    (
        "binary size bool",
        json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [2],
                        "datatype": "INT32",
                        "parameters": {"binary_data_size": True},
                    }
                ]
            }
        ).encode(),
        {},
        "non-negative integer",
    ),
    ("header length nan", b"{}", {HEADER_LENGTH: "abc"}, "is not an integer"),
    ("header length big", b"{}", {HEADER_LENGTH: "3"}, "outside the 2-byte body"),
    ("header length neg", b"{}", {HEADER_LENGTH: "-1"}, "outside the 2-byte body"),
    ("id int", json.dumps(_doc() | {"id": 5}).encode(), {}, "'id' must be a string"),
    ("params list", json.dumps(_doc() | {"parameters": []}).encode(), {}, "must be an object"),
    (
        "param list value",
        json.dumps(_doc() | {"parameters": {"k": [1]}}).encode(),
        {},
        "parameter 'k' must be a bool, number or string",
    ),
    (
        "param too big",
        json.dumps(_doc() | {"parameters": {"k": 2**64}}).encode(),
        {},
        "fits neither int64 nor uint64",
    ),
    (
        "binary_data_output str",
        json.dumps(_doc() | {"parameters": {"binary_data_output": "yes"}}).encode(),
        {},
        "'binary_data_output' must be a bool",
    ),
    ("outputs obj", json.dumps(_doc() | {"outputs": {}}).encode(), {}, "'outputs' must be an"),
    (
        "output no name",
        json.dumps(_doc() | {"outputs": [{"parameters": {}}]}).encode(),
        {},
        "output #0: 'name' must be a string",
    ),
    (
        "classification",
        json.dumps(
            _doc() | {"outputs": [{"name": "y", "parameters": {"classification": 3}}]}
        ).encode(),
        {},
        "'classification' is not supported",
    ),
    (
        "binary_data str",
        json.dumps(
            _doc() | {"outputs": [{"name": "y", "parameters": {"binary_data": 1}}]}
        ).encode(),
        {},
        "'binary_data' must be a bool",
    ),
    (
        "no source",
        json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "INT32"}]}).encode(),
        {},
        "no 'data'",
    ),
]


@pytest.mark.parametrize(
    ("body", "headers", "needle"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES]
)
def test_malformed_bodies_are_invalid_argument(
    body: bytes, headers: dict[str, str], needle: str
) -> None:
    with pytest.raises(RestCallError) as info:
        infer_request("m", "", headers, body)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in info.value.message


def test_trailing_binary_bytes_are_rejected() -> None:
    body, headers = _http_body([_http_input("x", "FP32", binary=True)])
    with pytest.raises(RestCallError, match="bytes of binary data follow"):
        infer_request("m", "", headers, body + b"\0")


def test_classification_zero_is_not_a_request() -> None:
    doc = _doc() | {"outputs": [{"name": "y", "parameters": {"classification": 0}}]}
    ours, _ = infer_request("m", "", {}, json.dumps(doc).encode())
    assert dict(ours.outputs[0].parameters) == {}


# -- responses -------------------------------------------------------------------------


def _raw(array: np.ndarray[Any, Any], datatype: str) -> bytes:
    if datatype == "BYTES":
        return bytes(serialize_byte_tensor(array).item())
    return array.tobytes()


def _response(datatypes: list[str]) -> pb.ModelInferResponse:
    msg = pb.ModelInferResponse(model_name="m", model_version="1", id="r7")
    for datatype in datatypes:
        array = ARRAYS[datatype]
        msg.outputs.add(name=datatype.lower(), datatype=datatype, shape=array.shape)
        msg.raw_output_contents.append(_raw(array, datatype))
    return msg


def _decode(response: RestResponse) -> Any:
    length = response.headers.get(HEADER_LENGTH)
    return httpclient.InferResult.from_response_body(
        response.body, header_length=None if length is None else int(length)
    )


def _same(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], datatype: str) -> None:
    assert got.shape == want.shape
    if datatype == "BYTES":
        decoded = [v if isinstance(v, bytes) else v.encode() for v in got.ravel()]
        assert decoded == list(want.ravel())
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_response_decodes_with_tritonclient(binary: bool) -> None:
    msg = _response(list(ARRAYS))
    response = infer_response(msg, OutputPlan(binary_default=binary))
    assert response.status == 200
    if binary:
        assert response.headers["Content-Type"] == "application/octet-stream"
        assert int(response.headers[HEADER_LENGTH]) < len(response.body)
    else:
        assert response.headers == {"Content-Type": "application/json"}
    result = _decode(response)
    assert result.get_response()["model_name"] == "m"
    assert result.get_response()["model_version"] == "1"
    assert result.get_response()["id"] == "r7"
    for datatype, array in ARRAYS.items():
        _same(result.as_numpy(datatype.lower()), array, datatype)


def test_per_output_binary_choice_and_json_shape() -> None:
    msg = _response(["FP32", "INT8"])
    response = infer_response(msg, OutputPlan(binary_default=True, binary={"int8": False}))
    header = json.loads(response.body[: int(response.headers[HEADER_LENGTH])])
    fp32, int8 = header["outputs"]
    assert fp32 == {
        "name": "fp32",
        "datatype": "FP32",
        "shape": [2, 2],
        "parameters": {"binary_data_size": 16},
    }
    assert int8 == {"name": "int8", "datatype": "INT8", "shape": [3], "data": [-128, 0, 127]}
    assert "parameters" not in header


def test_non_utf8_bytes_fall_back_to_binary() -> None:
    array = np.array([b"\xff\xfe", b"ok"], dtype=np.object_)
    msg = pb.ModelInferResponse(model_name="m", model_version="1")
    msg.outputs.add(name="b", datatype="BYTES", shape=[2])
    msg.raw_output_contents.append(_raw(array, "BYTES"))
    response = infer_response(msg, OutputPlan())
    assert HEADER_LENGTH in response.headers
    assert list(_decode(response).as_numpy("b")) == [b"\xff\xfe", b"ok"]
    assert "id" not in _decode(response).get_response()


def test_shared_memory_output_carries_its_parameters_and_no_data() -> None:
    msg = pb.ModelInferResponse(model_name="m", model_version="1")
    out = msg.outputs.add(name="s", datatype="FP32", shape=[4])
    out.parameters["shared_memory_region"].string_param = "r"
    out.parameters["shared_memory_byte_size"].int64_param = 16
    msg.outputs.add(name="d", datatype="INT32", shape=[1])
    msg.parameters["note"].string_param = "x"
    for raw in ([b"", b"\1\0\0\0"], [b"\1\0\0\0"]):  # index-aligned, or data outputs only
        del msg.raw_output_contents[:]
        msg.raw_output_contents.extend(raw)
        doc = infer_response(msg, OutputPlan()).json()
        assert doc["outputs"][0] == {
            "name": "s",
            "datatype": "FP32",
            "shape": [4],
            "parameters": {"shared_memory_byte_size": 16, "shared_memory_region": "r"},
        }
        assert doc["outputs"][1]["data"] == [1]
        assert doc["parameters"] == {"note": "x"}


def test_typed_contents_response() -> None:
    msg = pb.ModelInferResponse(model_name="m", model_version="1")
    out = msg.outputs.add(name="t", datatype="INT32", shape=[3])
    out.contents.int_contents.extend([1, -2, 3])
    assert infer_response(msg, OutputPlan()).json()["outputs"][0]["data"] == [1, -2, 3]
    binary = _decode(infer_response(msg, OutputPlan(binary_default=True)))
    assert binary.as_numpy("t").tolist() == [1, -2, 3]


def test_malformed_response_is_internal() -> None:
    msg = _response(["FP32", "INT8"])
    msg.raw_output_contents.append(b"extra")
    with pytest.raises(RestCallError) as info:
        infer_response(msg, OutputPlan())
    assert info.value.code == grpc.StatusCode.INTERNAL
    typed = pb.ModelInferResponse(model_name="m")
    typed.outputs.add(name="t", datatype="INT32", shape=[3]).contents.int_contents.append(1)
    with pytest.raises(RestCallError, match="malformed inference response"):
        infer_response(typed, OutputPlan())


def test_nan_and_infinity_survive_json() -> None:
    msg = pb.ModelInferResponse(model_name="m", model_version="1")
    msg.outputs.add(name="f", datatype="FP32", shape=[3])
    msg.raw_output_contents.append(np.array([np.nan, np.inf, -np.inf], np.float32).tobytes())
    got = _decode(infer_response(msg, OutputPlan())).as_numpy("f")
    assert np.isnan(got[0])
    assert got[1:].tolist() == [np.inf, -np.inf]


def test_bytes_length_prefix_is_little_endian() -> None:
    doc = {"inputs": [{"name": "s", "shape": [1], "datatype": "BYTES", "data": ["abc"]}]}
    ours, _ = infer_request("m", "", {}, json.dumps(doc).encode())
    assert ours.raw_input_contents[0] == struct.pack("<I", 3) + b"abc"
