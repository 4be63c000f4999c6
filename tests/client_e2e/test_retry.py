"""Retries on a worker that sheds, and the deadline while the device is busy."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from reactantserver import client as rc
from reactantserver.core.errors import ReactantError
from tests.worker_e2e._bundles import SPIN, SPIN_ITERATIONS, assert_close, mlp_reference
from tests.worker_e2e._harness import (
    Answers,
    WorkerProcess,
    model_stats,
    rows,
    spin_input,
    wait_for,
)

from ._helpers import dedicated_worker, device_held, status_name

pytestmark = pytest.mark.slow

DEADLINE_S = 0.5
HELD_ITERATIONS = 3 * SPIN_ITERATIONS
"""A few seconds of spin: far longer than two :data:`DEADLINE_S` budgets one after the other."""
PATIENT_S = 60.0
"""Budget of a request that waits out a spin by retrying (a bound, not an expectation)."""
PATIENT = rc.RetryPolicy(initial_backoff=0.05, max_backoff=0.5)


@pytest.fixture(scope="module")
def capped_worker(
    repo: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A worker serving ``spin`` and ``mlp`` with at most one request in flight."""
    tmp = tmp_path_factory.mktemp("capped")
    process = dedicated_worker(
        repo, cache_dir, tmp, [SPIN, "mlp"], ENDPOINTS_MAX_CONCURRENT_REQUESTS="1"
    )
    process.start()
    try:
        process.wait_ready()
        yield process
    finally:
        rc.shutdown()
        assert process.stop() == 0, process.log_tail()


@contextlib.contextmanager
def spinning(worker: WorkerProcess, iterations: float) -> Iterator[None]:
    """While inside, a spin holds the only in-flight place; it must succeed in the end."""
    with grpcclient.InferenceServerClient(worker.url) as triton:
        spins = Answers(1)
        triton.async_infer(SPIN, [spin_input(iterations)], spins.callback("long"))
        try:
            wait_for(
                lambda: worker.metric("reactantserver_worker_inflight_requests") == 1,
                "the spin in flight",
            )
            yield
        finally:
            ((error, result),) = spins.wait().values()
        assert error is None, error
        assert result.as_numpy("y").shape == (1, 16)


def test_shed_requests_are_retried_until_the_spin_ends(
    capped_worker: WorkerProcess, weights: dict[str, Any]
) -> None:
    worker = capped_worker
    x = rows(2, 16, seed=51)
    with spinning(worker, 2 * SPIN_ITERATIONS):
        shed = worker.metric("reactantserver_worker_requests_shed_total")

        # no retries: one attempt, RESOURCE_EXHAUSTED at once (sync and async)
        no_retry = rc.RetryPolicy(enabled=False)
        with rc.KServeModel(worker.url, "mlp", deadline=PATIENT_S, retry=no_retry) as once:
            with pytest.raises(grpc.RpcError) as caught:
                rc.infer_sync(once, [rc.InferInput("x", x)])
            assert status_name(caught.value) == "RESOURCE_EXHAUSTED"
            assert worker.metric("reactantserver_worker_requests_shed_total") == shed + 1

            with pytest.raises(grpc.RpcError) as caught:
                asyncio.run(_infer_async(once, x))
            assert status_name(caught.value) == "RESOURCE_EXHAUSTED"
            assert worker.metric("reactantserver_worker_requests_shed_total") == shed + 2

        # retries: shed while the spin runs, served once it is over
        with rc.KServeModel(worker.url, "mlp", deadline=PATIENT_S, retry=PATIENT) as model:
            response = rc.infer_sync(model, [rc.InferInput("x", x)], request_id="patient")
        assert worker.metric("reactantserver_worker_requests_shed_total") >= shed + 3
    assert response is not None
    assert response.id == "patient"
    assert_close(rc.InferOutput(response, "logits"), mlp_reference(weights["mlp"], x))


def test_async_shed_requests_are_retried(
    capped_worker: WorkerProcess, weights: dict[str, Any]
) -> None:
    worker = capped_worker
    x = rows(2, 16, seed=54)
    with spinning(worker, SPIN_ITERATIONS):
        shed = worker.metric("reactantserver_worker_requests_shed_total")
        with rc.KServeModel(worker.url, "mlp", deadline=PATIENT_S, retry=PATIENT) as model:
            response = asyncio.run(_infer_async(model, x))
        assert worker.metric("reactantserver_worker_requests_shed_total") >= shed + 1
    assert response is not None
    assert_close(rc.InferOutput(response, "logits"), mlp_reference(weights["mlp"], x))


def test_deadline_while_the_device_is_held(
    worker: WorkerProcess, triton: Any, weights: dict[str, Any]
) -> None:
    x = rows(3, 16, seed=52)
    good = rows(2, 16, seed=53)
    before = model_stats(triton, "mlp")
    elapsed: list[float] = []
    errors: list[BaseException] = []
    with (
        rc.KServeModel(worker.url, "mlp", deadline=DEADLINE_S) as model,
        device_held(triton, worker, HELD_ITERATIONS),
    ):
        for call in (
            lambda: rc.infer_sync(model, [rc.InferInput("x", x)]),
            lambda: asyncio.run(_infer_async(model, x)),
        ):
            started = time.monotonic()
            with pytest.raises((grpc.RpcError, ReactantError)) as caught:
                call()
            elapsed.append(time.monotonic() - started)
            errors.append(caught.value)
    for error in errors:
        assert status_name(error) == "DEADLINE_EXCEEDED", error
    for seconds in elapsed:
        assert 0.8 * DEADLINE_S <= seconds < 5.0, elapsed
    # FIFO behind the expired requests: once this one is served, they were purged unexecuted
    with rc.KServeModel(worker.url, "mlp") as model:
        response = rc.infer_sync(model, [rc.InferInput("x", good)])
    assert response is not None
    assert_close(rc.InferOutput(response, "logits"), mlp_reference(weights["mlp"], good))
    after = model_stats(triton, "mlp")
    assert after.execution_count - before.execution_count == 1
    assert after.inference_count - before.inference_count == len(good)


async def _infer_async(model: rc.KServeModel, x: np.ndarray[Any, Any]) -> Any:
    return await rc.infer_async(model, [rc.InferInput("x", x)])
