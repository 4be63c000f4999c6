"""Message → JSON conversion and the REST path table."""

from __future__ import annotations

import math
from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.message import Message

from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.protocol import model_config_pb2 as mc
from reactantserver.core.rest import RestCallError
from reactantserver.core.rest._json import infer_parameter, message_to_json
from reactantserver.core.rest._routes import ALLOWED_METHODS, Endpoint, Route, match_route


def _config() -> mc.ModelConfig:
    config = mc.ModelConfig(name="m", platform="cuda", backend="reactantserver", max_batch_size=32)
    config.input.add(name="x", data_type=mc.TYPE_BF16, dims=[-1, 2**40])
    config.output.add(name="y", data_type=mc.TYPE_INT64, dims=[3])
    config.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[1])
    config.dynamic_batching.preferred_batch_size.extend([1, 8, 32])
    config.dynamic_batching.default_queue_policy.max_queue_size = 128
    config.dynamic_batching.default_queue_policy.allow_timeout_override = True
    config.parameters["variants"].string_value = '["a"]'
    return config


def _stats() -> pb.ModelStatisticsResponse:
    stats = pb.ModelStatisticsResponse()
    entry = stats.model_stats.add(name="m", version="1", last_inference=1_700_000_000_000)
    entry.inference_count = 2**64 - 1
    entry.inference_stats.queue.ns = 2**63
    entry.batch_stats.add(batch_size=4).compute_input.count = 1
    entry.memory_usage.add(type="GPU", id=-1, byte_size=5)
    entry.response_stats["k"].success.count = 2
    return stats


def _index() -> pb.RepositoryIndexResponse:
    index = pb.RepositoryIndexResponse()
    index.models.add(name="a", version="1", state="READY")
    return index


MESSAGES: list[Message] = [
    _config(),
    _stats(),
    _index(),
    pb.ServerMetadataResponse(name="n", version="v", extensions=["x", "y"]),
    pb.ModelMetadataResponse(name="m", versions=["1"], platform="cpu"),
    pb.CudaSharedMemoryRegisterRequest(name="c", raw_handle=b"\0\xff", device_id=-3),
]


@pytest.mark.parametrize("defaults", [False, True])
@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trips_through_the_protobuf_json_parser(message: Message, defaults: bool) -> None:
    doc = message_to_json(message, defaults=defaults)
    assert json_format.ParseDict(doc, type(message)()) == message


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_same_fields_as_json_format_with_64_bit_numbers(message: Message) -> None:
    for defaults in (False, True):
        ours = message_to_json(message, defaults=defaults)
        theirs = json_format.MessageToDict(
            message,
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=defaults,
        )
        assert _numbers(theirs) == _numbers(ours)


def _numbers(value: Any) -> Any:
    """json_format's output with its 64-bit integer strings turned into numbers."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


def test_64_bit_integers_are_json_numbers_and_enums_names() -> None:
    doc = message_to_json(_stats(), defaults=True)
    model = doc["model_stats"][0]
    assert model["inference_count"] == 2**64 - 1
    assert model["inference_stats"]["queue"] == {"count": 0, "ns": 2**63}
    assert model["memory_usage"] == [{"type": "GPU", "id": -1, "byte_size": 5}]
    assert model["response_stats"]["k"]["success"] == {"count": 2, "ns": 0}
    config = message_to_json(_config())
    assert config["input"][0] == {"name": "x", "data_type": "TYPE_BF16", "dims": [-1, 2**40]}
    assert config["instance_group"][0]["kind"] == "KIND_GPU"
    assert "version_policy" not in config  # unset message fields stay out


def test_defaults_only_when_asked() -> None:
    message = pb.ModelMetadataResponse(name="m")
    assert message_to_json(message) == {"name": "m"}
    assert message_to_json(message, defaults=True) == {
        "name": "m",
        "versions": [],
        "platform": "",
        "inputs": [],
        "outputs": [],
    }


def test_floats() -> None:
    queue = mc.ModelQueuePolicy(default_timeout_microseconds=5)
    assert message_to_json(queue)["default_timeout_microseconds"] == 5
    weight = pb.InferParameter(double_param=0.1)
    assert message_to_json(weight) == {"double_param": 0.1}
    for value, text in ((math.nan, "NaN"), (math.inf, "Infinity"), (-math.inf, "-Infinity")):
        assert message_to_json(pb.InferParameter(double_param=value)) == {"double_param": text}


def test_infer_parameter_members() -> None:
    params = pb.ModelInferRequest().parameters
    for key, value in {"b": False, "i": -5, "u": 2**63, "d": 1.5, "s": ""}.items():
        infer_parameter(params, key, value, "t")
    kinds = {k: v.WhichOneof("parameter_choice") for k, v in params.items()}
    assert kinds == {
        "b": "bool_param",
        "i": "int64_param",
        "u": "uint64_param",
        "d": "double_param",
        "s": "string_param",
    }
    with pytest.raises(RestCallError, match="fits neither"):
        infer_parameter(params, "x", -(2**63) - 1, "t")
    with pytest.raises(RestCallError, match="got null"):
        infer_parameter(params, "x", None, "t")


ROUTES = [
    ("/v2", Route(Endpoint.SERVER_METADATA)),
    ("/v2/health/live", Route(Endpoint.SERVER_LIVE)),
    ("/v2/health/ready/", Route(Endpoint.SERVER_READY)),
    ("/v2/models/stats", Route(Endpoint.MODEL_STATISTICS)),
    ("/v2/models/stats/stats", Route(Endpoint.MODEL_STATISTICS, model="stats")),
    ("/v2/models/m%2Fx", Route(Endpoint.MODEL_METADATA, model="m/x")),
    ("/v2/models/versions", Route(Endpoint.MODEL_METADATA, model="versions")),
    ("/v2/models/m/versions/7", Route(Endpoint.MODEL_METADATA, model="m", version="7")),
    ("/v2/models/m/versions/7/ready", Route(Endpoint.MODEL_READY, model="m", version="7")),
    ("/v2/models/m/config?q=1", Route(Endpoint.MODEL_CONFIG, model="m")),
    ("/v2/models/%E2%9C%93/infer", Route(Endpoint.MODEL_INFER, model="\u2713")),
    ("/v2/models/m/trace/setting", Route(Endpoint.TRACE_SETTING, model="m")),
    ("/v2/repository/index", Route(Endpoint.REPOSITORY_INDEX)),
    ("/v2/repository/models/index", Route(Endpoint.REPOSITORY_INDEX, repository="models")),
    ("/v2/repository/models/m/load", Route(Endpoint.REPOSITORY_LOAD, model="m")),
    (
        "/v2/repository/r/models/m/unload",
        Route(Endpoint.REPOSITORY_UNLOAD, model="m", repository="r"),
    ),
    ("/v2/systemsharedmemory/status", Route(Endpoint.SHM_STATUS)),
    ("/v2/systemsharedmemory/region/r/status", Route(Endpoint.SHM_STATUS, region="r")),
    ("/v2/systemsharedmemory/region/r/register", Route(Endpoint.SHM_REGISTER, region="r")),
    ("/v2/systemsharedmemory/unregister", Route(Endpoint.SHM_UNREGISTER)),
    ("/v2/cudasharedmemory/region/c/unregister", Route(Endpoint.CUDA_SHM_UNREGISTER, region="c")),
    ("/v2/trace/setting", Route(Endpoint.TRACE_SETTING)),
    ("/v2/logging", Route(Endpoint.LOG_SETTINGS)),
    ("/v2/models/m/infer/", Route(Endpoint.MODEL_INFER, model="m")),
    ("/v2/models//infer", None),
    # any version string goes to the service, which answers NOT_FOUND for unknown ones
    ("/v2/models/m/versions/infer", Route(Endpoint.MODEL_METADATA, model="m", version="infer")),
    ("/v2/models/m/versions", None),
    ("/v2x", None),
    ("v2", None),
]


@pytest.mark.parametrize(("path", "route"), ROUTES, ids=[r[0] or "empty" for r in ROUTES])
def test_match_route(path: str, route: Route | None) -> None:
    assert match_route(path) == route


def test_every_endpoint_has_methods_and_is_a_grpc_method() -> None:
    assert set(ALLOWED_METHODS) == set(Endpoint)
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert {e.value for e in Endpoint} <= {m.name for m in service.methods}
