"""Health, metadata, configuration and the repository index."""

from __future__ import annotations

import importlib.metadata
import json
from typing import Any

import pytest
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import InferenceServerException

from reactantserver.worker.scheduler import ADAPTIVE_MAX_HOLD_NS

from ._bundles import BROKEN, HOOKY, SPIN
from ._harness import message_of, status_of

pytestmark = pytest.mark.slow

SERVED = ("classifier_hooks", "cnn", HOOKY, "mlp", SPIN, "two_io")
FP32 = model_config_pb2.TYPE_FP32
EXTENSIONS = [
    "system_shared_memory",
    "model_repository",
    "model_configuration",
    "statistics",
    "parameters",
    "trace",
]


def _error(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return caught.value


def test_live_and_ready(client: Any) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()


def test_model_ready(client: Any) -> None:
    for name in SERVED:
        assert client.is_model_ready(name), name
        assert client.is_model_ready(name, "1"), name
    # never an error: unknown names, other versions and failed loads are simply not ready
    assert not client.is_model_ready("mlp", "2")
    assert not client.is_model_ready("no_such_model")
    assert not client.is_model_ready(BROKEN)


def test_server_metadata(client: Any) -> None:
    metadata = client.get_server_metadata()
    assert metadata.name == "ReactantServer"
    assert metadata.version == importlib.metadata.version("reactantserver-worker")
    assert list(metadata.extensions) == EXTENSIONS


def test_model_metadata_reports_client_facing_tensors(client: Any) -> None:
    mlp = client.get_model_metadata("mlp")
    assert mlp.name == "mlp"
    assert list(mlp.versions) == ["1"]
    assert mlp.platform == "cpu"
    assert [(t.name, t.datatype, list(t.shape)) for t in mlp.inputs] == [("x", "FP32", [-1, 16])]
    assert [(t.name, t.datatype, list(t.shape)) for t in mlp.outputs] == [
        ("logits", "FP32", [-1, 4])
    ]
    cnn = client.get_model_metadata("cnn", "1")
    assert [(t.name, list(t.shape)) for t in cnn.inputs] == [("image", [-1, 1, 28, 28])]
    hooks = client.get_model_metadata("classifier_hooks")
    assert [(t.name, t.datatype, list(t.shape)) for t in hooks.inputs] == [
        ("image", "UINT8", [-1, 28, 28, 3])
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in hooks.outputs] == [
        ("indices", "INT64", [-1, 3]),
        ("scores", "FP32", [-1, 3]),
    ]
    two_io = client.get_model_metadata("two_io")
    assert [t.name for t in two_io.inputs] == ["a", "b"]
    assert [t.name for t in two_io.outputs] == ["sum", "dot"]


@pytest.mark.parametrize("call", ["get_model_metadata", "get_model_config"])
def test_unknown_model_or_version_is_not_found(client: Any, call: str) -> None:
    for args in (("no_such_model",), ("mlp", "2")):
        error = _error(getattr(client, call), *args)
        assert status_of(error) == "NOT_FOUND", (args, error)


def test_model_config_of_a_coalescable_model(client: Any) -> None:
    config = client.get_model_config("mlp").config
    assert config.name == "mlp"
    assert config.platform == "cpu"
    assert config.backend == "reactantserver"
    assert config.max_batch_size == 32
    # the batch axis is omitted when max_batch_size > 0
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [("x", FP32, [16])]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [("logits", FP32, [4])]
    batching = config.dynamic_batching
    assert list(batching.preferred_batch_size) == [1, 8, 32]
    # No fixed delay is configured: the adaptive wait reports its bound (at most 2 ms).
    assert batching.max_queue_delay_microseconds == ADAPTIVE_MAX_HOLD_NS // 1000
    assert batching.default_queue_policy.max_queue_size == 1024
    assert batching.default_queue_policy.allow_timeout_override
    (group,) = config.instance_group
    assert group.count == 1
    assert group.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    parameters = {k: v.string_value for k, v in config.parameters.items()}
    assert parameters["compiled_batch_sizes"] == "1,8,32"
    assert isinstance(json.loads(parameters["variants"]), list)
    assert parameters["weight_bytes"] == str((16 * 32 + 32 + 32 * 4 + 4) * 4)
    assert parameters["manifest_format"] == "3.0"
    assert parameters["residency"]


def test_model_config_uses_client_tensors_and_triton_types(client: Any) -> None:
    hooks = client.get_model_config("classifier_hooks").config
    assert hooks.max_batch_size == 8
    assert [(t.name, t.data_type, list(t.dims)) for t in hooks.input] == [
        ("image", model_config_pb2.TYPE_UINT8, [28, 28, 3])
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in hooks.output] == [
        ("indices", model_config_pb2.TYPE_INT64, [3]),
        ("scores", FP32, [3]),
    ]
    assert list(hooks.dynamic_batching.preferred_batch_size) == [1, 8]
    cnn = client.get_model_config("cnn").config
    assert cnn.max_batch_size == 32
    assert [list(t.dims) for t in cnn.input] == [[1, 28, 28]]
    assert {k: v.string_value for k, v in cnn.parameters.items()}["compiled_batch_sizes"] == (
        "1,4,8,32"
    )


def test_repository_index_lists_the_broken_bundle_with_its_reason(client: Any) -> None:
    index = client.get_model_repository_index()
    entries = [(m.name, m.version, m.state) for m in index.models]
    assert [name for name, _, _ in entries] == sorted(name for name, _, _ in entries)
    by_name = {m.name: m for m in index.models}
    assert set(by_name) == {*SERVED, BROKEN}
    for name in SERVED:
        assert (by_name[name].version, by_name[name].state) == ("1", "READY"), name
    broken = by_name[BROKEN]
    assert broken.state == "UNAVAILABLE"
    assert broken.reason
    assert "\n" not in broken.reason


def test_repository_index_ready_only(stub: Any) -> None:
    index = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
    assert [m.name for m in index.models] == sorted(SERVED)


def test_static_mode_refuses_repository_control(client: Any) -> None:
    for call in (client.load_model, client.unload_model):
        error = _error(call, "mlp")
        assert status_of(error) == "FAILED_PRECONDITION", error
        assert "static" in message_of(error)
    assert client.is_model_ready("mlp")


def test_statistics_of_every_visible_model(client: Any) -> None:
    stats = client.get_inference_statistics()
    names = [s.name for s in stats.model_stats]
    assert set(SERVED) <= set(names)
    assert all(s.version == "1" for s in stats.model_stats)
    error = _error(client.get_inference_statistics, "no_such_model")
    assert status_of(error) == "NOT_FOUND"


def test_log_settings_read_and_change_the_workers_logging(client: Any) -> None:
    def settings(response: Any) -> dict[str, Any]:
        return {
            k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in response.settings.items()
        }

    before = settings(client.get_log_settings())
    assert before == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "text",
    }
    try:
        after = settings(client.update_log_settings({"log_verbose_level": 1}))
        assert after["log_verbose_level"] == 1
        assert settings(client.get_log_settings())["log_verbose_level"] == 1
        error = _error(client.update_log_settings, {"log_file": "/tmp/x.log", "no_such": True})
        assert status_of(error) == "INVALID_ARGUMENT"
        assert "log_file" in str(error)
        assert "no_such" in str(error)
        assert settings(client.get_log_settings())["log_verbose_level"] == 1  # nothing changed
    finally:
        client.update_log_settings({"log_verbose_level": 0})
    assert settings(client.get_log_settings()) == before


def test_cuda_shared_memory_is_unimplemented(client: Any) -> None:
    calls: list[tuple[Any, tuple[Any, ...]]] = [
        (client.get_cuda_shared_memory_status, ()),
        (client.register_cuda_shared_memory, ("cuda0", b"\0" * 64, 0, 64)),
        (client.unregister_cuda_shared_memory, ()),
    ]
    for call, args in calls:
        error = _error(call, *args)
        assert status_of(error) == "UNIMPLEMENTED", (call.__name__, error)


def test_trace_settings_of_a_worker_without_tracing(client: Any) -> None:
    # tracing.mode is off: the settings read as Triton's with the level OFF, and stay so.
    settings = client.get_trace_settings(as_json=True)["settings"]
    assert settings["trace_level"]["value"] == ["OFF"]
    assert settings["trace_mode"]["value"] == ["opentelemetry"]
    error = _error(client.update_trace_settings, "mlp", {"trace_level": ["TIMESTAMPS"]})
    assert status_of(error) == "FAILED_PRECONDITION", error
