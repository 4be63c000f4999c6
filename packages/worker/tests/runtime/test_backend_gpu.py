"""The GPU code paths on a real device: page-locked floors, overlapped prefetch, shared arenas.

Marked ``gpu``: skipped unless ``REACTANT_TEST_PLATFORM`` names a platform. ``bench/gpu/run.sh``
runs them on ``cuda`` on the GPU machine and on ``cpu`` in its dry run (which checks they
still run; the device-only assertions are skipped there). Correctness only, never timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from packages.worker.tests.conftest import Tensor, export_module
from reactantserver.worker.runtime import CompileSpec, Residency, WeightCache
from reactantserver.worker.runtime.jax_backend import PINNED_HOST, JaxBackend
from reactantserver.worker.runtime.page_locked import PageLockedSource

pytestmark = pytest.mark.gpu

Array = np.ndarray[Any, Any]
X = Tensor("x", "f32", "nk", {"k": 64})
Y = Tensor("y", "f32", "nk", {"k": 32})


def _dense(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    return jax.numpy.tanh(x @ w + b)


def _weights(seed: int) -> list[tuple[str, Array]]:
    rng = np.random.default_rng(seed)
    return [
        ("w", rng.standard_normal((64, 32), dtype=np.float32) / 8),
        ("b", rng.standard_normal(32, dtype=np.float32)),
    ]


def _expected(x: Array, weights: list[tuple[str, Array]]) -> Array:
    (_, w), (_, b) = weights
    out: Array = np.tanh(x @ w + b)
    return out


class _Arrays:
    """An in-memory weight source (its floor "kept" by a flag)."""

    def __init__(self, arrays: Sequence[Array]) -> None:
        self.arrays, self.kept = list(arrays), False

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    @property
    def host_resident(self) -> bool:
        return self.kept

    def load(self) -> Sequence[Array]:
        return self.arrays

    def keep_host(self) -> None:
        self.kept = True

    def drop_host(self) -> None:
        self.kept = False


@pytest.fixture(scope="module")
def backend(gpu_platform: str) -> JaxBackend:
    return JaxBackend(gpu_platform)


@pytest.fixture(scope="module")
def module(gpu_platform: str) -> bytes:
    return export_module(_dense, [X], _weights(0), 4, platform=gpu_platform)


def test_capabilities(backend: JaxBackend, gpu_platform: str) -> None:
    if gpu_platform == "cpu":
        assert not backend.async_transfers
        assert backend.memory_stats() is None
        return
    assert backend.async_transfers
    assert PINNED_HOST in backend.memory_kinds, backend.memory_kinds
    assert backend.page_locked_host  # the default on a GPU with a pinned_host space
    stats = backend.memory_stats()
    assert stats is not None
    assert stats.bytes_limit > 0


def test_compile_serialise_execute_on_the_device(backend: JaxBackend, module: bytes) -> None:
    exe = backend.compile(module, CompileSpec(autotune=False))
    again = backend.deserialize(backend.serialize(exe), CompileSpec(autotune=False))
    x = np.random.default_rng(1).standard_normal((4, 64), dtype=np.float32)
    weights = backend.to_device_many([w for _, w in _weights(0)])
    (out,) = backend.execute(again, [backend.to_device(x), *weights])
    np.testing.assert_allclose(backend.to_host(out), _expected(x, _weights(0)), atol=2e-3)


def test_page_locked_floor_round_trip(gpu_platform: str) -> None:
    backend = JaxBackend(gpu_platform, page_locked=True)
    if not backend.page_locked_host:
        pytest.skip(f"no {PINNED_HOST} memory space on this {gpu_platform} client")
    arrays = [w for _, w in _weights(2)] + [np.arange(1 << 20, dtype=np.float32)]
    source = PageLockedSource(_Arrays(arrays), backend)
    source.keep_host()
    assert source.page_locked
    buffers = backend.to_device_many(source.load(), wait=False)
    backend.wait(buffers)
    for buf, expected in zip(buffers, arrays, strict=True):
        np.testing.assert_array_equal(backend.to_host(buf), expected)
        backend.free(buf)
    source.drop_host()


def test_prefetch_overlaps_an_execution(gpu_platform: str, module: bytes) -> None:
    backend = JaxBackend(gpu_platform)
    exe = backend.compile(module, CompileSpec(autotune=False))
    models = {"a": _weights(3), "b": _weights(4)}
    nbytes = sum(w.nbytes for _, w in models["a"])
    cache = WeightCache(backend, budget=2 * nbytes)
    for name, weights in models.items():
        inner = _Arrays([w for _, w in weights])
        source = PageLockedSource(inner, backend) if backend.page_locked_host else inner
        cache.add_model(name, source, Residency.PINNED_SYSTEM)
    x = np.random.default_rng(5).standard_normal((4, 64), dtype=np.float32)
    outputs = backend.execute(exe, [backend.to_device(x), *cache.acquire("a")], wait=False)
    started = cache.prefetch("b", keep="a")
    backend.wait(outputs)
    assert started is backend.async_transfers
    np.testing.assert_allclose(backend.to_host(outputs[0]), _expected(x, models["a"]), atol=2e-3)
    (out,) = backend.execute(exe, [backend.to_device(x), *cache.acquire("b")])
    np.testing.assert_allclose(backend.to_host(out), _expected(x, models["b"]), atol=2e-3)
    assert cache.prefetch_hits == int(started)
    assert cache.loads == 2


def test_eviction_gives_the_device_memory_back(gpu_platform: str) -> None:
    if gpu_platform == "cpu":
        pytest.skip("the CPU client keeps no allocator statistics")
    backend = JaxBackend(gpu_platform)
    arrays = [np.ones(1 << 22, np.float32) for _ in range(8)]  # 128 MiB
    cache = WeightCache(backend, budget=1 << 30)
    cache.add_model("m", _Arrays(arrays), Residency.PINNED_SYSTEM)

    def in_use() -> int:
        stats = backend.memory_stats()
        assert stats is not None
        return stats.bytes_in_use

    before = in_use()
    cache.acquire("m")
    loaded = in_use() - before
    assert loaded >= 128 << 20
    cache.evict_unpinned()
    assert in_use() - before <= loaded // 100


_SHARE = """
import json, os, sys
from reactantserver.core.config import Backend, RuntimeConfig
from reactantserver.worker.runtime.xla_env import apply_xla_environment
apply_xla_environment(RuntimeConfig(backend=Backend.CUDA, mem_fraction=float(sys.argv[1]),
                                    preallocate=True), os.environ)
from reactantserver.worker.runtime.jax_backend import JaxBackend
backend = JaxBackend("cuda")
stats = backend.memory_stats()
print(json.dumps({"limit": stats.bytes_limit, "in_use": stats.bytes_in_use}), flush=True)
sys.stdin.read()  # hold the arena until the test has seen both processes up
"""


def test_workers_share_the_device_with_split_arenas(gpu_platform: str) -> None:
    """Two processes configured like two workers of one GPU (0.2 each, preallocated) both
    start, and each allocator is capped at its share of the device."""
    if gpu_platform == "cpu":
        pytest.skip("the CPU client has no device arena")
    pynvml = pytest.importorskip("pynvml")
    pynvml.nvmlInit()
    try:
        total = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    finally:
        pynvml.nvmlShutdown()
    env = {k: v for k, v in os.environ.items() if not k.startswith("XLA_PYTHON_CLIENT_")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SHARE, "0.2"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    try:
        limits = []
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else "no output"
            limits.append(json.loads(line)["limit"])
    finally:
        for proc in procs:
            proc.communicate(input="", timeout=60)
    for limit in limits:
        assert 0.15 * total <= limit <= 0.21 * total, (limit, total)


def test_a_worker_serves_on_the_device(gpu_platform: str, tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient

    bundle = tmp_path / "models" / "dense"
    bundle.mkdir(parents=True)
    weights = _weights(6)
    for batch in (1, 4):
        module = export_module(_dense, [X], weights, batch, platform=gpu_platform)
        (bundle / f"model.b{batch}.mlir").write_bytes(module)
    save_file(
        dict(weights),
        str(bundle / "weights.safetensors"),
        metadata={"argument_order": json.dumps([n for n, _ in weights])},
    )
    manifest = {
        "format_version": "3.0",
        "executable_inputs": [X.entry()],
        "executable_outputs": [Y.entry()],
        "batching": {"compiled_batch_sizes": [1, 4]},
    }
    (bundle / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    port = _free_port()
    env = dict(os.environ)
    env.update(
        REACTANTSERVER_WORKER_RUNTIME_BACKEND=gpu_platform,
        REACTANTSERVER_WORKER_RUNTIME_ALLOW_CPU_FALLBACK="false",
        REACTANTSERVER_WORKER_RUNTIME_MEM_FRACTION="0.2",
        REACTANTSERVER_WORKER_MODEL_CONTROL_MODE="static",
        REACTANTSERVER_WORKER_ENDPOINTS_PORT=str(port),
        REACTANTSERVER_WORKER_CACHE_DIR=str(tmp_path / "cache"),
    )
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reactantserver.worker", "--model-repo", str(bundle.parent)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        _wait_ready(client, proc, tmp_path / "worker.log")
        x = np.random.default_rng(7).standard_normal((3, 64), dtype=np.float32)
        tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        got = client.infer("dense", [tensor]).as_numpy("y")
        np.testing.assert_allclose(got, _expected(x, weights), atol=2e-3)
    finally:
        client.close()
        proc.terminate()
        assert proc.wait(timeout=60) == 0
        log.close()
    if gpu_platform == "cuda":
        text = (tmp_path / "worker.log").read_text()
        assert "platform=cuda" in text
        assert "host_floors=page-locked" in text


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_ready(client: Any, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-4000:]
        try:
            if client.is_server_ready(client_timeout=2.0):
                return
        except Exception:  # not listening yet
            pass
        time.sleep(0.2)
    raise AssertionError(f"worker not ready in time:\n{log.read_text()[-4000:]}")
