"""The CPU arena: weight loads on the CPU backend that are real copies with real costs.

Without it a CPU "load" aliases host memory and costs nothing, so the weight cache cannot be
measured there (issue 37). These tests hold the arena to what it promises: copies, not
aliases; bytes charged at a load and returned at an eviction or collection; a load beyond the
capacity fails as a device out-of-memory does; a bandwidth makes a load last at least
``bytes / bandwidth``; and the weight cache runs on it unchanged, its resident bytes equal to
the arena's bytes in use.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np
import pytest

from reactantserver.core.config import Backend as BackendName
from reactantserver.core.config import RuntimeConfig, WorkerConfig
from reactantserver.core.dtypes import DType
from reactantserver.core.weights import PrivateWeightStore, WeightSpec
from reactantserver.worker.runtime import is_device_oom
from reactantserver.worker.runtime._cpu_arena import ALIGNMENT, ArenaBook, Block
from reactantserver.worker.runtime.backend import CpuArena
from reactantserver.worker.runtime.device_setup import BackendStartError, cpu_arena, create_backend
from reactantserver.worker.runtime.jax_backend import JaxBackend
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.runtime.weight_cache import StoreWeightSource, WeightCache

Array = np.ndarray[Any, Any]
MIB = 1 << 20


def _host(nbytes: int, seed: int = 0) -> Array:
    return np.random.default_rng(seed).standard_normal(nbytes // 4, dtype=np.float32)


def test_a_load_is_a_copy_charged_to_the_arena_and_returned_when_freed() -> None:
    backend = JaxBackend("cpu", cpu_arena=CpuArena(8 * MIB))
    hosts = [_host(MIB, 1), _host(2 * MIB, 2)]
    buffers = backend.to_device_many(hosts)
    for host, buf in zip(hosts, buffers, strict=True):
        assert buf.unsafe_buffer_pointer() != host.ctypes.data, "an alias, not a copy"
        np.testing.assert_array_equal(backend.to_host(buf), host)
    backend.to_device(hosts[0])  # a request input: not the arena's, not charged
    stats = backend.memory_stats()
    assert stats is not None
    assert (stats.bytes_in_use, stats.bytes_limit) == (3 * MIB, 8 * MIB)
    backend.free(buffers[0])
    backend.free(buffers[0])  # idempotent: returned once
    assert backend.memory_stats().bytes_in_use == 2 * MIB  # type: ignore[union-attr]
    del buffers, buf
    gc.collect()  # a buffer dropped without free() is returned when collected
    stats = backend.memory_stats()
    assert stats is not None
    assert (stats.bytes_in_use, stats.peak_bytes_in_use) == (0, 3 * MIB)


def test_a_load_lands_in_the_arena_slab_and_a_freed_block_is_reused() -> None:
    # Weights live in memory the arena reserved (as a device allocator's blocks), not in fresh
    # pages per load: an evicted model's block takes the next load without a page fault.
    backend = JaxBackend("cpu", cpu_arena=CpuArena(4 * MIB))
    (first,) = backend.to_device_many([_host(2 * MIB, 1)])
    address = first.unsafe_buffer_pointer()
    assert address % ALIGNMENT == 0
    backend.free(first)
    (second,) = backend.to_device_many([_host(2 * MIB, 2)])
    assert second.unsafe_buffer_pointer() == address
    np.testing.assert_array_equal(backend.to_host(second), _host(2 * MIB, 2))


def test_arena_blocks_are_first_fit_aligned_and_merge_when_freed() -> None:
    book = ArenaBook(CpuArena(1024))
    a, b, c = (book.allocate(n) for n in (100, 200, 64))
    assert [(x.offset, x.size) for x in (a, b, c)] == [(0, 128), (128, 256), (384, 64)]
    assert book.in_use == book.peak == 448
    book.free(a)
    book.free(c)
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        book.allocate(1024 - 256 + 1)  # fits in the bytes free, not in one block
    book.free(b)
    assert book.in_use == 0
    assert book.allocate(1024) == Block(0, 1024)  # the three merged into one


def test_a_load_beyond_the_capacity_is_a_device_oom_and_charges_nothing() -> None:
    backend = JaxBackend("cpu", cpu_arena=CpuArena(4 * MIB))
    kept = backend.to_device_many([_host(3 * MIB)])
    with pytest.raises(RuntimeError) as caught:
        backend.to_device_many([_host(MIB // 2), _host(MIB)])
    assert is_device_oom(caught.value), caught.value
    assert backend.memory_stats().bytes_in_use == 3 * MIB  # type: ignore[union-attr]
    backend.free(kept[0])
    assert len(backend.to_device_many([_host(MIB // 2), _host(MIB)])) == 2


def test_a_bandwidth_makes_a_load_last_at_least_bytes_over_bandwidth() -> None:
    bandwidth = 50 * MIB  # bytes/s: 4 MiB take at least 80 ms
    backend = JaxBackend("cpu", cpu_arena=CpuArena(16 * MIB, float(bandwidth)))
    start = time.perf_counter()
    backend.to_device_many([_host(2 * MIB), _host(2 * MIB)])
    assert time.perf_counter() - start >= 4 * MIB / bandwidth
    assert CpuArena(MIB, 25e9).describe() == (f"CPU arena of {MIB} bytes, loads capped at 25 GB/s")


def test_arena_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="capacity"):
        CpuArena(0)
    with pytest.raises(ValueError, match="bandwidth"):
        CpuArena(MIB, -1.0)
    with pytest.raises(ValueError, match="CPU-backend option"):
        JaxBackend("cuda", cpu_arena=CpuArena(MIB))


def test_the_weight_cache_runs_on_the_arena_and_its_evictions_free_memory() -> None:
    backend = JaxBackend("cpu", cpu_arena=CpuArena(4 * MIB))
    cache = WeightCache(backend, budget=MIB)
    store = PrivateWeightStore()
    arrays = {name: _host(MIB, seed) for seed, name in enumerate("ABC")}

    def source(name: str) -> StoreWeightSource:
        def fill(out: list[Array]) -> None:
            out[0][...] = arrays[name]

        spec = [WeightSpec("w", DType.F32, (MIB // 4,))]
        return StoreWeightSource(store, name, hash(name), spec, fill)

    for name in "ABC":
        cache.add_model(name, source(name), Residency.PINNED_SYSTEM)
    for name in "ABCA":
        (weights,) = cache.acquire(name)
        np.testing.assert_array_equal(backend.to_host(weights), arrays[name])
        stats = backend.memory_stats()
        assert stats is not None
        assert stats.bytes_in_use == cache.resident_bytes == MIB
    assert (cache.loads, cache.evictions) == (4, 3)


def test_the_worker_config_turns_the_arena_on_for_the_cpu_backend_only() -> None:
    assert cpu_arena(WorkerConfig()) is None
    config = WorkerConfig(
        runtime=RuntimeConfig(cpu_arena_bytes=64 * MIB, cpu_arena_bandwidth_bytes_per_s=25e9)
    )
    assert cpu_arena(config) == CpuArena(64 * MIB, 25e9)
    backend, platform, _ = create_backend(config)
    assert platform == "cpu"
    stats = backend.memory_stats()
    assert stats is not None
    assert stats.bytes_limit == 64 * MIB
    cuda = WorkerConfig(runtime=RuntimeConfig(backend=BackendName.CUDA, cpu_arena_bytes=64 * MIB))
    with pytest.raises(BackendStartError, match="cpu backend only"):
        create_backend(cuda)
