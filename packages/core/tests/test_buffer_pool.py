"""BufferPool: geometry, carving, scratch, SHM backing, deadlines, FIFO fairness, cancellation."""

from __future__ import annotations

import asyncio
import mmap
import os
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from reactantserver.core import buffer_pool
from reactantserver.core.buffer_pool import BufferPool, Slot
from reactantserver.core.errors import DeadlineExceededError, PoolAcquireTimeout

SHM = Path("/dev/shm")


@pytest.fixture
def shm_key() -> Iterator[str]:
    """A key unique to the test; its /dev/shm object is removed afterwards."""
    key = f"/rs-test-pool-{uuid.uuid4().hex[:12]}"
    yield key
    (SHM / key[1:]).unlink(missing_ok=True)


@pytest.fixture
def pool() -> Iterator[BufferPool]:
    p = BufferPool(8 * 1024, 8)
    yield p
    p.close()


def _in_ms(ms: float) -> int:
    return time.monotonic_ns() + int(ms * 1e6)


def _wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.001)


# -- geometry and validation -------------------------------------------------------------------


def test_geometry() -> None:
    with BufferPool(1000, 3) as p:
        assert (p.nbytes, p.n_slots, p.slot_nbytes) == (1000, 3, 333)
        assert p.shm_key is None
        assert p.shm_path is None
        assert p.free_slots == 3
        assert p.waiting == 0
        slot = p.acquire(span=2)
        assert (slot.index, slot.span, slot.offset, slot.nbytes) == (0, 2, 0, 666)
        assert len(slot.buffer) == 666
        nxt = p.acquire()
        assert (nxt.index, nxt.offset, nxt.nbytes) == (2, 666, 333)
        assert p.free_slots == 0
        assert "BufferPool(nbytes=1000" in repr(p)
        assert "Slot(index=2" in repr(nxt)


@pytest.mark.parametrize(("nbytes", "n_slots"), [(100, 0), (3, 4), (0, 1)])
def test_bad_geometry_is_a_value_error(nbytes: int, n_slots: int) -> None:
    with pytest.raises(ValueError, match="slot"):
        BufferPool(nbytes, n_slots)


def test_span_out_of_range_fails_immediately(pool: BufferPool) -> None:
    for span in (0, -1, 9):
        with pytest.raises(ValueError, match="span"):
            pool.acquire(span)
        with pytest.raises(ValueError, match="span"):
            asyncio.run(pool.acquire_async(span))
    assert pool.waiting == 0


def test_double_release_is_a_value_error(pool: BufferPool) -> None:
    slot = pool.acquire()
    slot.release()
    assert slot.released
    with pytest.raises(ValueError, match="released twice"):
        slot.release()
    with pytest.raises(ValueError, match="already released"):
        slot.carve(1)


def test_slot_context_manager_releases(pool: BufferPool) -> None:
    with pool.acquire(span=8) as slot:
        assert pool.free_slots == 0
    assert slot.released
    assert pool.free_slots == 8


def test_public_surface_is_sorted() -> None:
    def key(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert buffer_pool.__all__ == sorted(buffer_pool.__all__, key=key)
    for name in buffer_pool.__all__:
        assert hasattr(buffer_pool, name)


# -- carving and scratch -----------------------------------------------------------------------


def test_carve_is_sequential_aligned_and_bounded() -> None:
    with BufferPool(4 * 1000, 4) as p:
        p.acquire()  # slot 0, so the next run starts at offset 1000 (not 64-aligned)
        slot = p.acquire(span=2)
        assert slot.offset == 1000
        off1, view1 = slot.carve(10)
        assert off1 == 1024
        assert len(view1) == 10
        off2, view2 = slot.carve(100, align=8)
        assert off2 == 1040
        assert len(view2) == 100
        off3, _ = slot.carve(0)
        assert off3 == 1152
        assert slot.used == 1152 - 1000
        # A carve may straddle the boundary between the two slots of the span (at 2000).
        off4, view4 = slot.carve(900, align=1)
        assert off4 == 1152
        assert off4 < 2000 < off4 + len(view4)
        with pytest.raises(ValueError, match="overflows"):
            slot.carve(3000 - 2052 + 1, align=1)
        off5, view5 = slot.carve(3000 - 2052, align=1)
        assert off5 + len(view5) == slot.offset + slot.nbytes
        with pytest.raises(ValueError, match="overflows"):
            slot.carve(1, align=1)
        with pytest.raises(ValueError, match="power of two"):
            slot.carve(1, align=3)
        with pytest.raises(ValueError, match="negative"):
            slot.carve(-1)


def test_carved_views_alias_the_pool_at_their_offsets() -> None:
    with BufferPool(4096, 4) as p:
        slot = p.acquire(span=2)
        offset, view = slot.carve(16)
        view[:] = bytes(range(16))
        other = p.acquire()
        assert bytes(slot.buffer[offset - slot.offset : offset - slot.offset + 16]) == bytes(
            range(16)
        )
        assert not any(other.buffer)


def test_scratch_single_and_many_are_disjoint_and_aliased(pool: BufferPool) -> None:
    slot = pool.acquire(span=2)
    one = slot.scratch((3, 4), np.float32)
    assert one.shape == (3, 4)
    assert one.dtype == np.float32
    assert one.flags.c_contiguous
    assert one.ctypes.data % 64 == 0
    a, b, c = slot.scratch([((5,), np.int64), (7, np.uint8), ((), np.float64)])
    arrays = [one, a, b, c]
    assert (a.shape, b.shape, c.shape) == ((5,), (7,), ())
    for i, x in enumerate(arrays):
        assert x.ctypes.data % 64 == 0
        assert x.flags.writeable
        for y in arrays[i + 1 :]:
            assert not np.shares_memory(x, y)
    one[...] = 1.5
    a[...] = -3
    raw = np.frombuffer(slot.buffer, dtype=np.uint8)
    assert np.shares_memory(one, raw)
    assert np.shares_memory(c, raw)
    assert np.frombuffer(slot.buffer[:48], dtype=np.float32).tolist() == [1.5] * 12
    assert slot.scratch([]) == []


def test_scratch_is_all_or_nothing(pool: BufferPool) -> None:
    slot = pool.acquire()
    before = slot.used
    with pytest.raises(ValueError, match="overflows"):
        slot.scratch([((100,), np.float32), ((1000,), np.float32)])
    assert slot.used == before
    with pytest.raises(ValueError, match="fixed-size dtype"):
        slot.scratch((2,), object)
    with pytest.raises(ValueError, match="negative"):
        slot.scratch((-2,), np.float32)
    assert slot.scratch((256,), np.float32).nbytes == 1024  # exactly one slot still fits


# -- SHM backing -------------------------------------------------------------------------------


def test_shm_pool_creates_maps_and_unlinks(shm_key: str) -> None:
    path = SHM / shm_key[1:]
    p = BufferPool(4096, 4, shm_key=shm_key)
    assert p.shm_key == shm_key
    assert p.shm_path == path
    assert path.stat().st_size == 4096
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    slot = p.acquire(span=2)
    offset, view = slot.carve(8)
    view[:] = b"reactant"
    # Another process maps the object by name and reads the bytes at the carve offset.
    code = (
        "import mmap, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY);"
        "m = mmap.mmap(fd, 0, prot=mmap.PROT_READ); o = int(sys.argv[2]);"
        "sys.stdout.write(m[o:o+8].decode())"
    )
    seen = subprocess.run(
        [sys.executable, "-c", code, str(path), str(offset)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert seen == "reactant"
    del view
    slot.release()
    p.close()
    assert not path.exists()
    p.close()  # idempotent


def test_shm_pool_mode_and_key_without_slash(shm_key: str) -> None:
    with BufferPool(1024, 2, shm_key=shm_key[1:], shm_mode=0o640) as p:
        assert p.shm_path is not None
        assert stat.S_IMODE(p.shm_path.stat().st_mode) == 0o640
    assert not (SHM / shm_key[1:]).exists()


def test_shm_key_collision_leaves_the_other_object_alone(shm_key: str) -> None:
    with BufferPool(1024, 2, shm_key=shm_key), pytest.raises(FileExistsError):
        BufferPool(1024, 2, shm_key=shm_key)
    # (the first pool unlinked its own object on close)
    assert not (SHM / shm_key[1:]).exists()


@pytest.mark.parametrize("key", ["", "/", "a/b", "/..", ".", "x\0y"])
def test_bad_shm_keys(key: str) -> None:
    with pytest.raises(ValueError, match="single path component"):
        BufferPool(1024, 2, shm_key=key)


def test_close_with_live_slot_and_arrays_is_memory_safe() -> None:
    p = BufferPool(1024, 2)
    slot = p.acquire()
    array = slot.scratch((4,), np.int32)
    array[...] = 7
    p.close()
    assert p.closed
    assert array.tolist() == [7, 7, 7, 7]  # still mapped while referenced
    slot.release()  # harmless after close
    with pytest.raises(ValueError, match="closed"):
        p.acquire()


# -- deadlines ---------------------------------------------------------------------------------


def test_acquire_times_out_at_its_deadline_and_leaves_the_queue(pool: BufferPool) -> None:
    held = pool.acquire(span=8)
    deadline = _in_ms(100)
    with pytest.raises(PoolAcquireTimeout):
        pool.acquire(deadline_ns=deadline)
    assert time.monotonic_ns() >= deadline  # never gives up early
    assert pool.waiting == 0
    assert issubclass(PoolAcquireTimeout, DeadlineExceededError)
    held.release()
    pool.acquire(deadline_ns=_in_ms(100)).release()


def test_free_run_is_granted_even_past_the_deadline(pool: BufferPool) -> None:
    pool.acquire(deadline_ns=time.monotonic_ns() - 1).release()


def test_expired_deadline_with_no_room_raises_at_once(pool: BufferPool) -> None:
    pool.acquire(span=8)
    with pytest.raises(PoolAcquireTimeout):
        pool.acquire(deadline_ns=time.monotonic_ns() - 1)
    assert pool.waiting == 0


def test_timed_out_head_unblocks_the_waiters_behind_it() -> None:
    with BufferPool(200, 2) as p:
        first = p.acquire()  # slot 0 taken, slot 1 free
        got: list[Slot] = []
        errors: list[BaseException] = []

        def big() -> None:
            try:
                p.acquire(span=2, deadline_ns=_in_ms(150))
            except PoolAcquireTimeout as exc:
                errors.append(exc)

        head = threading.Thread(target=big)
        head.start()
        _wait_until(lambda: p.waiting == 1)
        small = threading.Thread(target=lambda: got.append(p.acquire()))
        small.start()
        _wait_until(lambda: p.waiting == 2)
        time.sleep(0.03)
        assert got == []  # slot 1 is free, but the span-2 waiter is ahead (FIFO)
        head.join(10)
        small.join(10)
        assert len(errors) == 1
        assert [s.index for s in got] == [1]
        first.release()
        got[0].release()


# -- FIFO fairness -----------------------------------------------------------------------------


def test_waiting_span_4_is_served_before_later_span_1_waiters() -> None:
    with BufferPool(4 * 64, 4) as p:
        held = [p.acquire() for _ in range(4)]
        order: list[str] = []
        slots: dict[str, Slot] = {}
        lock = threading.Lock()

        def want(name: str, span: int) -> None:
            slot = p.acquire(span=span)
            with lock:
                order.append(name)
                slots[name] = slot

        threads = []
        for n, (name, span) in enumerate([("big", 4), ("small1", 1), ("small2", 1)], start=1):
            t = threading.Thread(target=want, args=(name, span))
            t.start()
            threads.append(t)
            _wait_until(lambda n=n: p.waiting == n)  # type: ignore[misc]

        held[0].release()
        time.sleep(0.05)
        assert order == []  # one free slot is not handed past the span-4 waiter
        for slot in held[1:]:
            slot.release()
        _wait_until(lambda: order == ["big"])
        time.sleep(0.05)
        assert order == ["big"]
        slots["big"].release()
        for t in threads:
            t.join(10)
        # Both small waiters are granted in one pass, in queue order (first fit): which
        # thread wakes first is up to the scheduler, which slot each got is not.
        assert order[0] == "big"
        assert sorted(order[1:]) == ["small1", "small2"]
        assert (slots["small1"].index, slots["small2"].index) == (0, 1)


def test_newcomer_does_not_overtake_a_waiter() -> None:
    with BufferPool(2 * 64, 2) as p:
        a = p.acquire()
        done: list[Slot] = []
        t = threading.Thread(target=lambda: done.append(p.acquire(span=2)))
        t.start()
        _wait_until(lambda: p.waiting == 1)
        # Slot 1 is free, but someone is queued: the newcomer must wait its turn.
        with pytest.raises(PoolAcquireTimeout):
            p.acquire(deadline_ns=_in_ms(30))
        a.release()
        t.join(10)
        assert done
        assert done[0].span == 2


# -- asyncio -----------------------------------------------------------------------------------


def test_async_acquire_waits_and_times_out() -> None:
    async def main(p: BufferPool) -> None:
        held = await p.acquire_async(span=2)
        deadline = _in_ms(80)
        with pytest.raises(PoolAcquireTimeout):
            await p.acquire_async(deadline_ns=deadline)
        assert time.monotonic_ns() >= deadline
        waiter = asyncio.create_task(p.acquire_async(span=2))
        await asyncio.sleep(0.02)
        assert not waiter.done()
        # Released from another thread: the waiter is woken through its loop.
        await asyncio.to_thread(held.release)
        slot = await asyncio.wait_for(waiter, 10)
        assert slot.span == 2
        slot.release()

    with BufferPool(256, 2) as p:
        asyncio.run(main(p))
        assert p.waiting == 0
        assert p.free_slots == 2


def test_cancelled_async_waiter_leaves_the_queue() -> None:
    async def main(p: BufferPool) -> None:
        held = p.acquire()
        task = asyncio.create_task(p.acquire_async(span=2))
        await asyncio.sleep(0.02)
        assert p.waiting == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert p.waiting == 0
        # The cancelled span-2 waiter no longer blocks a span-1 request behind it.
        nxt = await asyncio.wait_for(p.acquire_async(), 10)
        nxt.release()
        held.release()

    with BufferPool(256, 2) as p:
        asyncio.run(main(p))
        assert p.free_slots == 2


def test_close_fails_pending_waiters() -> None:
    p = BufferPool(256, 2)
    p.acquire(span=2)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            p.acquire()
        except ValueError as exc:
            errors.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    _wait_until(lambda: p.waiting == 1)
    p.close()
    t.join(10)
    assert len(errors) == 1
    assert "closed" in str(errors[0])


# -- stress ------------------------------------------------------------------------------------


class _Ownership:
    """Who holds each slot, as the holders themselves see it; records every violation."""

    def __init__(self, n_slots: int) -> None:
        self.owners: list[int | None] = [None] * n_slots
        self.failures: list[str] = []
        self._lock = threading.Lock()

    def claim(self, tid: int, slot: Slot) -> None:
        with self._lock:
            run = range(slot.index, slot.index + slot.span)
            taken = [i for i in run if self.owners[i] is not None]
            if taken:
                self.failures.append(f"thread {tid} got slots {taken} owned by others")
            for i in run:
                self.owners[i] = tid

    def drop(self, tid: int, slot: Slot) -> None:
        with self._lock:
            for i in range(slot.index, slot.index + slot.span):
                if self.owners[i] != tid:
                    self.failures.append(f"slot {i} changed owner under thread {tid}")
                self.owners[i] = None


def _carve_and_check(slot: Slot, rng: np.random.Generator, pattern: int) -> list[str]:
    """Carve the span in random pieces (some straddle slots), fill it, verify it after a nap."""
    pieces = []
    while True:
        want = int(rng.integers(1, slot.pool.slot_nbytes))
        if slot.used + want + 64 > slot.nbytes:
            break
        pieces.append(slot.carve(want, align=int(rng.choice([1, 8, 64])))[1])
    slot.buffer[:] = bytes([pattern]) * slot.nbytes
    if rng.random() < 0.3:
        time.sleep(0.0002)
    problems = []
    if slot.buffer.tobytes() != bytes([pattern]) * slot.nbytes:
        problems.append(f"data clobbered in {slot!r}")
    if any(p.tobytes() != bytes([pattern]) * len(p) for p in pieces):
        problems.append(f"carved piece clobbered in {slot!r}")
    return problems


def test_stress_no_overlap_no_clobbering() -> None:
    n_slots, slot_nbytes, n_threads, cycles = 16, 256, 8, 1200
    table = _Ownership(n_slots)
    timeouts = [0] * n_threads
    completed = [0] * n_threads
    pool = BufferPool(n_slots * slot_nbytes, n_slots)

    def worker(tid: int) -> None:
        rng = np.random.default_rng(tid)
        try:
            for cycle in range(cycles):
                span = int(rng.integers(1, 5)) if rng.random() < 0.95 else n_slots
                # A few acquisitions get a deadline that is often too short to be met.
                deadline = _in_ms(0.2) if rng.random() < 0.1 else _in_ms(10_000)
                try:
                    slot = pool.acquire(span=span, deadline_ns=deadline)
                except PoolAcquireTimeout:
                    timeouts[tid] += 1
                    continue
                table.claim(tid, slot)
                table.failures.extend(_carve_and_check(slot, rng, (tid * 31 + cycle) % 251 + 1))
                table.drop(tid, slot)
                slot.release()
                completed[tid] += 1
        except BaseException as exc:
            table.failures.append(f"thread {tid}: {exc!r}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - start
    assert not any(t.is_alive() for t in threads)
    assert table.failures == []
    assert sum(completed) + sum(timeouts) == n_threads * cycles
    assert sum(completed) > n_threads * cycles // 2
    assert pool.free_slots == n_slots
    assert pool.waiting == 0
    assert table.owners == [None] * n_slots
    pool.close()
    assert elapsed < 30  # generous: the point is that it finishes, not how fast


def test_stress_async_and_threads_together() -> None:
    pool = BufferPool(8 * 128, 8)
    stop = threading.Event()
    in_use: set[int] = set()
    table_lock = threading.Lock()
    failures: list[str] = []

    def mark(slot: Slot, on: bool) -> None:
        with table_lock:
            run = set(range(slot.index, slot.index + slot.span))
            if on:
                if run & in_use:
                    failures.append(f"overlap {sorted(run & in_use)}")
                in_use.update(run)
            else:
                in_use.difference_update(run)

    def thread_worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            slot = pool.acquire(span=int(rng.integers(1, 4)), deadline_ns=_in_ms(5000))
            mark(slot, True)
            mark(slot, False)
            slot.release()

    async def async_worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(200):
            slot = await pool.acquire_async(span=int(rng.integers(1, 4)), deadline_ns=_in_ms(5000))
            mark(slot, True)
            await asyncio.sleep(0)
            mark(slot, False)
            slot.release()

    async def main() -> None:
        await asyncio.gather(*(async_worker(s) for s in range(4)))

    threads = [threading.Thread(target=thread_worker, args=(s,)) for s in range(100, 104)]
    for t in threads:
        t.start()
    try:
        asyncio.run(main())
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert failures == []
    assert pool.free_slots == 8
    assert pool.waiting == 0
    pool.close()


def test_anonymous_pool_is_not_backed_by_a_file() -> None:
    with BufferPool(mmap.PAGESIZE * 2, 2) as p:
        assert p.shm_path is None
        before = set(os.listdir(SHM))
        p.acquire().release()
        assert set(os.listdir(SHM)) == before


def test_offset_of_finds_scratch_arrays_and_nothing_else() -> None:
    with BufferPool(4096, 4) as pool, pool.acquire(span=2) as slot:
        first, second = slot.scratch([((3, 4), np.float32), ((5,), np.int64)])
        assert pool.offset_of(first) == slot.offset
        assert pool.offset_of(second) == slot.offset + 64
        assert pool.offset_of(second[1:]) == slot.offset + 72
        assert pool.offset_of(np.zeros(4)) is None
    assert pool.offset_of(first) is None
