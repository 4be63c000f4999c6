"""Host floors in page-locked memory (``runtime._page_locked``): the wrapper and its fallbacks.

The logic runs on the MockBackend claiming page-locked memory; the real path runs on the jax
CPU client with page-locking forced (it lists a ``pinned_host`` memory space), through the
weight cache, so a load reads from the page-locked copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from packages.worker.tests._fake_source import SIZE, FakeSource
from reactantserver.core.dtypes import DType
from reactantserver.core.weights import PrivateWeightStore, WeightSpec
from reactantserver.worker.runtime.device_setup import floor_kind
from reactantserver.worker.runtime.jax_backend import PINNED_HOST, JaxBackend
from reactantserver.worker.runtime.page_locked import PageLockedSource, floor_source
from reactantserver.worker.runtime.residency import Residency
from reactantserver.worker.runtime.weight_cache import StoreWeightSource, WeightCache
from reactantserver.worker.testing import MockBackend, MockBuffer

Array = np.ndarray[Any, Any]


def test_floor_source_wraps_only_private_floors_on_a_page_locking_backend() -> None:
    source = FakeSource(1)
    locking = MockBackend(page_locked_host=True)
    wrapped = floor_source(source, locking, page_locked=True, shared=False)
    assert isinstance(wrapped, PageLockedSource)
    assert floor_source(source, locking, page_locked=False, shared=False) is source
    assert floor_source(source, locking, page_locked=True, shared=True) is source
    assert floor_source(source, MockBackend(), page_locked=True, shared=False) is source


def test_floor_kind_says_why() -> None:
    locking = MockBackend(page_locked_host=True)
    assert floor_kind(True, False, locking) == "page-locked"
    assert floor_kind(True, True, locking) == "shared-pageable"
    assert floor_kind(False, False, locking) == "pageable"
    assert floor_kind(True, False, MockBackend()).startswith("pageable (no page-locked")


def test_keep_host_locks_one_copy_and_loads_from_it() -> None:
    backend = MockBackend(page_locked_host=True)
    inner = FakeSource(7, parts=2)
    source = PageLockedSource(inner, backend, name="m")
    assert not source.host_resident
    source.keep_host()
    source.keep_host()  # idempotent
    assert source.host_resident
    assert source.page_locked
    assert backend.page_locks == 2
    assert inner.reads == 1
    assert inner.floor is None  # the pageable read is dropped: one host copy
    loaded = source.load()
    assert all(isinstance(b, MockBuffer) and b.host for b in loaded)
    assert source.nbytes == SIZE
    source.drop_host()
    assert not source.host_resident
    assert backend.page_unlocks == 2
    assert all(b.is_deleted() for b in loaded)


def test_without_a_floor_loads_read_through() -> None:
    backend = MockBackend(page_locked_host=True)
    inner = FakeSource(3)
    source = PageLockedSource(inner, backend)
    (array,) = source.load()
    assert isinstance(array, np.ndarray)
    assert int(array[0]) == 3
    assert inner.reads == 1
    assert backend.page_locks == 0


class _RefusingBackend(MockBackend):
    """Page-locks the first array, then runs out of pinned memory."""

    def page_lock(self, host: Array) -> MockBuffer:
        if self.page_locks:
            raise RuntimeError("RESOURCE_EXHAUSTED: cannot allocate pinned host memory")
        return super().page_lock(host)


def test_failed_page_lock_falls_back_to_a_pageable_floor(caplog: pytest.LogCaptureFixture) -> None:
    backend = _RefusingBackend(page_locked_host=True)
    inner = FakeSource(5, parts=2)
    source = PageLockedSource(inner, backend, name="big")
    source.keep_host()
    assert "cannot page-lock the host weights of 'big'" in caplog.text
    assert backend.page_unlocks == 1  # the one it did lock is given back
    assert source.host_resident
    assert not source.page_locked
    assert inner.floor is not None
    assert source.load() is inner.floor
    source.drop_host()
    assert inner.floor is None


def test_weight_cache_loads_from_page_locked_floors() -> None:
    backend = MockBackend(page_locked_host=True)
    cache = WeightCache(backend, budget=SIZE)
    cache.add_model("a", PageLockedSource(FakeSource(1), backend), Residency.PINNED_SYSTEM)
    cache.add_model("b", PageLockedSource(FakeSource(2), backend), Residency.PINNED_SYSTEM)
    for name in "abab":
        (buf,) = cache.acquire(name)
        assert int(backend.to_host(buf)[0]) == (1 if name == "a" else 2)
    assert backend.pinned_transfers == 4
    cache.remove_model("a")
    assert backend.page_unlocks == 1


def test_real_page_locked_floor_on_the_cpu_client() -> None:
    backend = JaxBackend("cpu", page_locked=True)
    if PINNED_HOST not in backend.memory_kinds:
        pytest.skip(f"this jax CPU client has no {PINNED_HOST} memory space")
    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.full(5, 2.5, np.float32)]
    specs = [WeightSpec(f"w{i}", DType.F32, a.shape) for i, a in enumerate(arrays)]

    def fill(out: list[Array]) -> None:
        for target, value in zip(out, arrays, strict=True):
            target[...] = value

    inner = StoreWeightSource(PrivateWeightStore(), "m", 1, specs, fill)
    source = floor_source(inner, backend, page_locked=True, shared=False)
    cache = WeightCache(backend, budget=10_000)
    cache.add_model("m", source, Residency.PINNED_SYSTEM)
    assert isinstance(source, PageLockedSource)
    assert source.page_locked
    assert not inner.host_resident  # the store keeps no second copy
    buffers = cache.acquire("m")
    for buf, expected in zip(buffers, arrays, strict=True):
        np.testing.assert_array_equal(backend.to_host(buf), expected)
    cache.remove_model("m")
    assert not source.host_resident
