"""ModelMetadata, ModelConfig, RepositoryIndex and ModelStatistics built from real bundles."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import jax
import numpy as np
import pytest

from packages.worker.tests._info_bundles import lone_bundle, variant_bundle
from packages.worker.tests.conftest import BundleMaker, Tensor
from reactantserver.core.dtypes import DType
from reactantserver.core.manifest import Manifest, parse_manifest
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.protocol import model_config_pb2 as mc
from reactantserver.worker.dataplane import RequestStats
from reactantserver.worker.hooks import BundleHooks, load_hooks
from reactantserver.worker.registry import ModelEntry
from reactantserver.worker.runtime import ExecutableCache, LoadedModel, load_bundle
from reactantserver.worker.runtime.jax_backend import JaxBackend
from reactantserver.worker.scheduler import ScheduledModel
from reactantserver.worker.scheduler.stats import BatchStats, StatsSnapshot
from reactantserver.worker.views.model_info import (
    CONFIG_DATA_TYPES,
    META_PLATFORM,
    NOT_RESIDENT_REASON,
    config_data_type,
    model_config,
    model_metadata,
    model_statistics,
    repository_index,
)

W2 = np.array([10.0, 100.0], np.float32)
W1 = np.array([3.0], np.float32)
Tm = pb.ModelMetadataResponse.TensorMetadata
CPU = mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
Loader = Callable[..., ModelEntry]


def _scale(x: jax.Array, w: jax.Array) -> jax.Array:
    return x * w


def _transpose_scale(x: jax.Array, w: jax.Array) -> jax.Array:
    return x.T * w


def _scale_first(x: jax.Array, w: jax.Array) -> jax.Array:
    return x * w[0]


@pytest.fixture
def load(tmp_path: Path) -> Iterator[Loader]:
    """Compile a bundle on the CPU into a READY entry (closed at teardown)."""
    backend = JaxBackend("cpu")
    cache = ExecutableCache(tmp_path / "exe", backend)
    opened: list[LoadedModel] = []

    def entry(bundle: Path, *, max_batch_size: int | None = None) -> ModelEntry:
        loaded = load_bundle(bundle, backend, cache)
        opened.append(loaded)
        scheduled = ScheduledModel.from_loaded(loaded, max_batch_size=max_batch_size)
        hooks = load_hooks(bundle, loaded.manifest)
        return ModelEntry.ready(loaded.manifest, hooks, scheduled=scheduled, loaded=loaded)

    yield entry
    for loaded in opened:
        loaded.close()


def _config(entry: ModelEntry, **overrides: Any) -> pb.ModelConfigResponse:
    """``model_config`` with the values a CPU worker would pass for ``entry``."""
    assert entry.scheduled is not None
    assert entry.loaded is not None
    kwargs: dict[str, Any] = {
        "platform": "cpu",
        "device_ordinal": 0,
        "max_queue_depth": 64,
        "effective_max_batch": entry.scheduled.max_batch,
        "residency": "UNPINNED",
        "weight_bytes": entry.loaded.weight_nbytes,
    }
    kwargs.update(overrides)
    return model_config(entry, **kwargs)


def _params(**values: str) -> dict[str, mc.ModelParameter]:
    return {k: mc.ModelParameter(string_value=v) for k, v in values.items()}


def _queue_policy(depth: int = 64) -> mc.ModelQueuePolicy:
    return mc.ModelQueuePolicy(max_queue_size=depth, allow_timeout_override=True)


def _manifest(name: str, data: dict[str, Any], *, model_py: bool = False) -> Manifest:
    return parse_manifest(
        {"format_version": "3.0", **data},
        source=f"/models/{name}/manifest.yaml",
        model_name=name,
        has_model_py=model_py,
    )


# -- ModelMetadata / ModelConfig ----------------------------------------------------------------


def test_coalescable_model_omits_the_batch_axis(make_bundle: BundleMaker, load: Loader) -> None:
    xy = Tensor("x", "f32", "nk", {"k": 2}), Tensor("y", "f32", "nk", {"k": 2})
    bundle = make_bundle(
        "mlp", _scale, inputs=[xy[0]], outputs=[xy[1]], weights=[("w", W2)], batch_sizes=[1, 4, 8]
    )
    entry = load(bundle, max_batch_size=4)

    assert model_metadata(entry, platform="cpu") == pb.ModelMetadataResponse(
        name="mlp",
        versions=["1"],
        platform="cpu",
        inputs=[Tm(name="x", datatype="FP32", shape=[-1, 2])],
        outputs=[Tm(name="y", datatype="FP32", shape=[-1, 2])],
    )
    expected = mc.ModelConfig(
        name="mlp",
        platform="cpu",
        backend="reactantserver",
        max_batch_size=4,
        input=[mc.ModelInput(name="x", data_type=mc.TYPE_FP32, dims=[2])],
        output=[mc.ModelOutput(name="y", data_type=mc.TYPE_FP32, dims=[2])],
        dynamic_batching=mc.ModelDynamicBatching(
            preferred_batch_size=[1, 4],
            max_queue_delay_microseconds=0,
            default_queue_policy=_queue_policy(),
        ),
        instance_group=[CPU],
        parameters=_params(
            compiled_batch_sizes="1,4,8",
            variants="[]",
            residency="UNPINNED",
            weight_bytes="8",
            manifest_format="3.0",
        ),
    )
    assert _config(entry) == pb.ModelConfigResponse(config=expected)
    delayed = _config(entry, queue_delay_us=750).config.dynamic_batching
    assert delayed.max_queue_delay_microseconds == 750


def test_batch_axis_off_front_reports_no_max_batch(make_bundle: BundleMaker, load: Loader) -> None:
    x, y = Tensor("x", "f32", "kn", {"k": 2}), Tensor("y", "f32", "nk", {"k": 2})
    bundle = make_bundle(
        "cols", _transpose_scale, inputs=[x], outputs=[y], weights=[("w", W2)], batch_sizes=[1, 2]
    )
    entry = load(bundle)

    config = _config(entry, residency="PINNED_DEVICE").config
    assert config.max_batch_size == 0
    assert list(config.input) == [mc.ModelInput(name="x", data_type=mc.TYPE_FP32, dims=[2, -1])]
    assert list(config.output) == [mc.ModelOutput(name="y", data_type=mc.TYPE_FP32, dims=[-1, 2])]
    # Still coalescable: the scheduler batches it, clients just cannot use Triton's batch dim.
    assert config.dynamic_batching == mc.ModelDynamicBatching(
        preferred_batch_size=[1, 2], default_queue_policy=_queue_policy()
    )
    assert config.parameters["residency"].string_value == "PINNED_DEVICE"
    assert model_metadata(entry, platform="cpu").inputs[0] == Tm(
        name="x", datatype="FP32", shape=[2, -1]
    )


def test_unbatched_model(tmp_path: Path, load: Loader) -> None:
    x, y = Tensor("x", "f32", "k", {"k": 3}), Tensor("y", "f32", "k", {"k": 3})
    w = np.array([1.0, 2.0, 3.0], np.float32)
    entry = load(
        lone_bundle(tmp_path / "lone", _scale, inputs=[x], outputs=[y], weights=[("w", w)])
    )

    assert model_metadata(entry, platform="cpu") == pb.ModelMetadataResponse(
        name="lone",
        versions=["1"],
        platform="cpu",
        inputs=[Tm(name="x", datatype="FP32", shape=[3])],
        outputs=[Tm(name="y", datatype="FP32", shape=[3])],
    )
    expected = mc.ModelConfig(
        name="lone",
        platform="cpu",
        backend="reactantserver",
        input=[mc.ModelInput(name="x", data_type=mc.TYPE_FP32, dims=[3])],
        output=[mc.ModelOutput(name="y", data_type=mc.TYPE_FP32, dims=[3])],
        instance_group=[CPU],
        parameters=_params(
            compiled_batch_sizes="",
            variants="[]",
            residency="UNPINNED",
            weight_bytes="12",
            manifest_format="3.0",
        ),
    )
    config = _config(entry)
    assert config == pb.ModelConfigResponse(config=expected)
    assert not config.config.HasField("dynamic_batching")


def test_variable_axes_and_variants(tmp_path: Path, load: Loader) -> None:
    x, y = Tensor("x", "f32", "nt", {"t": -1}), Tensor("y", "f32", "nt", {"t": -1})
    bundle = variant_bundle(
        tmp_path / "seq",
        _scale_first,
        inputs=[x],
        outputs=[y],
        weights=[("w", W1)],
        batch_sizes=[1, 2],
        shapes=[{"t": 3}, {"t": 5}],
    )
    entry = load(bundle)

    metadata = model_metadata(entry, platform="cpu")
    assert list(metadata.inputs) == [Tm(name="x", datatype="FP32", shape=[-1, -1])]
    assert list(metadata.outputs) == [Tm(name="y", datatype="FP32", shape=[-1, -1])]
    config = _config(entry).config
    assert config.max_batch_size == 2
    assert list(config.input) == [mc.ModelInput(name="x", data_type=mc.TYPE_FP32, dims=[-1])]
    assert list(config.output) == [mc.ModelOutput(name="y", data_type=mc.TYPE_FP32, dims=[-1])]
    assert dict(config.parameters) == _params(
        compiled_batch_sizes="1,2",
        variants="[[3],[5]]",
        residency="UNPINNED",
        weight_bytes="4",
        manifest_format="3.0",
    )


MODEL_PY = """
import numpy as np


def preprocess(inputs):
    return [NamedTensor("x", np.ones((len(inputs[0].data), 2), np.float32))]


def postprocess(outputs):
    (y,) = outputs
    return [NamedTensor("label", np.array([b"ok"] * len(y.data), dtype=object))]


register_model("tagged", preprocess=preprocess, postprocess=postprocess)
"""


def _bytes_client(*, unbatched_input: bool) -> Callable[[dict[str, Any]], None]:
    def edit(manifest: dict[str, Any]) -> None:
        manifest["client_inputs"] = [{"name": "text", "dtype": "bytes", "shape": "n"}]
        if unbatched_input:
            manifest["client_inputs"].append({"name": "lang", "dtype": "bytes", "shape": ""})
        manifest["client_outputs"] = [{"name": "label", "dtype": "bytes", "shape": "n"}]

    return edit


def _bytes_bundle(make_bundle: BundleMaker, name: str, *, unbatched_input: bool) -> Path:
    x, y = Tensor("x", "f32", "nk", {"k": 2}), Tensor("y", "f32", "nk", {"k": 2})
    bundle = make_bundle(
        name,
        _scale,
        inputs=[x],
        outputs=[y],
        weights=[("w", W2)],
        batch_sizes=[1, 4],
        manifest_edit=_bytes_client(unbatched_input=unbatched_input),
    )
    (bundle / "model.py").write_text(MODEL_PY)
    return bundle


def test_bytes_client_tensors_are_type_string(make_bundle: BundleMaker, load: Loader) -> None:
    entry = load(_bytes_bundle(make_bundle, "tagged", unbatched_input=False))

    assert model_metadata(entry, platform="cpu") == pb.ModelMetadataResponse(
        name="tagged",
        versions=["1"],
        platform="cpu",
        inputs=[Tm(name="text", datatype="BYTES", shape=[-1])],
        outputs=[Tm(name="label", datatype="BYTES", shape=[-1])],
    )
    config = _config(entry).config
    assert config.max_batch_size == 4
    assert list(config.input) == [mc.ModelInput(name="text", data_type=mc.TYPE_STRING, dims=[])]
    assert list(config.output) == [mc.ModelOutput(name="label", data_type=mc.TYPE_STRING, dims=[])]


def test_client_tensor_without_batch_axis_reports_no_max_batch(
    make_bundle: BundleMaker, load: Loader
) -> None:
    entry = load(_bytes_bundle(make_bundle, "tagged2", unbatched_input=True))

    config = _config(entry).config
    assert config.max_batch_size == 0
    assert list(config.input) == [
        mc.ModelInput(name="text", data_type=mc.TYPE_STRING, dims=[-1]),
        mc.ModelInput(name="lang", data_type=mc.TYPE_STRING, dims=[]),
    ]
    assert config.dynamic_batching.preferred_batch_size == [1, 4]


def test_cuda_instance_group_and_format_2(make_bundle: BundleMaker, load: Loader) -> None:
    def as_format_2(manifest: dict[str, Any]) -> None:
        manifest["format_version"] = "2.0"
        for tensor in manifest["executable_inputs"] + manifest["executable_outputs"]:
            tensor["shape"] = tensor["shape"][::-1]  # column-major letters

    xy = Tensor("x", "f32", "nk", {"k": 2}), Tensor("y", "f32", "nk", {"k": 2})
    bundle = make_bundle(
        "jl",
        _scale,
        inputs=[xy[0]],
        outputs=[xy[1]],
        weights=[("w", W2)],
        batch_sizes=[2, 8],
        manifest_edit=as_format_2,
    )
    entry = load(bundle)

    assert model_metadata(entry, platform="cuda").platform == "cuda"
    assert list(model_metadata(entry, platform="cuda").inputs) == [
        Tm(name="x", datatype="FP32", shape=[-1, 2])
    ]
    config = _config(entry, platform="cuda", device_ordinal=3, max_queue_depth=7).config
    assert config.platform == "cuda"
    assert list(config.instance_group) == [
        mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[3])
    ]
    assert config.max_batch_size == 8
    assert config.dynamic_batching.default_queue_policy == _queue_policy(7)
    assert config.parameters["manifest_format"].string_value == "2.0"
    assert config.parameters["compiled_batch_sizes"].string_value == "2,8"


def test_meta_model() -> None:
    manifest = _manifest(
        "pipeline",
        {
            "kind": "meta",
            "meta": {"calls": ["enc", "dec"]},
            "client_inputs": [{"name": "q", "dtype": "bytes", "shape": "n"}],
            "client_outputs": [{"name": "a", "dtype": "f32", "shape": "nk", "dims": {"k": 4}}],
        },
        model_py=True,
    )
    entry = ModelEntry.ready(manifest, BundleHooks())

    assert model_metadata(entry, platform="cuda") == pb.ModelMetadataResponse(
        name="pipeline",
        versions=["1"],
        platform=META_PLATFORM,
        inputs=[Tm(name="q", datatype="BYTES", shape=[-1])],
        outputs=[Tm(name="a", datatype="FP32", shape=[-1, 4])],
    )
    config = model_config(
        entry,
        platform="cuda",
        device_ordinal=1,
        max_queue_depth=0,
        effective_max_batch=0,
        residency="PINNED_SYSTEM",
        weight_bytes=96,
    )
    expected = mc.ModelConfig(
        name="pipeline",
        platform="reactantserver_meta",
        backend="reactantserver",
        input=[mc.ModelInput(name="q", data_type=mc.TYPE_STRING, dims=[-1])],
        output=[mc.ModelOutput(name="a", data_type=mc.TYPE_FP32, dims=[-1, 4])],
        instance_group=[
            mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[1])
        ],
        parameters=_params(
            kind="meta",
            calls="enc,dec",
            residency="PINNED_SYSTEM",
            weight_bytes="96",
            manifest_format="3.0",
        ),
    )
    assert config == pb.ModelConfigResponse(config=expected)


def test_entry_without_manifest_is_described_by_name_only() -> None:
    for entry in (ModelEntry.loading("warming"), ModelEntry.failed("warming", "bad dtype")):
        assert model_metadata(entry, platform="cpu") == pb.ModelMetadataResponse(
            name="warming", versions=["1"], platform="cpu"
        )
        config = model_config(
            entry,
            platform="cpu",
            device_ordinal=0,
            max_queue_depth=64,
            effective_max_batch=0,
            residency="UNPINNED",
            weight_bytes=0,
        )
        assert config == pb.ModelConfigResponse(
            config=mc.ModelConfig(
                name="warming", platform="cpu", backend="reactantserver", instance_group=[CPU]
            )
        )


def test_config_data_types_cover_every_wire_dtype() -> None:
    wire = {d for d in DType if d not in (DType.F8_E4M3, DType.F8_E5M2)}
    assert set(CONFIG_DATA_TYPES) == wire
    for dtype in wire:
        # The TYPE_* name matches the KServe datatype, except BYTES (Triton's TYPE_STRING).
        expected = "STRING" if dtype is DType.BYTES else dtype.kserve
        assert mc.DataType.Name(config_data_type(dtype)) == f"TYPE_{expected}"
    with pytest.raises(ValueError, match="f8_e4m3"):
        config_data_type(DType.F8_E4M3)


# -- RepositoryIndex ----------------------------------------------------------------------------

SIMPLE = {
    "executable_inputs": [{"name": "x", "dtype": "f32", "shape": "nk", "dims": {"k": 2}}],
    "executable_outputs": [{"name": "y", "dtype": "f32", "shape": "nk", "dims": {"k": 2}}],
    "batching": {"compiled_batch_sizes": [1, 4]},
}


def _ready(name: str) -> ModelEntry:
    return ModelEntry.ready(_manifest(name, SIMPLE), BundleHooks())


def _index_entries() -> list[ModelEntry]:
    return [
        _ready("zeta"),
        ModelEntry.failed("delta", "manifest.yaml: bad dtype\nmore detail"),
        _ready("alpha"),
        ModelEntry.loading("charlie"),
        attrs.evolve(_ready("bravo"), hidden=True),
        _ready("echo"),
    ]


def _row(name: str, state: str, reason: str = "") -> pb.RepositoryIndexResponse.ModelIndex:
    return pb.RepositoryIndexResponse.ModelIndex(name=name, version="1", state=state, reason=reason)


def test_repository_index_states() -> None:
    def unavailable(entry: ModelEntry) -> str | None:
        return NOT_RESIDENT_REASON if entry.name == "echo" else None

    index = repository_index(_index_entries(), ready_only=False, unavailable=unavailable)
    assert index == pb.RepositoryIndexResponse(
        models=[
            _row("alpha", "READY"),
            _row("charlie", "LOADING"),
            _row("delta", "UNAVAILABLE", "manifest.yaml: bad dtype"),
            _row("echo", "UNAVAILABLE", NOT_RESIDENT_REASON),
            _row("zeta", "READY"),
        ]
    )
    assert NOT_RESIDENT_REASON == "not resident"

    ready = repository_index(_index_entries(), ready_only=True, unavailable=unavailable)
    assert ready == pb.RepositoryIndexResponse(
        models=[_row("alpha", "READY"), _row("zeta", "READY")]
    )


def test_repository_index_empty() -> None:
    assert repository_index([], ready_only=True, unavailable=lambda e: None) == (
        pb.RepositoryIndexResponse()
    )


# -- ModelStatistics ----------------------------------------------------------------------------


def _duration(count: int, ns: int) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=count, ns=ns)


def _zero_stats(name: str) -> pb.ModelStatistics:
    zero = _duration(0, 0)
    return pb.ModelStatistics(
        name=name,
        version="1",
        inference_stats=pb.InferStatistics(
            success=zero,
            fail=zero,
            queue=zero,
            compute_input=zero,
            compute_infer=zero,
            compute_output=zero,
        ),
    )


def test_model_statistics() -> None:
    busy = StatsSnapshot(
        dispatch_count=5,
        requests_served=9,
        rows_served=19,
        queue_wait_count=9,
        queue_wait_ns=900,
        batches={8: BatchStats(2, 100, 200, 300), 1: BatchStats(3, 10, 20, 30)},
    )
    lone = StatsSnapshot(dispatch_count=1, rows_served=1, batches={0: BatchStats(1, 5, 6, 7)})
    requests = {
        "busy": RequestStats(
            success_count=8, success_ns=8000, fail_count=1, fail_ns=50, last_inference_ms=1234
        )
    }
    entries = [_ready("busy"), ModelEntry.loading("idle"), _ready("lone")]
    entries.append(attrs.evolve(_ready("sub"), hidden=True))

    response = model_statistics(
        entries,
        scheduler_stats={"busy": busy, "lone": lone, "sub": busy},
        request_stats=lambda name: requests.get(name, RequestStats()),
    )

    expected_busy = pb.ModelStatistics(
        name="busy",
        version="1",
        last_inference=1234,
        inference_count=19,
        execution_count=5,
        inference_stats=pb.InferStatistics(
            success=_duration(8, 8000),
            fail=_duration(1, 50),
            queue=_duration(9, 900),
            compute_input=_duration(5, 110),
            compute_infer=_duration(5, 220),
            compute_output=_duration(5, 330),
        ),
        batch_stats=[
            pb.InferBatchStatistics(
                batch_size=1,
                compute_input=_duration(3, 10),
                compute_infer=_duration(3, 20),
                compute_output=_duration(3, 30),
            ),
            pb.InferBatchStatistics(
                batch_size=8,
                compute_input=_duration(2, 100),
                compute_infer=_duration(2, 200),
                compute_output=_duration(2, 300),
            ),
        ],
    )
    expected_lone = _zero_stats("lone")
    expected_lone.inference_count = 1
    expected_lone.execution_count = 1
    expected_lone.inference_stats.compute_input.CopyFrom(_duration(1, 5))
    expected_lone.inference_stats.compute_infer.CopyFrom(_duration(1, 6))
    expected_lone.inference_stats.compute_output.CopyFrom(_duration(1, 7))
    expected_lone.batch_stats.add(
        batch_size=1,
        compute_input=_duration(1, 5),
        compute_infer=_duration(1, 6),
        compute_output=_duration(1, 7),
    )
    assert response == pb.ModelStatisticsResponse(
        model_stats=[expected_busy, _zero_stats("idle"), expected_lone]
    )
