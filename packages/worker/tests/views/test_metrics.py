"""Worker metrics: the exposition parsed back, over real jax bundles and the MockBackend."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs
import grpc
import jax
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from packages.worker.tests._fake_source import FakeSource
from packages.worker.tests._mock_runtime import mock_runtime, pool
from packages.worker.tests._world import start_world, world_config
from packages.worker.tests.conftest import BundleMaker, Tensor
from reactantserver.core.config import Backend, ModelControlMode, RuntimeConfig, WorkerConfig
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.types import InferRequest
from reactantserver.worker.registry import ModelEntry, ModelState
from reactantserver.worker.runtime import Residency
from reactantserver.worker.runtime.budget import BudgetPolicy
from reactantserver.worker.state import Runtime, WorkerState
from reactantserver.worker.views.metrics import (
    CONTENT_TYPE,
    GPU_FAMILIES,
    LATENCY_BUCKETS,
    WorkerMetrics,
    gpu_selector,
)

from ._nvml import READINGS, FakeGpu, FakeNvml

__all__ = ["pool"]  # fixtures, imported by name for pytest

X = Tensor("x", "f32", "nk", {"k": 2})
Y = Tensor("y", "f32", "nk", {"k": 2})
W = np.array([10.0, 100.0], np.float32)
BUDGET = 4096  # bytes of the mock runtimes' on-demand weight budget
DEVICE_BYTES = 1 << 20  # bytes the mock device holds

# Families present with no runtime (besides the default process/gc/platform collectors).
IDENTITY = {
    "reactantserver_worker_info",
    "reactantserver_worker_inflight_requests",
    "reactantserver_worker_requests_shed",
    "reactantserver_worker_max_concurrent_requests",
    "reactantserver_worker_models_loaded",
}


def scrape(metrics: WorkerMetrics) -> list[Sample]:
    """Every sample of one rendering, parsed back."""
    text = metrics.render().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def families(metrics: WorkerMetrics) -> set[str]:
    """Names of the families with samples in one rendering (counters without ``_total``)."""
    text = metrics.render().decode()
    return {f.name for f in text_string_to_metric_families(text) if f.samples}


def value(samples: Sequence[Sample], name: str, **labels: str) -> float:
    """The one sample named ``name`` whose labels include ``labels``."""
    found = [
        s
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0].value


def named(samples: Sequence[Sample], name: str) -> list[Sample]:
    """Every sample called ``name``."""
    return [s for s in samples if s.name == name]


def cuda_config(device_ordinal: int = 0) -> WorkerConfig:
    """A worker configuration for the CUDA backend and device ``device_ordinal``."""
    runtime = RuntimeConfig(backend=Backend.CUDA, device_ordinal=device_ordinal)
    return attrs.evolve(WorkerConfig(), runtime=runtime)


def must_not_load() -> object:
    """An NVML loader for workers that must not ask NVML: fails the test if called."""
    raise AssertionError("NVML must not be loaded")


@contextmanager
def nvml_metrics(
    state: WorkerState, fake: FakeNvml, environ: dict[str, str] | None = None
) -> Iterator[WorkerMetrics]:
    """Metrics of a CUDA ``state`` over the fake NVML, with one sample taken; closed after."""
    metrics = WorkerMetrics(state, environ=environ or {}, nvml=lambda: fake)
    try:
        assert metrics.gpu is not None
        assert metrics.gpu.refresh() is not None
        yield metrics
    finally:
        metrics.close()


def ready(name: str) -> ModelEntry:
    """A READY registry entry with no generation (enough for names and readiness)."""
    return ModelEntry(name, ModelState.READY)


def _scale(x: jax.Array, w: jax.Array) -> jax.Array:
    return x * w


# -- labels ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("visible", "ordinal", "selector"),
    [
        (None, 0, "0"),
        (None, 2, "2"),
        ("3", 0, "3"),
        ("GPU-abc", 0, "GPU-abc"),
        ("4,5,6", 1, "5"),
        (" 4, 5 ", 1, "5"),
        ("4,5", 2, None),
        ("", 0, None),
    ],
)
def test_gpu_selector(visible: str | None, ordinal: int, selector: str | None) -> None:
    assert gpu_selector(visible, ordinal) == selector


def test_before_the_runtime_only_identity_and_limits_are_exposed() -> None:
    state = WorkerState(WorkerConfig(), version="1.2.3")
    metrics = WorkerMetrics(state, environ={})
    names = families(metrics)
    ours = {n for n in names if n.startswith("reactantserver_worker_")}
    assert ours == IDENTITY
    assert any(n.startswith("process_") for n in names)
    assert any(n.startswith("python_gc_") for n in names)
    assert "python_info" in names
    samples = scrape(metrics)
    for sample in samples:
        assert sample.labels.get("worker") == "worker", sample
        assert "gpu" not in sample.labels
    info = named(samples, "reactantserver_worker_info")[0]
    assert info.value == 1
    assert info.labels == {
        "worker": "worker",
        "device_ordinal": "0",
        "backend": "cpu",
        "control_mode": "dynamic",
        "discipline": "fair",
        "residency_mode": "self_managed",
        "version": "1.2.3",
    }
    assert value(samples, "reactantserver_worker_max_concurrent_requests") == 64
    assert value(samples, "reactantserver_worker_models_loaded") == 0
    assert metrics.render().endswith(b"\n")
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_on_cuda_every_sample_carries_worker_and_gpu_once() -> None:
    config = attrs.evolve(
        WorkerConfig(worker_name="w1"),
        runtime=RuntimeConfig(backend=Backend.CUDA, device_ordinal=1),
        model_control_mode=ModelControlMode.EXPLICIT,
    )
    state = WorkerState(config, version="0.1.0")
    metrics = WorkerMetrics(state, environ={"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"})
    samples = scrape(metrics)
    assert samples
    for sample in samples:
        assert sample.labels["worker"] == "w1", sample
        assert sample.labels["gpu"] == "GPU-b", sample
    info = named(samples, "reactantserver_worker_info")[0].labels
    assert (info["backend"], info["device_ordinal"]) == ("cuda", "1")
    assert info["residency_mode"] == "externally_managed"
    assert info["control_mode"] == "explicit"


def test_cuda_with_every_device_hidden_has_no_gpu_label() -> None:
    config = attrs.evolve(WorkerConfig(), runtime=RuntimeConfig(backend=Backend.CUDA))
    metrics = WorkerMetrics(WorkerState(config, version="0"), environ={"CUDA_VISIBLE_DEVICES": ""})
    assert all("gpu" not in s.labels for s in scrape(metrics))


# -- requests --------------------------------------------------------------------------------


def test_requests_count_by_status_with_latency_buckets() -> None:
    state = WorkerState(WorkerConfig(), version="0")
    state.registry.put(ready("plain"))
    metrics = WorkerMetrics(state, environ={})
    assert metrics.observe_request == state.requests.observe
    state.requests.observe("plain", grpc.StatusCode.OK, 0.0015, 0, 0)
    state.requests.observe("plain", grpc.StatusCode.OK, 0.020, 0, 0)
    state.requests.observe("plain", grpc.StatusCode.INVALID_ARGUMENT, 100.0, 0, 0)
    samples = scrape(metrics)
    assert value(samples, "reactantserver_worker_requests_total", model="plain", status="OK") == 2
    assert (
        value(
            samples,
            "reactantserver_worker_requests_total",
            model="plain",
            status="INVALID_ARGUMENT",
        )
        == 1
    )
    buckets = named(samples, "reactantserver_worker_request_latency_seconds_bucket")
    bounds = [float(s.labels["le"]) for s in buckets]
    assert bounds == [*LATENCY_BUCKETS, float("inf")]
    assert bounds[0] == 0.001
    assert bounds[13] == pytest.approx(8.192)
    counts = {s.labels["le"]: s.value for s in buckets}
    assert counts["0.001"] == 0
    assert counts["0.002"] == 1
    assert counts["0.032"] == 2
    assert counts["8.192"] == 2
    assert counts["+Inf"] == 3
    assert value(samples, "reactantserver_worker_request_latency_seconds_count", model="plain") == 3
    assert value(
        samples, "reactantserver_worker_request_latency_seconds_sum", model="plain"
    ) == pytest.approx(100.0215)
    assert not [s for s in samples if s.name.endswith("_created")]


def test_unknown_models_create_no_series() -> None:
    state = WorkerState(WorkerConfig(), version="0")
    metrics = WorkerMetrics(state, environ={})
    metrics.observe_request("nope", grpc.StatusCode.NOT_FOUND, 0.001, 0, 0)
    samples = scrape(metrics)
    assert not named(samples, "reactantserver_worker_requests_total")
    assert not named(samples, "reactantserver_worker_request_latency_seconds_count")


def test_forget_model_removes_its_series_only() -> None:
    state = WorkerState(WorkerConfig(), version="0")
    state.registry.put(ready("a"))
    state.registry.put(ready("b"))
    metrics = WorkerMetrics(state, environ={})
    for model in ("a", "b"):
        metrics.observe_request(model, grpc.StatusCode.OK, 0.01, 0, 0)
    metrics.observe_request("a", grpc.StatusCode.UNAVAILABLE, 0.01, 0, 0)
    state.registry.remove("a")
    metrics.forget_model("a")
    metrics.forget_model("never-seen")
    metrics.observe_request("a", grpc.StatusCode.OK, 0.01, 0, 0)  # late: no longer registered
    samples = scrape(metrics)
    per_model = (
        "reactantserver_worker_requests_total",
        "reactantserver_worker_request_latency_seconds_count",
    )
    models = {s.labels["model"] for s in samples if s.name in per_model}
    assert models == {"b"}
    assert value(samples, "reactantserver_worker_requests_total", model="b", status="OK") == 1


# -- state -----------------------------------------------------------------------------------


def test_loads_and_limiter() -> None:
    config = attrs.evolve(WorkerConfig(), endpoints=attrs.evolve(WorkerConfig().endpoints))
    state = WorkerState(config, version="0")
    state.limiter.limit = 1
    assert state.limiter.try_acquire()
    assert not state.limiter.try_acquire()
    state.record_load("good", 1.25, ok=True)
    state.record_load("bad", 0.5, ok=False)
    state.record_load("bad", 0.75, ok=False)
    metrics = WorkerMetrics(state, environ={})
    samples = scrape(metrics)
    assert value(samples, "reactantserver_worker_inflight_requests") == 1
    assert value(samples, "reactantserver_worker_requests_shed_total") == 1
    assert value(samples, "reactantserver_worker_max_concurrent_requests") == 1
    assert value(samples, "reactantserver_worker_model_load_seconds", model="good") == 1.25
    assert value(samples, "reactantserver_worker_model_load_seconds", model="bad") == 0.75
    assert value(samples, "reactantserver_worker_model_load_failures_total", model="bad") == 2
    assert value(samples, "reactantserver_worker_model_load_failures_total", model="good") == 0
    state.forget_load("bad")
    assert {
        s.labels["model"]
        for s in named(scrape(metrics), "reactantserver_worker_model_load_seconds")
    } == {"good"}


def test_device_memory_pinned_weights_and_nvml(pool: concurrent.futures.ThreadPoolExecutor) -> None:
    state = WorkerState(cuda_config(), version="0")
    runtime = mock_runtime(state, pool, enabled=True, budget=BUDGET, bytes_limit=DEVICE_BYTES)
    state.runtime = runtime
    runtime.weights.add_model("pinned", FakeSource(size=1000), Residency.PINNED_DEVICE)
    runtime.weights.add_model("lazy", FakeSource(size=300), Residency.PINNED_SYSTEM)
    runtime.weights.add_model("unlisted", FakeSource(size=5), Residency.PINNED_DEVICE)
    runtime.weights.acquire("lazy")
    for name in ("pinned", "lazy"):
        state.registry.put(ready(name))
    fake = FakeNvml([FakeGpu("GPU-a", processes=[(os.getpid(), (1 << 20) + 7)])])
    with nvml_metrics(state, fake) as metrics:
        _device_memory_pinned_weights(metrics, runtime)


def _device_memory_pinned_weights(metrics: WorkerMetrics, runtime: Runtime) -> None:
    samples = scrape(metrics)
    assert value(samples, "reactantserver_worker_model_pinned", model="pinned") == 1
    assert value(samples, "reactantserver_worker_model_resident", model="pinned") == 1
    assert value(samples, "reactantserver_worker_model_weight_bytes", model="pinned") == 1000
    assert value(samples, "reactantserver_worker_model_pinned", model="lazy") == 0
    assert value(samples, "reactantserver_worker_model_resident", model="lazy") == 1
    assert not [s for s in samples if s.labels.get("model") == "unlisted"]
    assert value(samples, "reactantserver_worker_models_resident") == 3
    assert value(samples, "reactantserver_worker_models_loaded") == 2
    assert value(samples, "reactantserver_worker_resident_weight_bytes") == 1305
    assert value(samples, "reactantserver_worker_weight_cache_resident_bytes") == 300
    assert value(samples, "reactantserver_worker_weight_cache_pinned_bytes") == 1005
    assert value(samples, "reactantserver_worker_weight_cache_max_bytes") == 4096
    assert value(samples, "reactantserver_worker_weight_loads_total") == 3
    assert value(samples, "reactantserver_worker_weight_load_bytes_total") == 1305
    assert value(samples, "reactantserver_worker_device_memory_limit_bytes") == 1 << 20
    assert value(samples, "reactantserver_worker_device_memory_in_use_bytes") == 1305
    assert value(samples, "reactantserver_worker_device_memory_free_bytes") == (1 << 20) - 1305
    assert value(samples, "reactantserver_worker_device_memory_peak_in_use_bytes") >= 1305
    assert value(samples, "reactantserver_worker_device_memory_pool_bytes") == 0
    assert value(samples, "reactantserver_worker_device_memory_process_used_bytes") == (1 << 20) + 7
    assert value(samples, "reactantserver_worker_device_memory_out_of_pool_bytes") == 7
    assert value(samples, "reactantserver_worker_executable_cache_hits_total") == 0
    assert value(samples, "reactantserver_worker_executable_cache_misses_total") == 0
    names = families(metrics)
    assert "reactantserver_worker_weight_cache_max_scratch_bytes" not in names  # no solved budget
    runtime.weights.set_budget_policy(BudgetPolicy(arena=1 << 20, fraction=0.5, wiggle=0.1))
    solved = runtime.weights.budget_solution
    assert solved is not None
    samples = scrape(metrics)
    assert value(samples, "reactantserver_worker_weight_pool_bytes") == solved.weight_pool
    assert (
        value(samples, "reactantserver_worker_weight_cache_max_scratch_bytes") == solved.max_scratch
    )


def test_without_the_cache_or_device_stats_those_series_are_absent(
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    state = WorkerState(WorkerConfig(), version="0")
    state.runtime = mock_runtime(state, pool, enabled=False, budget=BUDGET)
    state.runtime.weights.add_model("m", FakeSource(size=64), Residency.UNPINNED)
    state.registry.put(ready("m"))
    metrics = WorkerMetrics(state, environ={})
    names = families(metrics)
    assert not [n for n in names if n.startswith("reactantserver_worker_weight_cache_")]
    assert not [n for n in names if n.startswith("reactantserver_worker_device_memory_")]
    assert "reactantserver_worker_weight_pool_bytes" not in names
    samples = scrape(metrics)
    assert value(samples, "reactantserver_worker_model_resident", model="m") == 1
    assert value(samples, "reactantserver_worker_weight_loads_total") == 1


# -- NVML ------------------------------------------------------------------------------------


def gpu_families(metrics: WorkerMetrics) -> set[str]:
    """The ``reactantserver_worker_gpu_*`` families of one rendering."""
    return {n for n in families(metrics) if n.startswith("reactantserver_worker_gpu_")}


def test_gpu_families_of_the_workers_device() -> None:
    state = WorkerState(attrs.evolve(cuda_config(device_ordinal=1), worker_name="w1"), version="0")
    fake = FakeNvml(
        [
            FakeGpu("GPU-0000", utilization_percent=1),
            FakeGpu("GPU-1111"),
            FakeGpu("GPU-2222", utilization_percent=75, memory_used=12 << 30),
        ]
    )
    with nvml_metrics(state, fake, {"CUDA_VISIBLE_DEVICES": "0,2"}) as metrics:
        samples = scrape(metrics)
        text = metrics.render().decode()
    labels = {"worker": "w1", "gpu": "2", "gpu_uuid": "GPU-2222"}
    assert value(samples, "reactantserver_worker_gpu_utilization", **labels) == 0.75
    assert value(samples, "reactantserver_worker_gpu_memory_used_bytes", **labels) == 12 << 30
    assert value(samples, "reactantserver_worker_gpu_memory_total_bytes", **labels) == 80 << 30
    assert value(samples, "reactantserver_worker_gpu_power_usage_watts", **labels) == 312.5
    assert value(samples, "reactantserver_worker_gpu_power_limit_watts", **labels) == 700
    assert value(samples, "reactantserver_worker_gpu_energy_joules_total", **labels) == 9876.543
    assert "# TYPE reactantserver_worker_gpu_energy_joules_total counter" in text
    assert "# TYPE reactantserver_worker_gpu_utilization gauge" in text
    gpu_samples = [s for s in samples if s.name.startswith("reactantserver_worker_gpu_")]
    assert len(gpu_samples) == len(GPU_FAMILIES)
    assert all(s.labels == labels for s in gpu_samples)
    # No runtime yet: the process's device memory comes with the allocator's series only.
    assert "reactantserver_worker_device_memory_process_used_bytes" not in families(metrics)


def test_no_nvml_on_cpu_or_without_a_device() -> None:
    cpu = WorkerMetrics(WorkerState(WorkerConfig(), version="0"), environ={}, nvml=must_not_load)
    assert cpu.gpu is None
    assert not gpu_families(cpu)
    hidden = WorkerMetrics(
        WorkerState(cuda_config(), version="0"),
        environ={"CUDA_VISIBLE_DEVICES": ""},
        nvml=must_not_load,
    )
    assert hidden.gpu is None
    assert not gpu_families(hidden)
    cpu.close()
    hidden.close()


def test_cuda_without_a_driver_has_no_gpu_families() -> None:
    fake = FakeNvml([FakeGpu("GPU-a")], init_fails=True)
    metrics = WorkerMetrics(WorkerState(cuda_config(), version="0"), environ={}, nvml=lambda: fake)
    try:
        assert metrics.gpu is not None
        assert metrics.gpu.refresh() is None
        assert not gpu_families(metrics)
        assert "reactantserver_worker_info" in families(metrics)
    finally:
        metrics.close()


def test_an_nvml_error_mid_run_drops_the_samples_not_the_scrape(
    pool: concurrent.futures.ThreadPoolExecutor,
) -> None:
    state = WorkerState(cuda_config(), version="0")
    state.runtime = mock_runtime(state, pool, enabled=True, budget=BUDGET, bytes_limit=DEVICE_BYTES)
    fake = FakeNvml([FakeGpu("GPU-a", processes=[(os.getpid(), 1 << 30)])])
    process_used = "reactantserver_worker_device_memory_process_used_bytes"
    with nvml_metrics(state, fake) as metrics:
        assert metrics.gpu is not None
        assert gpu_families(metrics) == set(GPU_FAMILIES) - {
            "reactantserver_worker_gpu_energy_joules_total"
        } | {"reactantserver_worker_gpu_energy_joules"}
        assert process_used in families(metrics)
        fake.failing = {"nvmlDeviceGetPowerUsage"}  # e.g. NOT_SUPPORTED on this board
        metrics.gpu.refresh()
        assert "reactantserver_worker_gpu_power_usage_watts" not in gpu_families(metrics)
        assert "reactantserver_worker_gpu_power_limit_watts" in gpu_families(metrics)
        fake.failing = set(READINGS)  # the device is lost
        metrics.gpu.refresh()
        names = families(metrics)
        assert not gpu_families(metrics)
        assert process_used not in names
        assert "reactantserver_worker_device_memory_in_use_bytes" in names  # the rest is there
        assert "reactantserver_worker_info" in names
        fake.failing = set()
        metrics.gpu.refresh()
        assert len(gpu_families(metrics)) == len(GPU_FAMILIES)


def test_a_hung_driver_does_not_slow_the_scrape() -> None:
    fake = FakeNvml([FakeGpu("GPU-a")])
    with nvml_metrics(WorkerState(cuda_config(), version="0"), fake) as metrics:
        assert metrics.gpu is not None
        fake.running.clear()  # every NVML read blocks from now on
        metrics.gpu.refresh(timeout_s=0.1)
        started = time.perf_counter()
        for _ in range(10):
            assert len(gpu_families(metrics)) == len(GPU_FAMILIES)  # the last fresh sample
        assert (time.perf_counter() - started) / 10 < 0.1
        fake.running.set()


# -- a real runtime --------------------------------------------------------------------------


@pytest.fixture
def live(make_bundle: BundleMaker, tmp_path: Path) -> Iterator[WorkerState]:
    """A worker state over one compiled jax bundle ("plain", sizes 1 and 4), scheduler running."""
    bundle = make_bundle(
        "plain", _scale, inputs=[X], outputs=[Y], weights=[("w", W)], batch_sizes=[1, 4]
    )
    config = world_config(tmp_path / "cache", budget=1 << 20, worker_name="w0")
    world = start_world(config, [bundle], version="0.1.0")
    world.state.registry.put(ModelEntry.loading("compiling"))
    try:
        yield world.state
    finally:
        world.close()


def test_scheduler_and_runtime_series_after_real_requests(live: WorkerState) -> None:
    metrics = WorkerMetrics(live, environ={"CUDA_VISIBLE_DEVICES": ""})
    runtime = live.runtime
    assert runtime is not None

    async def serve() -> None:
        requests = [
            InferRequest(
                model_name="plain", inputs=[NamedTensor("x", np.full((rows, 2), rows, np.float32))]
            )
            for rows in (1, 2, 3)
        ]
        for request in requests:
            await runtime.dataplane.infer(request)
            live.requests.observe("plain", grpc.StatusCode.OK, 0.004, 0, 0)

    asyncio.run(serve())
    samples = scrape(metrics)
    for sample in samples:
        assert sample.labels["worker"] == "w0"
        assert "gpu" not in sample.labels
    plain = {"model": "plain"}
    assert value(samples, "reactantserver_worker_requests_total", status="OK", **plain) == 3
    assert value(samples, "reactantserver_worker_dispatch_total", **plain) == 3
    assert value(samples, "reactantserver_worker_requests_served_total", **plain) == 3
    assert value(samples, "reactantserver_worker_rows_served_total", **plain) == 6
    assert value(samples, "reactantserver_worker_requests_cancelled_total", **plain) == 0
    assert value(samples, "reactantserver_worker_compute_seconds_total", **plain) > 0
    assert (
        value(samples, "reactantserver_worker_batch_dispatch_total", batch_size="1", **plain) == 1
    )
    assert (
        value(samples, "reactantserver_worker_batch_dispatch_total", batch_size="4", **plain) == 2
    )
    assert value(samples, "reactantserver_worker_queue_depth", **plain) == 0
    # Histograms (aggregatable), not quantile gauges: 3 queue waits, 3 executions each split
    # into input, infer and output.
    assert value(samples, "reactantserver_worker_queue_wait_seconds_count", **plain) == 3
    assert (
        value(samples, "reactantserver_worker_queue_wait_seconds_bucket", le="+Inf", **plain) == 3
    )
    assert value(samples, "reactantserver_worker_queue_wait_seconds_sum", **plain) >= 0
    for stage in ("input", "infer", "output"):
        assert value(samples, f"reactantserver_worker_compute_{stage}_seconds_count", **plain) == 3
    assert value(samples, "reactantserver_worker_compute_infer_seconds_sum", **plain) > 0
    buckets = [
        s.value
        for s in named(samples, "reactantserver_worker_compute_infer_seconds_bucket")
        if s.labels["model"] == "plain"
    ]
    assert buckets == sorted(buckets)
    assert buckets[-1] == 3
    assert value(samples, "reactantserver_worker_model_max_batch_size", **plain) == 4
    assert value(samples, "reactantserver_worker_model_resident", **plain) == 1
    assert value(samples, "reactantserver_worker_model_pinned", **plain) == 0
    assert value(samples, "reactantserver_worker_model_weight_bytes", **plain) == W.nbytes
    assert value(samples, "reactantserver_worker_weight_loads_total") == 1
    assert value(samples, "reactantserver_worker_weight_cache_resident_bytes") == W.nbytes
    assert value(samples, "reactantserver_worker_models_loaded") == 1  # "compiling" is not READY
    assert value(samples, "reactantserver_worker_executable_cache_misses_total") == 2
    assert value(samples, "reactantserver_worker_executable_cache_hits_total") == 0
    assert value(samples, "reactantserver_worker_inflight_requests") == 0
    info = named(samples, "reactantserver_worker_info")[0].labels
    assert (info["backend"], info["version"]) == ("cpu", "0.1.0")
    names = families(metrics)
    assert not [
        n for n in names if n.startswith("reactantserver_worker_device_memory_")
    ]  # CPU, no NVML
    assert value(samples, "reactantserver_worker_meta_gate_in_use") == 0
    assert value(samples, "reactantserver_worker_meta_gate_waiting") == 0


def test_unloaded_models_lose_their_per_model_series(live: WorkerState) -> None:
    metrics = WorkerMetrics(live, environ={})
    runtime = live.runtime
    assert runtime is not None
    request = InferRequest(
        model_name="plain", inputs=[NamedTensor("x", np.ones((1, 2), np.float32))]
    )
    asyncio.run(runtime.dataplane.infer(request))
    live.requests.observe("plain", grpc.StatusCode.OK, 0.001, 0, 0)
    live.registry.remove("plain")
    metrics.forget_model("plain")
    samples = scrape(metrics)
    assert not [s for s in samples if s.labels.get("model") == "plain"]
    assert value(samples, "reactantserver_worker_models_resident") == 1  # the device still holds it
    assert value(samples, "reactantserver_worker_weight_loads_total") == 1
