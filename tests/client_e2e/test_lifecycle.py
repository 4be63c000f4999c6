"""``shutdown()``: servers are left as found, SHM objects are unlinked, the client stays usable."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reactantserver import client as rc
from tests.worker_e2e._bundles import assert_close, mlp_reference
from tests.worker_e2e._harness import WorkerProcess, rows

from ._helpers import MlpRows, registered, shm_leftovers

pytestmark = pytest.mark.slow

SLOT_BYTES = 1024
SLOTS = 8


def test_shutdown_unregisters_unlinks_and_the_client_stays_usable(
    worker: WorkerProcess,
    triton: Any,
    weights: dict[str, Any],
    make_pool: Callable[..., rc.StagingPool],
) -> None:
    x = rows(9, 16, seed=71)
    want = mlp_reference(weights["mlp"], x)
    pool = make_pool(SLOT_BYTES * SLOTS, SLOTS)
    assert pool.shm_path is not None
    assert shm_leftovers() == [pool.name]
    assert pool.shm_path.stat().st_mode & 0o777 == 0o600
    with rc.KServeModel(worker.url, "mlp", max_batch_size=4, pool=pool) as model:
        io = MlpRows(x)
        rc.infer_sync(model, io)
        assert_close(io.y, want)
        assert set(registered(triton)) == {pool.name}

        rc.shutdown()
        assert registered(triton) == {}
        assert pool.closed
        assert shm_leftovers() == []

        # the same model still answers (a fresh channel), and a new pool registers afresh
        response = rc.infer_sync(model, [rc.InferInput("x", x)])
        assert response is not None
        assert_close(rc.InferOutput(response, "logits"), want)
        again = make_pool(SLOT_BYTES * SLOTS, SLOTS)
        with rc.KServeModel(worker.url, "mlp", max_batch_size=4, pool=again) as other:
            io = MlpRows(x)
            rc.infer_sync(other, io)
            assert_close(io.y, want)
        assert set(registered(triton)) == {again.name}
    rc.shutdown()
    assert registered(triton) == {}


def test_shutdown_cleans_a_pool_dropped_without_close(worker: WorkerProcess, triton: Any) -> None:
    x = rows(5, 16, seed=72)

    def use_and_drop() -> tuple[str, Path]:
        pool = rc.StagingPool(SLOT_BYTES * SLOTS, SLOTS)
        assert pool.shm_path is not None
        with rc.KServeModel(worker.url, "mlp", max_batch_size=4, pool=pool) as model:
            rc.infer_sync(model, MlpRows(x))
        return pool.name, pool.shm_path

    name, path = use_and_drop()
    gc.collect()
    rc.shutdown()
    file_left, registration_left = path.exists(), name in registered(triton)
    # clean up by hand, so that the suite's own checks stay meaningful
    path.unlink(missing_ok=True)
    triton.unregister_system_shared_memory(name)
    assert not file_left
    assert not registration_left
