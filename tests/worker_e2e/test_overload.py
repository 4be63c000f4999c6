"""Ten times more concurrent requests than the worker admits: the excess is refused with
``RESOURCE_EXHAUSTED`` before it is decoded, the admitted requests are answered correctly,
memory stays bounded, and the worker serves normally afterwards (issue 32)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from ._bundles import SPIN
from ._harness import running_worker, spin_input, status_of

pytestmark = pytest.mark.slow

CAP = 4
"""``endpoints.max_concurrent_requests`` of the worker under test."""
WAVES = 5
"""Rounds of ``10 * CAP`` simultaneous requests."""
GROWTH_LIMIT_BYTES = 64 << 20
"""RSS the worker may gain over the waves: buffers come and go, nothing accumulates."""


async def _wave(url: str, n: int) -> list[tuple[str, Any]]:
    client = aioclient.InferenceServerClient(url)

    async def one(i: int) -> tuple[str, Any]:
        try:
            result = await client.infer(SPIN, [spin_input(20_000 + i)], client_timeout=30)
        except InferenceServerException as error:
            return status_of(error), None
        return "OK", (i, result.as_numpy("y"))

    try:
        return await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()


def test_ten_times_the_cap_sheds_the_excess_and_keeps_serving(
    repo: Path, cache_dir: Path, tmp_path: Path
) -> None:
    env = {
        "REACTANTSERVER_WORKER_CACHE_DIR": str(cache_dir),
        "REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "static",
        "REACTANTSERVER_WORKER_ENDPOINTS_MAX_CONCURRENT_REQUESTS": str(CAP),
    }
    with running_worker(repo, tmp_path / "worker.log", env) as worker:
        asyncio.run(_wave(worker.url, 1))  # warm: the first answer allocates for good
        assert worker.proc is not None
        process = psutil.Process(worker.proc.pid)
        before = process.memory_info().rss
        statuses: Counter[str] = Counter()
        for _ in range(WAVES):
            answers = asyncio.run(_wave(worker.url, 10 * CAP))
            statuses.update(status for status, _ in answers)
            for status, value in answers:
                if status == "OK":
                    i, y = value
                    assert float(y[0, 0]) == 20_000 + i  # each admitted answer is its own
        grown = process.memory_info().rss - before
        assert set(statuses) <= {"OK", "RESOURCE_EXHAUSTED"}, statuses
        assert statuses["RESOURCE_EXHAUSTED"] > 0, statuses
        assert statuses["OK"] >= WAVES * CAP, statuses  # at least the cap admitted per wave
        assert grown < GROWTH_LIMIT_BYTES, f"RSS grew {grown / 2**20:.1f} MiB"
        assert (
            worker.metric("reactantserver_worker_requests_shed_total")
            == statuses["RESOURCE_EXHAUSTED"]
        )
        assert worker.metric("reactantserver_worker_inflight_requests") == 0
        # Afterwards a request is served as usual.
        ((status, value),) = asyncio.run(_wave(worker.url, 1))
        assert status == "OK"
        assert np.isfinite(value[1]).all()
