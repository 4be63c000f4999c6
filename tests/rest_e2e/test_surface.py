"""Health, metadata, configuration, statistics and the repository index over REST.

Each answer is parsed back into tritonclient's own protobuf message and must equal what the
same process answers over gRPC.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from ._target import Target, grpc_input, http_input

pytestmark = pytest.mark.slow

MODELS = ("classifier_hooks", "cnn", "mlp", "two_io")


def _parse(data: Any, message: Any) -> Any:
    """REST JSON into a protobuf message (unknown fields are an error)."""
    return json_format.ParseDict(data, message)


def test_health_and_server_metadata(target: Target) -> None:
    with target.clients() as (rest, rpc):
        assert rest.is_server_live()
        assert rest.is_server_ready()
        metadata = _parse(rest.get_server_metadata(), service_pb2.ServerMetadataResponse())
        assert metadata == rpc.get_server_metadata()
        assert metadata.name == "ReactantServer"
        assert "system_shared_memory" in metadata.extensions


@pytest.mark.parametrize("model", MODELS)
def test_model_metadata_and_config_equal_grpc(target: Target, model: str) -> None:
    with target.clients() as (rest, rpc):
        assert rest.is_model_ready(model)
        assert rest.is_model_ready(model, "1")
        metadata = _parse(rest.get_model_metadata(model), service_pb2.ModelMetadataResponse())
        assert metadata == rpc.get_model_metadata(model)
        versioned = rest.get_model_metadata(model, "1")
        assert _parse(versioned, service_pb2.ModelMetadataResponse()) == metadata
        config = _parse(rest.get_model_config(model), model_config_pb2.ModelConfig())
        assert config == rpc.get_model_config(model).config
        assert config.name == model


def test_unknown_models_are_not_ready(target: Target) -> None:
    with target.clients() as (rest, _):
        assert not rest.is_model_ready("no_such_model")
        assert not rest.is_model_ready("mlp", "2")


def test_statistics_count_rest_requests(target: Target) -> None:
    x = np.ones((2, 16), np.float32)
    with target.clients() as (rest, rpc):
        before = rpc.get_inference_statistics("mlp").model_stats[0].inference_count
        rest.infer("mlp", [http_input("x", x, "FP32", binary=True)])
        rpc.infer("mlp", [grpc_input("x", x, "FP32")])
        stats = _parse(rest.get_inference_statistics("mlp"), service_pb2.ModelStatisticsResponse())
        (entry,) = stats.model_stats
        assert (entry.name, entry.version) == ("mlp", "1")
        assert entry.inference_count == before + 4
        every = _parse(rest.get_inference_statistics(), service_pb2.ModelStatisticsResponse())
        assert {s.name for s in every.model_stats} >= set(MODELS)


def test_repository_index_equals_grpc(target: Target) -> None:
    with target.clients() as (rest, rpc):
        index = rest.get_model_repository_index()
        parsed = _parse({"models": index}, service_pb2.RepositoryIndexResponse())
        assert parsed == rpc.get_model_repository_index()
        assert {m.name for m in parsed.models} >= set(MODELS)
        ready = _parse(
            {"models": rest.get_model_repository_index()},
            service_pb2.RepositoryIndexResponse(),
        )
        assert all(m.state == "READY" for m in ready.models if m.name in MODELS)
