"""Batched IO drivers over a staging pool, SHM or plain, sync and async."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from reactantserver import client as rc
from tests.worker_e2e._bundles import assert_close
from tests.worker_e2e._harness import WorkerProcess, infer_input, model_stats

from ._helpers import MlpRows, example_inputs, registered

pytestmark = pytest.mark.slow

N = 23
"""Items per batch: not a multiple of the chunk."""
CHUNK = 5
"""``max_batch_size``: the slots would hold more (1024-byte slots, 64 or 80 bytes per item)."""
CHUNKS = [range(s, min(s + CHUNK, N)) for s in range(0, N, CHUNK)]
SLOT_BYTES = 1024
SLOTS = 8


class _Overlap(MlpRows):
    """Counts chunks encoded and not yet decoded, to see async lanes overlap."""

    def __init__(self, x: np.ndarray[Any, Any], *, declare: bool) -> None:
        super().__init__(x, declare=declare)
        self.outstanding = 0
        self.most = 0

    def encode_chunk(self, items: range, slot: rc.StagingSlot) -> list[rc.InferInput]:
        self.outstanding += 1
        self.most = max(self.most, self.outstanding)
        return super().encode_chunk(items, slot)

    def decode_chunk(self, items: range, response: Any) -> None:
        self.outstanding -= 1
        super().decode_chunk(items, response)


@pytest.mark.parametrize("declare", [False, True], ids=["inline-outputs", "output-specs"])
@pytest.mark.parametrize("shm", [True, False], ids=["shm-pool", "plain-pool"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_batch_equals_one_big_call(
    worker: WorkerProcess,
    triton: Any,
    make_pool: Callable[..., rc.StagingPool],
    *,
    driver: str,
    shm: bool,
    declare: bool,
) -> None:
    x = example_inputs("mlp", N, seed=7)[0][1]
    want = triton.infer("mlp", [infer_input("x", x, "FP32")]).as_numpy("logits")
    pool = make_pool(SLOT_BYTES * SLOTS, SLOTS, shm=shm)
    assert pool.shm is shm
    io = _Overlap(x, declare=declare)
    plan = rc.chunk_plan(io.item_input_bytes(), io.output_specs(), pool, CHUNK)
    assert plan.chunk == CHUNK
    assert plan.per_item == 64 + (16 if shm and declare else 0)
    before = model_stats(triton, "mlp")
    with rc.KServeModel(worker.url, "mlp", max_batch_size=CHUNK, pool=pool) as model:
        assert model.pool is pool
        if driver == "sync":
            assert rc.infer_sync(model, io) is None
        else:
            assert asyncio.run(rc.infer_async(model, io, concurrency=3)) is None
            assert io.most > 1  # chunks really were in flight together
        # the server mapped the pool under its name, whole (only an SHM pool)
        want_registered = {pool.name: (pool.shm_key, 0, pool.nbytes)} if shm else {}
        assert registered(triton) == want_registered
    after = model_stats(triton, "mlp")
    assert_close(io.y, want)
    assert sorted(io.chunks, key=lambda r: r.start) == CHUNKS
    if driver == "sync":
        assert io.chunks == CHUNKS
    # one request per chunk (concurrent chunks may share an execution), every row once
    success = after.inference_stats.success.count - before.inference_stats.success.count
    assert success == len(CHUNKS)
    assert after.inference_count - before.inference_count == N
    if shm and declare:
        # the server wrote the logits into the chunk's slot; the driver copied them
        # from there into the response that decode_chunk read
        assert io.via_slot == {items.start: True for items in CHUNKS}
    else:
        assert io.via_slot == {items.start: False for items in CHUNKS}
    rc.shutdown()
    assert registered(triton) == {}
    assert pool.closed


def test_default_concurrency_and_request_ids(
    worker: WorkerProcess, triton: Any, make_pool: Callable[..., rc.StagingPool]
) -> None:
    x = example_inputs("mlp", N, seed=8)[0][1]
    want = triton.infer("mlp", [infer_input("x", x, "FP32")]).as_numpy("logits")
    pool = make_pool(SLOT_BYTES * 4, 4)
    ids: list[str] = []

    class Ids(MlpRows):
        def decode_chunk(self, items: range, response: Any) -> None:
            ids.append(response.id)
            super().decode_chunk(items, response)

    io = Ids(x, declare=True)
    with rc.KServeModel(worker.url, "mlp", max_batch_size=CHUNK, pool=pool) as model:
        asyncio.run(rc.infer_async(model, io, request_id="batch", priority=1))
    assert_close(io.y, want)
    assert sorted(ids) == sorted(f"batch-{r.start}" for r in CHUNKS)
