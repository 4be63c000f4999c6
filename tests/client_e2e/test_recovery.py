"""A server that forgets our regions is told again.

A restarted worker has forgotten every registration: the client retries ``UNAVAILABLE`` while
it starts, then re-registers what a request references. A registration dropped behind the
client's back is re-registered the same way; when that fails too, the pool falls back to
inline bytes and a background re-probe brings it back once the server can open it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from reactantserver import client as rc
from tests.worker_e2e._bundles import assert_close, mlp_reference
from tests.worker_e2e._harness import STARTUP_TIMEOUT_S, WorkerProcess, rows, wait_for

from ._helpers import MlpRows, dedicated_worker, region_key, registered

pytestmark = pytest.mark.slow

N = 23
CHUNK = 5
SLOT_BYTES = 1024
SLOTS = 8
REGION_BYTES = 1024
SMALL = 3
"""Rows sent through the explicit regions."""
PATIENT = rc.RetryPolicy(initial_backoff=0.05, max_backoff=0.5)
"""Small backoff so ``UNAVAILABLE`` while a worker restarts is retried often."""
REPROBE_S = 0.1


def _registered_at(worker: WorkerProcess) -> dict[str, tuple[str, int, int]]:
    with grpcclient.InferenceServerClient(worker.url) as triton:
        return registered(triton)


class _Rig:
    """A pool, two explicit regions and a model using them, with the expected answers."""

    def __init__(self, pool: rc.StagingPool, model: rc.KServeModel, seed: int, weights: Any):
        self.pool = pool
        self.model = model
        self.x = rows(N, 16, seed=seed)
        self.want = mlp_reference(weights["mlp"], self.x)
        self.rin = rc.create_region(region_key("in"), REGION_BYTES)
        self.rout = rc.create_region(region_key("out"), REGION_BYTES)
        self.rin.write(0, self.x[:SMALL])

    def register(self) -> None:
        rc.register_region(self.model, self.rin)
        rc.register_region(self.model, self.rout)

    def unregister(self) -> None:
        rc.unregister_region(self.model, self.rin)
        rc.unregister_region(self.model, self.rout)

    def close(self) -> None:
        self.rin.close(unlink=True)
        self.rout.close(unlink=True)

    def everything(self) -> dict[str, tuple[str, int, int]]:
        """What the server should have registered."""
        return {**self.pool_only(), **self.regions_only()}

    def pool_only(self) -> dict[str, tuple[str, int, int]]:
        assert self.pool.shm_key is not None
        return {self.pool.name: (self.pool.shm_key, 0, self.pool.nbytes)}

    def regions_only(self) -> dict[str, tuple[str, int, int]]:
        return {r.name: (r.key, 0, REGION_BYTES) for r in (self.rin, self.rout)}

    def batch(self, driver: str = "sync") -> MlpRows:
        """The whole batch through the pool (logits declared: they come back in the slot)."""
        io = MlpRows(self.x, declare=True)
        if driver == "sync":
            rc.infer_sync(self.model, io)
        else:
            asyncio.run(rc.infer_async(self.model, io, concurrency=2))
        assert_close(io.y, self.want)
        return io

    def explicit(self, driver: str = "sync") -> None:
        """The first rows from ``rin``, logits into ``rout``."""
        self.rout.write(0, np.zeros(SMALL * 4, np.float32))
        inputs = [rc.InferInput.from_shm("x", self.rin, 0, (SMALL, 16), np.float32)]
        outputs = [rc.RequestedOutput.to_shm("logits", self.rout, 0, SMALL * 16)]
        if driver == "sync":
            rc.infer_sync(self.model, inputs, outputs=outputs)
        else:
            asyncio.run(rc.infer_async(self.model, inputs, outputs=outputs))
        assert_close(self.rout.read(0, (SMALL, 4), np.float32), self.want[:SMALL])


@pytest.fixture
def rig(make_pool: Callable[..., rc.StagingPool], weights: Any) -> Iterator[Callable[[str], _Rig]]:
    """``rig(url)``: a :class:`_Rig` on a fresh pool; its regions are unlinked afterwards."""
    made: list[_Rig] = []

    def make(url: str) -> _Rig:
        pool = make_pool(SLOT_BYTES * SLOTS, SLOTS)
        model = rc.KServeModel(
            url,
            "mlp",
            deadline=STARTUP_TIMEOUT_S,
            max_batch_size=CHUNK,
            pool=pool,
            retry=PATIENT,
            shm_reprobe_interval=REPROBE_S,
        )
        made.append(_Rig(pool, model, seed=60 + len(made), weights=weights))
        return made[-1]

    yield make
    for one in made:
        one.model.close()
        one.close()


def test_pool_and_regions_survive_a_worker_restart(
    repo: Path, cache_dir: Path, tmp_path: Path, rig: Callable[[str], _Rig]
) -> None:
    worker = dedicated_worker(repo, cache_dir, tmp_path, ["mlp"])
    worker.start()
    try:
        worker.wait_ready()
        setup = rig(worker.url)
        setup.register()
        setup.batch()
        setup.explicit()
        assert _registered_at(worker) == setup.everything()

        assert worker.stop() == 0
        worker.start()  # the same ports; until it serves, requests fail with UNAVAILABLE
        setup.batch()  # retried while it starts, then the pool is registered again
        assert _registered_at(worker) == setup.pool_only()  # only what the batch used
        setup.explicit()
        assert _registered_at(worker) == setup.everything()
        assert not setup.model.endpoint.latched(setup.pool)

        setup.unregister()
        assert _registered_at(worker) == setup.pool_only()
        rc.shutdown()
        assert _registered_at(worker) == {}
        assert setup.pool.closed

        # shutdown against a server that is gone still returns promptly (spec: within 1 s)
        other = rig(worker.url)
        other.batch()
        assert worker.stop() == 0
        started = time.monotonic()
        rc.shutdown()
        assert time.monotonic() - started < 5.0
        assert other.pool.closed
    finally:
        worker.stop()


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_registrations_dropped_behind_our_back_are_made_again(
    worker: WorkerProcess, triton: Any, rig: Callable[[str], _Rig], driver: str
) -> None:
    setup = rig(worker.url)
    setup.register()
    try:
        setup.batch(driver)
        setup.explicit(driver)
        assert registered(triton) == setup.everything()
        for name in setup.everything():
            triton.unregister_system_shared_memory(name)
        setup.batch(driver)
        assert registered(triton) == setup.pool_only()
        setup.explicit(driver)
        assert registered(triton) == setup.everything()
        assert not setup.model.endpoint.latched(setup.pool)
    finally:
        setup.unregister()


@contextlib.contextmanager
def _moved(path: Path) -> Iterator[None]:
    """While inside, ``path`` is renamed (same inode): a server can no longer open it."""
    aside = path.with_name(path.name + "-aside")
    os.rename(path, aside)
    try:
        yield
    finally:
        os.rename(aside, path)


def test_pool_falls_back_inline_then_reprobe_restores_it(
    worker: WorkerProcess, triton: Any, rig: Callable[[str], _Rig]
) -> None:
    setup = rig(worker.url)
    pool = setup.pool
    assert pool.shm_path is not None
    setup.batch()
    assert registered(triton) == setup.pool_only()
    np.frombuffer(pool.view(0, pool.nbytes), np.uint8)[:] = 0
    with _moved(pool.shm_path):
        triton.unregister_system_shared_memory(pool.name)
        # re-registering fails (no such object): the batch is re-sent inline and succeeds
        io = setup.batch()
        assert setup.model.endpoint.latched(pool)
        assert registered(triton) == {}
        # inline: decode_chunk had the logits, but the server wrote nothing into the slots
        assert io.via_slot == {items.start: False for items in _chunks()}
        time.sleep(3 * REPROBE_S)  # re-probes run and keep failing meanwhile
        assert setup.model.endpoint.latched(pool)
    wait_for(lambda: not setup.model.endpoint.latched(pool), "the re-probe to restore SHM")
    assert registered(triton) == setup.pool_only()
    io = setup.batch()
    assert io.via_slot == {items.start: True for items in _chunks()}


def _chunks() -> list[range]:
    return [range(s, min(s + CHUNK, N)) for s in range(0, N, CHUNK)]
