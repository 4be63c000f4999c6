"""StagingPool, StagingSlot and pool_of: naming, /dev/shm backing, carving."""

from __future__ import annotations

import inspect
import os
import re
import stat
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from reactantserver import client
from reactantserver.client import StagingPool, StagingSlot
from reactantserver.client._staging import (
    DEFAULT_POOL_BYTES,
    DEFAULT_POOL_SLOTS,
    live_pools,
    pool_of,
)
from reactantserver.core.buffer_pool import BufferPool

SHM = Path("/dev/shm")


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    client.shutdown()
    left = sorted(SHM.glob(f"reactantserver-client-{os.getpid()}-*"))
    assert not left, f"staging pools left behind: {left}"


@pytest.fixture
def pool() -> Iterator[StagingPool]:
    with closing(StagingPool(8 * 1024, 8)) as p:
        yield p


def test_defaults_are_the_spec() -> None:
    signature = inspect.signature(StagingPool)
    assert signature.parameters["nbytes"].default == DEFAULT_POOL_BYTES == 256 * 1024 * 1024
    assert signature.parameters["slots"].default == DEFAULT_POOL_SLOTS == 8
    assert signature.parameters["shm"].default is True
    assert signature.parameters["mode"].default == 0o600


def test_name_and_backing_object(pool: StagingPool) -> None:
    assert re.fullmatch(rf"reactantserver-client-{os.getpid()}-[0-9a-f]{{16}}", pool.name)
    assert isinstance(pool, BufferPool)
    assert pool.shm
    assert pool.shm_key == f"/{pool.name}"
    path = SHM / pool.name
    assert pool.shm_path == path
    assert path.is_file()
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_size == 8 * 1024
    assert (pool.nbytes, pool.n_slots, pool.slot_nbytes) == (8192, 8, 1024)
    assert pool in live_pools()


def test_names_are_unique() -> None:
    with closing(StagingPool(1024, 1)) as a, closing(StagingPool(1024, 1)) as b:
        assert a.name != b.name
        assert (SHM / a.name).is_file()
        assert (SHM / b.name).is_file()


def test_mode_can_be_given() -> None:
    with closing(StagingPool(1024, 1, mode=0o640)) as p:
        assert stat.S_IMODE((SHM / p.name).stat().st_mode) == 0o640


def test_close_unlinks(pool: StagingPool) -> None:
    path = SHM / pool.name
    pool.close()
    assert pool.closed
    assert not path.exists()
    pool.close()  # idempotent


def test_context_manager_unlinks() -> None:
    p = StagingPool(1024, 2)
    with p:
        path = SHM / p.name
        assert path.is_file()
    assert p.closed
    assert not path.exists()


def test_shutdown_unlinks_pools_left_open() -> None:
    p = StagingPool(1024, 2)
    path = SHM / p.name
    client.shutdown()
    assert p.closed
    assert not path.exists()


def test_plain_pool_has_no_file() -> None:
    with closing(StagingPool(4096, 4, shm=False)) as p:
        assert not p.shm
        assert p.shm_key is None
        assert p.shm_path is None
        assert not (SHM / p.name).exists()
        assert not list(SHM.glob(f"reactantserver-client-{os.getpid()}-*"))
        with p.acquire() as raw_slot:
            x = StagingSlot(raw_slot).scratch((4,), np.float64)
            assert pool_of(x) == (p, raw_slot.offset)
        assert "plain memory" in repr(p)


def test_view_aliases_pool_memory(pool: StagingPool) -> None:
    view = pool.view(1024, 16)
    assert len(view) == 16
    view[:4] = b"\x01\x02\x03\x04"
    assert bytes(pool.view(1024, 4)) == b"\x01\x02\x03\x04"
    assert (SHM / pool.name).read_bytes()[1024:1028] == b"\x01\x02\x03\x04"
    view.release()
    for offset, nbytes in [(-1, 1), (0, 8193), (8192, 1), (8000, 200)]:
        with pytest.raises(ValueError, match="outside"):
            pool.view(offset, nbytes)


# -- StagingSlot ------------------------------------------------------------------------------


def test_slot_geometry(pool: StagingPool) -> None:
    with pool.acquire(span=2) as raw_slot:
        slot = StagingSlot(raw_slot)
        assert slot.slot is raw_slot
        assert slot.pool is pool
        assert slot.offset == raw_slot.offset
        assert slot.nbytes == 2048
        assert slot.used == 0
        offset, view = slot.carve(100)
        assert offset == slot.offset
        assert len(view) == 100
        assert slot.used == 100


def test_scratch_shape_and_dtype(pool: StagingPool) -> None:
    with pool.acquire() as raw_slot:
        slot = StagingSlot(raw_slot)
        x = slot.scratch((3, 4), np.float32)
        assert x.shape == (3, 4)
        assert x.dtype == np.dtype(np.float32)
        assert x.flags.c_contiguous
        assert x.flags.writeable
        assert pool.offset_of(x) == raw_slot.offset
        y = slot.scratch(5, "int16")
        assert y.shape == (5,)
        assert y.dtype == np.dtype(np.int16)
        assert pool.offset_of(y) == raw_slot.offset + 48  # packed: no padding after x


def test_scratch_list_of_shape_dtype(pool: StagingPool) -> None:
    with pool.acquire() as raw_slot:
        a, b = StagingSlot(raw_slot).scratch([((2, 2), np.float64), ((7,), np.uint8)])
        assert a.shape == (2, 2)
        assert a.dtype == np.dtype(np.float64)
        assert b.shape == (7,)
        assert b.dtype == np.dtype(np.uint8)
        assert pool_of(a) == (pool, raw_slot.offset)
        assert pool_of(b) == (pool, raw_slot.offset + 32)


def test_scratch_named_specs(pool: StagingPool) -> None:
    with pool.acquire() as raw_slot:
        slot = StagingSlot(raw_slot)
        x, mask = slot.scratch([("INPUT__0", (3, 4), np.float32), ("MASK", (3,), np.int32)])
        assert x.shape == (3, 4)
        assert x.dtype == np.dtype(np.float32)
        assert mask.shape == (3,)
        assert mask.dtype == np.dtype(np.int32)
        assert x.flags.c_contiguous
        assert mask.flags.c_contiguous
        assert not np.shares_memory(x, mask)
        x_at, mask_at = pool.offset_of(x), pool.offset_of(mask)
        assert x_at == raw_slot.offset
        assert mask_at == raw_slot.offset + 48  # packed right after the 48 bytes of x
        assert slot.used == 48 + 12
        # The arrays alias the pool (and so the SHM object the server maps).
        x[...] = np.arange(12).reshape(3, 4)
        mask[...] = [1, 0, 1]
        assert x_at is not None
        assert mask_at is not None
        assert bytes(pool.view(x_at, 48)) == np.arange(12, dtype=np.float32).tobytes()
        on_disk = (SHM / pool.name).read_bytes()
        assert on_disk[mask_at : mask_at + 12] == np.array([1, 0, 1], np.int32).tobytes()


def test_scratch_that_does_not_fit(pool: StagingPool) -> None:
    with pool.acquire() as raw_slot:
        slot = StagingSlot(raw_slot)
        with pytest.raises(ValueError, match="overflows"):
            slot.scratch([("A", (200,), np.float32), ("B", (100,), np.float32)])
        assert slot.used == 0  # all or nothing
        assert slot.scratch((256,), np.float32).nbytes == 1024


def test_slots_do_not_overlap(pool: StagingPool) -> None:
    with pool.acquire() as first, pool.acquire() as second:
        a = StagingSlot(first).scratch((256,), np.float32)
        b = StagingSlot(second).scratch((256,), np.float32)
        assert not np.shares_memory(a, b)
        assert pool_of(a) == (pool, first.offset)
        assert pool_of(b) == (pool, second.offset)
        assert first.offset != second.offset


# -- pool_of ----------------------------------------------------------------------------------


def test_pool_of_finds_the_pool_and_offset(pool: StagingPool) -> None:
    with closing(StagingPool(4096, 4)) as other, pool.acquire() as mine, other.acquire() as theirs:
        a = StagingSlot(mine).scratch((8,), np.int64)
        b = StagingSlot(theirs).scratch((8,), np.int64)
        assert pool_of(a) == (pool, mine.offset)
        assert pool_of(b) == (other, theirs.offset)
        # A view inside a carve is found at its own offset.
        assert pool_of(a[3:]) == (pool, mine.offset + 24)


def test_pool_of_foreign_arrays(pool: StagingPool) -> None:
    assert pool_of(np.zeros(8)) is None
    assert pool_of(np.frombuffer(b"\x00" * 8, np.uint8)) is None


def test_pool_of_after_close() -> None:
    p = StagingPool(1024, 1)
    slot = p.acquire()
    x = StagingSlot(slot).scratch((4,), np.float32)
    slot.release()
    p.close()
    assert pool_of(x) is None
