"""handle_rest: routes, request messages, JSON answers and statuses over a canned backend."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote

import grpc
import numpy as np
import pytest
import tritonclient.http as httpclient
from google.protobuf.message import Message

from reactantserver.core import rest
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.protocol import model_config_pb2 as mc
from reactantserver.core.rest import (
    RestBackend,
    RestCallError,
    RestContext,
    RestResponse,
    handle_rest,
    http_status,
)

Answer = Message | Exception | Callable[[Message], Message]


class CannedBackend:
    """A RestBackend answering each gRPC method from a table; records every call."""

    def __init__(self, answers: Mapping[str, Answer]) -> None:
        self.answers = dict(answers)
        self.calls: list[tuple[str, Message, float | None]] = []

    async def call(
        self,
        method: str,
        request: Message,
        time_remaining: float | None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> Message:
        self.calls.append((method, request, time_remaining))
        answer = self.answers.get(method)
        if answer is None:
            raise RestCallError(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented")
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, Message):
            return answer
        return answer(request)

    def last(self) -> tuple[str, Message]:
        method, request, _ = self.calls[-1]
        return method, request


def _echo(request: Message) -> Message:
    """ModelInfer: every data input comes back as output ``<name>_out`` (a real identity)."""
    assert isinstance(request, pb.ModelInferRequest)
    response = pb.ModelInferResponse(
        model_name=request.model_name, model_version="1", id=request.id
    )
    for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
        response.outputs.add(
            name=tensor.name + "_out", datatype=tensor.datatype, shape=tensor.shape
        )
        response.raw_output_contents.append(raw)
    return response


def call(
    backend: RestBackend,
    method: str,
    path: str,
    body: bytes | str = b"",
    headers: Mapping[str, str] | None = None,
    **kw: Any,
) -> RestResponse:
    data = body.encode() if isinstance(body, str) else body
    return asyncio.run(handle_rest(method, path, headers or {}, data, backend, **kw))


def _error(response: RestResponse, status: int) -> str:
    assert response.status == status
    assert response.headers["Content-Type"] == "application/json"
    doc = response.json()
    assert list(doc) == ["error"]
    message: str = doc["error"]
    return message


def test_public_surface() -> None:
    assert rest.__all__ == sorted(rest.__all__)
    assert set(rest.__all__) == {
        "RestBackend",
        "RestCallError",
        "RestContext",
        "RestResponse",
        "handle_rest",
        "http_status",
    }


def test_import_leaves_aiohttp_and_jax_out() -> None:
    code = (
        "import sys, reactantserver.core.rest;"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'jax', 'jaxlib')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (grpc.StatusCode.OK, 200),
        (grpc.StatusCode.NOT_FOUND, 404),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (grpc.StatusCode.UNAVAILABLE, 503),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
        (grpc.StatusCode.INTERNAL, 500),
        (grpc.StatusCode.UNKNOWN, 500),
        (grpc.StatusCode.DATA_LOSS, 500),
        (grpc.StatusCode.INVALID_ARGUMENT, 400),
        (grpc.StatusCode.FAILED_PRECONDITION, 400),
        (grpc.StatusCode.OUT_OF_RANGE, 400),
        (grpc.StatusCode.ALREADY_EXISTS, 400),
        (grpc.StatusCode.UNIMPLEMENTED, 400),
        (grpc.StatusCode.CANCELLED, 400),
        (grpc.StatusCode.PERMISSION_DENIED, 400),
        (grpc.StatusCode.UNAUTHENTICATED, 400),
        (grpc.StatusCode.ABORTED, 400),
    ],
)
def test_status_mapping(code: grpc.StatusCode, status: int) -> None:
    assert http_status(code) == status
    if code is grpc.StatusCode.OK:
        return
    backend = CannedBackend({"ModelInfer": RestCallError(code, f"boom {code.name}")})
    body = json.dumps({"inputs": []})
    assert _error(call(backend, "POST", "/v2/models/m/infer", body), status) == f"boom {code.name}"


def test_server_metadata() -> None:
    answer = pb.ServerMetadataResponse(name="ReactantServer", version="0.1.0", extensions=["a"])
    backend = CannedBackend({"ServerMetadata": answer})
    response = call(backend, "GET", "/v2")
    assert response.status == 200
    assert response.headers == {"Content-Type": "application/json"}
    assert response.json() == {"name": "ReactantServer", "version": "0.1.0", "extensions": ["a"]}
    assert backend.last() == ("ServerMetadata", pb.ServerMetadataRequest())
    assert call(backend, "GET", "/v2/").status == 200  # one trailing slash is fine


@pytest.mark.parametrize(("which", "method"), [("live", "ServerLive"), ("ready", "ServerReady")])
def test_health(which: str, method: str) -> None:
    cls = getattr(pb, method + "Response")
    for flag, status in ((True, 200), (False, 400)):
        backend = CannedBackend({method: cls(**{which: flag})})
        response = call(backend, "GET", f"/v2/health/{which}")
        assert (response.status, response.body) == (status, b"")
    backend = CannedBackend({method: RestCallError(grpc.StatusCode.UNAVAILABLE, "no workers")})
    assert _error(call(backend, "GET", f"/v2/health/{which}"), 503) == "no workers"


def _metadata() -> pb.ModelMetadataResponse:
    meta = pb.ModelMetadataResponse(name="a b/c", versions=["1"], platform="cpu")
    meta.inputs.add(name="x", datatype="FP32", shape=[-1, 2**40])
    meta.outputs.add(name="y", datatype="BYTES", shape=[-1])
    return meta


def test_model_metadata_with_decoded_names_and_versions() -> None:
    backend = CannedBackend({"ModelMetadata": _metadata()})
    response = call(backend, "GET", "/v2/models/" + quote("a b/c", safe=""))
    assert response.json() == {
        "name": "a b/c",
        "versions": ["1"],
        "platform": "cpu",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2**40]}],
        "outputs": [{"name": "y", "datatype": "BYTES", "shape": [-1]}],
    }
    assert backend.last() == ("ModelMetadata", pb.ModelMetadataRequest(name="a b/c"))
    call(backend, "GET", "/v2/models/m/versions/1?x=y")
    assert backend.last() == ("ModelMetadata", pb.ModelMetadataRequest(name="m", version="1"))


def test_model_ready() -> None:
    backend = CannedBackend({"ModelReady": pb.ModelReadyResponse(ready=True)})
    assert call(backend, "GET", "/v2/models/m/versions/1/ready").status == 200
    assert backend.last() == ("ModelReady", pb.ModelReadyRequest(name="m", version="1"))
    backend.answers["ModelReady"] = pb.ModelReadyResponse(ready=False)
    assert call(backend, "GET", "/v2/models/m/ready").status == 400


def test_model_config_prints_every_field_with_numbers_and_enum_names() -> None:
    config = mc.ModelConfig(name="m", platform="cpu", backend="reactantserver")
    config.input.add(name="x", data_type=mc.TYPE_FP32, dims=[-1, 4])
    config.output.add(name="y", data_type=mc.TYPE_STRING, dims=[2])
    config.parameters["compiled_batch_sizes"].string_value = "1,8"
    config.dynamic_batching.preferred_batch_size.extend([1, 8])
    config.dynamic_batching.default_queue_policy.max_queue_size = 64
    backend = CannedBackend({"ModelConfig": pb.ModelConfigResponse(config=config)})
    doc = call(backend, "GET", "/v2/models/m/config").json()
    assert backend.last() == ("ModelConfig", pb.ModelConfigRequest(name="m"))
    assert doc["name"] == "m"
    assert doc["max_batch_size"] == 0  # defaults print, as Triton's config JSON
    assert doc["input"][0]["data_type"] == "TYPE_FP32"
    assert doc["input"][0]["dims"] == [-1, 4]
    assert doc["output"][0]["data_type"] == "TYPE_STRING"
    assert doc["parameters"] == {"compiled_batch_sizes": {"string_value": "1,8"}}
    assert doc["dynamic_batching"]["preferred_batch_size"] == [1, 8]
    assert doc["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 64
    assert "sequence_batching" not in doc  # the unset member of the scheduling oneof
    assert doc["instance_group"] == []


def test_statistics_all_and_one_model() -> None:
    stats = pb.ModelStatisticsResponse()
    entry = stats.model_stats.add(name="m", version="1", inference_count=2**63 + 5)
    entry.inference_stats.success.count = 3
    entry.inference_stats.success.ns = 2**60
    entry.batch_stats.add(batch_size=8).compute_infer.ns = 9
    backend = CannedBackend({"ModelStatistics": stats})
    doc = call(backend, "GET", "/v2/models/stats").json()
    assert backend.last() == ("ModelStatistics", pb.ModelStatisticsRequest())
    model = doc["model_stats"][0]
    assert model["inference_count"] == 2**63 + 5  # uint64 as a JSON number, not a string
    assert model["execution_count"] == 0
    assert model["inference_stats"]["success"] == {"count": 3, "ns": 2**60}
    assert model["batch_stats"][0]["batch_size"] == 8
    assert model["batch_stats"][0]["compute_infer"] == {"count": 0, "ns": 9}
    call(backend, "GET", "/v2/models/m/versions/1/stats")
    assert backend.last() == ("ModelStatistics", pb.ModelStatisticsRequest(name="m", version="1"))


def test_infer_round_trip_through_the_router() -> None:
    backend = CannedBackend({"ModelInfer": _echo})
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.array([b"x", b"yz"], dtype=np.object_)
    inputs = [httpclient.InferInput("a", [2, 3], "FP32"), httpclient.InferInput("s", [2], "BYTES")]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(s, binary_data=False)
    outputs = [
        httpclient.InferRequestedOutput("a_out", binary_data=False),
        httpclient.InferRequestedOutput("s_out", binary_data=True),
    ]
    body, size = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs, request_id="q"
    )
    headers = {"Inference-Header-Content-Length": str(size)}
    response = call(
        backend, "POST", "/v2/models/m/versions/1/infer", body, headers, time_remaining=2.5
    )
    assert response.status == 200
    method, request, budget = backend.calls[-1]
    assert (method, budget) == ("ModelInfer", 2.5)
    assert isinstance(request, pb.ModelInferRequest)
    assert (request.model_name, request.model_version, request.id) == ("m", "1", "q")
    result = httpclient.InferenceServerClient.parse_response_body(
        response.body, header_length=int(response.headers["Inference-Header-Content-Length"])
    )
    np.testing.assert_array_equal(result.as_numpy("a_out"), a)
    assert list(result.as_numpy("s_out")) == [b"x", b"yz"]
    assert result.get_output("a_out")["data"] == [0, 1, 2, 3, 4, 5]
    assert result.get_response()["id"] == "q"


def test_infer_body_errors_are_400_and_never_reach_the_backend() -> None:
    backend = CannedBackend({"ModelInfer": _echo})
    message = _error(call(backend, "POST", "/v2/models/m/infer", "{oops"), 400)
    assert message.startswith("inference request: malformed JSON")
    assert backend.calls == []


def test_repository_index() -> None:
    index = pb.RepositoryIndexResponse()
    index.models.add(name="a", version="1", state="READY")
    index.models.add(name="b", version="1", state="UNAVAILABLE", reason="compile failed")
    backend = CannedBackend({"RepositoryIndex": index})
    assert call(backend, "POST", "/v2/repository/index").json() == [
        {"name": "a", "version": "1", "state": "READY"},
        {"name": "b", "version": "1", "state": "UNAVAILABLE", "reason": "compile failed"},
    ]
    assert backend.last() == ("RepositoryIndex", pb.RepositoryIndexRequest())
    call(backend, "POST", "/v2/repository/r1/index", '{"ready": true}')
    assert backend.last() == (
        "RepositoryIndex",
        pb.RepositoryIndexRequest(repository_name="r1", ready=True),
    )
    assert "'ready' must be a bool" in _error(
        call(backend, "POST", "/v2/repository/index", '{"ready": 1}'), 400
    )


def test_repository_load_and_unload_parameters() -> None:
    answers = {
        "RepositoryModelLoad": pb.RepositoryModelLoadResponse(),
        "RepositoryModelUnload": pb.RepositoryModelUnloadResponse(),
    }
    backend = CannedBackend(answers)
    body = json.dumps(
        {
            "parameters": {
                "config": '{"max_batch_size": 4}',
                "file:1/model.bin": base64.b64encode(b"\0\1weights").decode(),
                "n": 3,
            }
        }
    )
    response = call(backend, "POST", "/v2/repository/models/m%201/load", body)
    assert (response.status, response.body) == (200, b"")
    want = pb.RepositoryModelLoadRequest(model_name="m 1")
    want.parameters["config"].string_param = '{"max_batch_size": 4}'
    want.parameters["file:1/model.bin"].bytes_param = b"\0\1weights"
    want.parameters["n"].int64_param = 3
    assert backend.last() == ("RepositoryModelLoad", want)
    call(backend, "POST", "/v2/repository/models/m/load")
    assert backend.last() == ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="m"))
    # what tritonclient.http.unload_model sends
    call(
        backend,
        "POST",
        "/v2/repository/models/m/unload",
        '{"parameters": {"unload_dependents": false}}',
    )
    unload = pb.RepositoryModelUnloadRequest(model_name="m")
    unload.parameters["unload_dependents"].bool_param = False
    assert backend.last() == ("RepositoryModelUnload", unload)
    call(backend, "POST", "/v2/repository/r/models/m/unload")
    assert backend.last() == (
        "RepositoryModelUnload",
        pb.RepositoryModelUnloadRequest(repository_name="r", model_name="m"),
    )
    bad = json.dumps({"parameters": {"file:x": "not base64!"}})
    assert "is not base64" in _error(
        call(backend, "POST", "/v2/repository/models/m/load", bad), 400
    )
    bad = json.dumps({"parameters": {"x": [1]}})
    assert "unsupported an array" in _error(
        call(backend, "POST", "/v2/repository/models/m/load", bad), 400
    )
    bad = json.dumps({"parameters": 3})
    assert "'parameters' must be an object" in _error(
        call(backend, "POST", "/v2/repository/models/m/load", bad), 400
    )
    failed = RestCallError(grpc.StatusCode.FAILED_PRECONDITION, "model control disabled")
    backend.answers["RepositoryModelLoad"] = failed
    assert _error(call(backend, "POST", "/v2/repository/models/m/load"), 400) == (
        "model control disabled"
    )


def test_system_shared_memory() -> None:
    status = pb.SystemSharedMemoryStatusResponse()
    status.regions["b"].CopyFrom(
        pb.SystemSharedMemoryStatusResponse.RegionStatus(name="b", key="/kb", byte_size=2**40)
    )
    status.regions["a"].CopyFrom(
        pb.SystemSharedMemoryStatusResponse.RegionStatus(name="a", key="/ka", offset=8, byte_size=4)
    )
    backend = CannedBackend(
        {
            "SystemSharedMemoryStatus": status,
            "SystemSharedMemoryRegister": pb.SystemSharedMemoryRegisterResponse(),
            "SystemSharedMemoryUnregister": pb.SystemSharedMemoryUnregisterResponse(),
        }
    )
    assert call(backend, "GET", "/v2/systemsharedmemory/status").json() == [
        {"name": "a", "key": "/ka", "offset": 8, "byte_size": 4},
        {"name": "b", "key": "/kb", "offset": 0, "byte_size": 2**40},
    ]
    assert backend.last() == ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest())
    call(backend, "GET", "/v2/systemsharedmemory/region/a/status")
    assert backend.last() == (
        "SystemSharedMemoryStatus",
        pb.SystemSharedMemoryStatusRequest(name="a"),
    )
    # the body tritonclient.http.register_system_shared_memory sends
    body = json.dumps({"key": "/k", "offset": 16, "byte_size": 64})
    response = call(backend, "POST", "/v2/systemsharedmemory/region/r%2F1/register", body)
    assert (response.status, response.body) == (200, b"")
    assert backend.last() == (
        "SystemSharedMemoryRegister",
        pb.SystemSharedMemoryRegisterRequest(name="r/1", key="/k", offset=16, byte_size=64),
    )
    call(
        backend, "POST", "/v2/systemsharedmemory/region/r/register", '{"key": "/k", "byte_size": 1}'
    )
    assert backend.last()[1] == pb.SystemSharedMemoryRegisterRequest(
        name="r", key="/k", byte_size=1
    )
    call(backend, "POST", "/v2/systemsharedmemory/unregister")
    assert backend.last() == (
        "SystemSharedMemoryUnregister",
        pb.SystemSharedMemoryUnregisterRequest(),
    )
    call(backend, "POST", "/v2/systemsharedmemory/region/r/unregister")
    assert backend.last()[1] == pb.SystemSharedMemoryUnregisterRequest(name="r")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("", "malformed JSON"),
        ('{"offset": 0, "byte_size": 4}', "'key' must be a string"),
        ('{"key": "/k"}', "missing 'byte_size'"),
        ('{"key": "/k", "byte_size": -1}', "out of range"),
        ('{"key": "/k", "byte_size": 4, "offset": "0"}', "'offset' must be an integer"),
        ('{"key": "/k", "byte_size": true}', "'byte_size' must be an integer"),
        ("[1]", "expected a JSON object"),
    ],
)
def test_shared_memory_register_errors(body: str, needle: str) -> None:
    backend = CannedBackend({})
    message = _error(call(backend, "POST", "/v2/systemsharedmemory/region/r/register", body), 400)
    assert needle in message
    assert backend.calls == []


def test_cuda_shared_memory_trace_and_logging_reach_the_backend() -> None:
    backend = CannedBackend({})  # UNIMPLEMENTED for all, as the worker answers
    handle = base64.b64encode(b"\1" * 8).decode()
    register = json.dumps({"raw_handle": {"b64": handle}, "device_id": 1, "byte_size": 4})
    cases = [
        ("GET", "/v2/cudasharedmemory/status", "", pb.CudaSharedMemoryStatusRequest()),
        (
            "GET",
            "/v2/cudasharedmemory/region/c/status",
            "",
            pb.CudaSharedMemoryStatusRequest(name="c"),
        ),
        (
            "POST",
            "/v2/cudasharedmemory/region/c/register",
            register,
            pb.CudaSharedMemoryRegisterRequest(
                name="c", raw_handle=b"\1" * 8, device_id=1, byte_size=4
            ),
        ),
        ("POST", "/v2/cudasharedmemory/unregister", "", pb.CudaSharedMemoryUnregisterRequest()),
        ("GET", "/v2/trace/setting", "", pb.TraceSettingRequest()),
        ("GET", "/v2/models/m/trace/setting", "", pb.TraceSettingRequest(model_name="m")),
        ("GET", "/v2/logging", "", pb.LogSettingsRequest()),
    ]
    for method, path, body, request in cases:
        response = call(backend, method, path, body)
        assert _error(response, 400).endswith("is not implemented")
        assert backend.last()[1] == request
    call(
        backend,
        "POST",
        "/v2/trace/setting",
        '{"trace_level": ["TIMESTAMPS"], "trace_rate": 10, "x": null}',
    )
    trace = backend.last()[1]
    assert isinstance(trace, pb.TraceSettingRequest)
    assert {k: list(v.value) for k, v in trace.settings.items()} == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": ["10"],
        "x": [],
    }
    call(
        backend,
        "POST",
        "/v2/logging",
        '{"log_info": true, "log_verbose_level": 2, "log_format": "ISO8601"}',
    )
    logs = backend.last()[1]
    assert isinstance(logs, pb.LogSettingsRequest)
    assert logs.settings["log_info"].bool_param
    assert logs.settings["log_verbose_level"].uint32_param == 2
    assert logs.settings["log_format"].string_param == "ISO8601"
    assert "unsupported" in _error(call(backend, "POST", "/v2/logging", '{"x": -1}'), 400)
    assert "raw_handle" in _error(
        call(backend, "POST", "/v2/cudasharedmemory/region/c/register", '{"byte_size": 1}'), 400
    )


def test_trace_and_log_answers_render() -> None:
    trace = pb.TraceSettingResponse()
    trace.settings["trace_level"].value.append("OFF")
    logs = pb.LogSettingsResponse()
    logs.settings["log_info"].bool_param = True
    logs.settings["log_verbose_level"].uint32_param = 1
    backend = CannedBackend({"TraceSetting": trace, "LogSettings": logs})
    assert call(backend, "GET", "/v2/trace/setting").json() == {"trace_level": ["OFF"]}
    assert call(backend, "GET", "/v2/logging").json() == {"log_info": True, "log_verbose_level": 1}


@pytest.mark.parametrize(
    "path",
    [
        "/v2/nothing",
        "/v2/models",
        "/v2/models/m/versions",
        "/v2/models/m/unknown",
        "/v2/models/m/versions/1/infer/more",
        "/v2/health",
        "/v2/health/dead",
        "/v2/repository",
        "/v2/repository/models/m/reload",
        "/v2/systemsharedmemory/region/r",
        "/v2/systemsharedmemory/register",
        "/v2//models/m",
        "/v3",
        "/metrics",
        "",
    ],
)
def test_unknown_paths_are_404(path: str) -> None:
    backend = CannedBackend({})
    assert "no KServe V2 endpoint" in _error(call(backend, "GET", path), 404)
    assert backend.calls == []


def test_wrong_method_is_405_with_allow() -> None:
    backend = CannedBackend({})
    response = call(backend, "POST", "/v2/models/m")
    assert "POST is not allowed" in _error(response, 405)
    assert response.headers["Allow"] == "GET, HEAD"
    response = call(backend, "GET", "/v2/models/m/infer")
    assert "use POST" in _error(response, 405)
    assert response.headers["Allow"] == "POST"
    assert call(backend, "DELETE", "/v2/logging").headers["Allow"] == "GET, HEAD, POST"
    assert backend.calls == []


def test_head_answers_like_get_without_a_body() -> None:
    backend = CannedBackend({"ModelMetadata": _metadata()})
    response = call(backend, "HEAD", "/v2/models/m")
    assert (response.status, response.body) == (200, b"")
    assert response.headers["Content-Type"] == "application/json"
    assert call(backend, "head", "/v2/models/m/infer").status == 405


def test_bad_percent_encoding_is_400() -> None:
    backend = CannedBackend({})
    assert "percent-encoded UTF-8" in _error(call(backend, "GET", "/v2/models/%ff/ready"), 400)


def test_unexpected_backend_exception_is_500(caplog: pytest.LogCaptureFixture) -> None:
    backend = CannedBackend({"ServerLive": RuntimeError("kaput")})
    message = _error(call(backend, "GET", "/v2/health/live"), 500)
    assert message == "internal error: RuntimeError: kaput"
    assert "REST GET /v2/health/live failed" in caplog.text


def test_wrong_response_type_from_backend_is_500() -> None:
    backend = CannedBackend({"ModelConfig": pb.ServerLiveResponse(live=True)})
    assert _error(call(backend, "GET", "/v2/models/m/config"), 500).startswith("internal error")


def test_context_adapter_counts_down_and_aborts_with_the_status() -> None:
    async def main() -> None:
        assert RestContext(None).time_remaining() is None
        remaining = RestContext(10.0).time_remaining()
        assert remaining is not None
        assert 9.0 < remaining <= 10.0
        assert RestContext(-1.0).time_remaining() == 0.0
        with pytest.raises(RestCallError) as caught:
            await RestContext(None).abort(grpc.StatusCode.NOT_FOUND, "gone")
        assert (caught.value.code, caught.value.message) == (grpc.StatusCode.NOT_FOUND, "gone")

    asyncio.run(main())


def test_context_adapter_hands_the_headers_over_as_metadata() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    backend = CannedBackend({"ServerLive": pb.ServerLiveResponse(live=True)})
    seen: list[tuple[tuple[str, str], ...]] = []

    async def call_with_headers(
        method: str,
        request: Message,
        time_remaining: float | None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> Message:
        seen.append(RestContext(time_remaining, headers).invocation_metadata())
        return pb.ServerLiveResponse(live=True)

    backend.call = call_with_headers  # type: ignore[method-assign]
    answer = asyncio.run(
        handle_rest("GET", "/v2/health/live", {"TraceParent": parent}, b"", backend)
    )
    assert answer.status == 200
    assert seen == [(("traceparent", parent),)]
