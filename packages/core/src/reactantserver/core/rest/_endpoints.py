"""Per endpoint: the protobuf request an HTTP request stands for, and how its answer renders.

JSON shapes follow what Triton's HTTP server emits and ``tritonclient.http`` reads: server and
model metadata, the model config (the ``config`` message itself) and statistics print every
field; the repository index is a JSON list; shared-memory status is a list of regions;
health and readiness are a bare 200 (else 400); load, unload, register, unregister a bare 200.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf.message import Message

from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.rest._infer import infer_request, infer_response
from reactantserver.core.rest._json import (
    bad_request,
    json_type,
    message_to_json,
    parse_json_object,
    require_int,
)
from reactantserver.core.rest._routes import Endpoint, Route
from reactantserver.core.rest._types import RestResponse, empty_response, json_response

__all__ = ["Render", "translate"]

#: Turns the service's response message into the HTTP answer.
Render = Callable[[Message], RestResponse]

_NOT_READY = 400  # Triton answers a failed health or readiness check with 400, no body
_FILE_PREFIX = "file:"


def translate(
    route: Route, method: str, headers: Mapping[str, str], body: bytes
) -> tuple[Message, Render]:
    """The request message for ``route`` and the renderer of its response.

    Malformed bodies raise :class:`RestCallError` (``INVALID_ARGUMENT``).
    """
    simple = _SIMPLE.get(route.endpoint)
    if simple is not None:
        build, render = simple
        return build(route), render
    return _BUILDERS[route.endpoint](route, method, headers, body)


def _infer(
    route: Route, _method: str, headers: Mapping[str, str], body: bytes
) -> tuple[Message, Render]:
    request, plan = infer_request(route.model, route.version, headers, body)

    def render(msg: Message) -> RestResponse:
        assert isinstance(msg, pb.ModelInferResponse)
        return infer_response(msg, plan)

    return request, render


def _repository_index(
    route: Route, _method: str, _headers: Mapping[str, str], body: bytes
) -> tuple[Message, Render]:
    doc = parse_json_object(body, "repository index request")
    ready = doc.get("ready", False)
    if not isinstance(ready, bool):
        raise bad_request(f"repository index request: 'ready' must be a bool, got {ready!r}")
    return pb.RepositoryIndexRequest(repository_name=route.repository, ready=ready), _index


def _shm_register(
    route: Route, _method: str, _headers: Mapping[str, str], body: bytes
) -> tuple[Message, Render]:
    what = "shared memory register request"
    doc = parse_json_object(body, what, empty_ok=False)
    key = doc.get("key")
    if not isinstance(key, str):
        raise bad_request(f"{what}: 'key' must be a string, got {json_type(key)}")
    register = pb.SystemSharedMemoryRegisterRequest(
        name=route.region,
        key=key,
        offset=require_int(doc, "offset", what, default=0),
        byte_size=require_int(doc, "byte_size", what),
    )
    return register, _empty


def _json_all(msg: Message) -> RestResponse:
    return json_response(message_to_json(msg, defaults=True))


def _empty(_msg: Message) -> RestResponse:
    return empty_response()


def _flag(field: str) -> Render:
    def render(msg: Message) -> RestResponse:
        return empty_response(200 if getattr(msg, field) else _NOT_READY)

    return render


def _config(msg: Message) -> RestResponse:
    assert isinstance(msg, pb.ModelConfigResponse)
    return json_response(message_to_json(msg.config, defaults=True))


def _index(msg: Message) -> RestResponse:
    assert isinstance(msg, pb.RepositoryIndexResponse)
    return json_response([message_to_json(model) for model in msg.models])


def _regions(msg: Message) -> RestResponse:
    regions: Any = msg.regions  # type: ignore[attr-defined]
    return json_response([message_to_json(regions[key], defaults=True) for key in sorted(regions)])


def _model(cls: type[Message]) -> Callable[[Route], Message]:
    return lambda route: cls(name=route.model, version=route.version)


def _region(cls: type[Message]) -> Callable[[Route], Message]:
    return lambda route: cls(name=route.region)


_SIMPLE: dict[Endpoint, tuple[Callable[[Route], Message], Render]] = {
    Endpoint.SERVER_METADATA: (lambda _: pb.ServerMetadataRequest(), _json_all),
    Endpoint.SERVER_LIVE: (lambda _: pb.ServerLiveRequest(), _flag("live")),
    Endpoint.SERVER_READY: (lambda _: pb.ServerReadyRequest(), _flag("ready")),
    Endpoint.MODEL_METADATA: (_model(pb.ModelMetadataRequest), _json_all),
    Endpoint.MODEL_READY: (_model(pb.ModelReadyRequest), _flag("ready")),
    Endpoint.MODEL_CONFIG: (_model(pb.ModelConfigRequest), _config),
    Endpoint.MODEL_STATISTICS: (_model(pb.ModelStatisticsRequest), _json_all),
    Endpoint.SHM_STATUS: (_region(pb.SystemSharedMemoryStatusRequest), _regions),
    Endpoint.SHM_UNREGISTER: (_region(pb.SystemSharedMemoryUnregisterRequest), _empty),
    Endpoint.CUDA_SHM_STATUS: (_region(pb.CudaSharedMemoryStatusRequest), _regions),
    Endpoint.CUDA_SHM_UNREGISTER: (_region(pb.CudaSharedMemoryUnregisterRequest), _empty),
}


def _repository_control(
    route: Route, _method: str, _headers: Mapping[str, str], body: bytes
) -> tuple[Message, Render]:
    """Load/unload; ``parameters`` map as ``tritonclient.grpc`` sends them (files as bytes)."""
    load = route.endpoint is Endpoint.REPOSITORY_LOAD
    what = f"repository {'load' if load else 'unload'} request"
    cls = pb.RepositoryModelLoadRequest if load else pb.RepositoryModelUnloadRequest
    msg = cls(repository_name=route.repository, model_name=route.model)
    params = parse_json_object(body, what).get("parameters", {})
    if not isinstance(params, dict):
        raise bad_request(f"{what}: 'parameters' must be an object, got {json_type(params)}")
    for key, value in params.items():
        param = msg.parameters[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int) and -(1 << 63) <= value < 1 << 63:
            param.int64_param = value
        elif isinstance(value, str) and key.startswith(_FILE_PREFIX):
            try:
                param.bytes_param = base64.b64decode(value, validate=True)
            except binascii.Error:
                raise bad_request(f"{what}: parameter {key!r} is not base64") from None
        elif isinstance(value, str):
            param.string_param = value
        else:
            raise bad_request(f"{what}: parameter {key!r} has unsupported {json_type(value)}")
    return msg, _empty


def _cuda_register(
    route: Route, _method: str, _headers: Mapping[str, str], body: bytes
) -> tuple[Message, Render]:
    what = "CUDA shared memory register request"
    doc = parse_json_object(body, what, empty_ok=False)
    handle = doc.get("raw_handle", {})
    encoded = handle.get("b64") if isinstance(handle, dict) else None
    if not isinstance(encoded, str):
        raise bad_request(f"{what}: 'raw_handle' must be {{\"b64\": <base64 string>}}")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise bad_request(f"{what}: 'raw_handle.b64' is not base64") from None
    register = pb.CudaSharedMemoryRegisterRequest(
        name=route.region,
        raw_handle=raw,
        device_id=require_int(doc, "device_id", what, default=0, limit=63),
        byte_size=require_int(doc, "byte_size", what),
    )
    return register, _empty


def _trace_setting(
    route: Route, method: str, _headers: Mapping[str, str], body: bytes
) -> tuple[Message, Render]:
    msg = pb.TraceSettingRequest(model_name=route.model)
    if method != "POST":
        return msg, _trace_render
    what = "trace setting request"
    for key, value in parse_json_object(body, what).items():
        values = value if isinstance(value, list) else [] if value is None else [value]
        if not all(isinstance(v, str | int | float) for v in values):
            raise bad_request(f"{what}: setting {key!r} must be a string or a list of strings")
        msg.settings[key].value.extend(str(v) for v in values)
    return msg, _trace_render


def _trace_render(msg: Message) -> RestResponse:
    assert isinstance(msg, pb.TraceSettingResponse)
    return json_response({key: list(msg.settings[key].value) for key in sorted(msg.settings)})


def _log_settings(
    _route: Route, method: str, _headers: Mapping[str, str], body: bytes
) -> tuple[Message, Render]:
    msg = pb.LogSettingsRequest()
    if method != "POST":
        return msg, _log_render
    what = "log settings request"
    for key, value in parse_json_object(body, what).items():
        setting = msg.settings[key]
        if isinstance(value, bool):
            setting.bool_param = value
        elif isinstance(value, int) and 0 <= value < 1 << 32:
            setting.uint32_param = value
        elif isinstance(value, str):
            setting.string_param = value
        else:
            raise bad_request(f"{what}: setting {key!r} has unsupported {json_type(value)}")
    return msg, _log_render


def _log_render(msg: Message) -> RestResponse:
    assert isinstance(msg, pb.LogSettingsResponse)
    out: dict[str, Any] = {}
    for key in sorted(msg.settings):
        setting = msg.settings[key]
        kind = setting.WhichOneof("parameter_choice")
        out[key] = None if kind is None else getattr(setting, kind)
    return json_response(out)


_Builder = Callable[[Route, str, Mapping[str, str], bytes], tuple[Message, Render]]
_BUILDERS: dict[Endpoint, _Builder] = {
    Endpoint.MODEL_INFER: _infer,
    Endpoint.REPOSITORY_INDEX: _repository_index,
    Endpoint.REPOSITORY_LOAD: _repository_control,
    Endpoint.REPOSITORY_UNLOAD: _repository_control,
    Endpoint.SHM_REGISTER: _shm_register,
    Endpoint.CUDA_SHM_REGISTER: _cuda_register,
    Endpoint.TRACE_SETTING: _trace_setting,
    Endpoint.LOG_SETTINGS: _log_settings,
}
