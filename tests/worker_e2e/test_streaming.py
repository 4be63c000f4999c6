"""``ModelStreamInfer`` through tritonclient's sync and asyncio streams."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient

from ._bundles import HOOK_SLEEP, HOOKY, assert_close, mlp_reference
from ._harness import WAIT_S, WorkerProcess, infer_input, raw_request, response_array, rows

pytestmark = pytest.mark.slow

SLOW_S = 2.0
"""How long the ``slow`` request sleeps in its hook: far longer than the other two need."""


def test_stream_correlates_by_id_and_survives_a_bad_request(
    worker: WorkerProcess, weights: dict[str, Any]
) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    xs = {f"s{i}": rows(1 + i % 3, 16, seed=60 + i) for i in range(8)}
    with grpcclient.InferenceServerClient(worker.url) as client:
        client.start_stream(lambda result, error: answers.put((result, error)))
        try:
            first = list(xs.items())[:4]
            later = list(xs.items())[4:]
            for rid, x in first:
                client.async_stream_infer("mlp", [infer_input("x", x, "FP32")], request_id=rid)
            bad = rows(1, 15, seed=0)  # wrong fixed extent
            client.async_stream_infer("mlp", [infer_input("x", bad, "FP32")], request_id="bad")
            got = [answers.get(timeout=WAIT_S) for _ in range(len(first) + 1)]
            # the stream is still open: more requests on it succeed
            for rid, x in later:
                client.async_stream_infer("mlp", [infer_input("x", x, "FP32")], request_id=rid)
            got += [answers.get(timeout=WAIT_S) for _ in later]
        finally:
            client.stop_stream()
    errors = [error for result, error in got if error is not None]
    assert len(errors) == 1, errors
    message = str(errors[0].message())
    assert "mlp" in message
    assert "\n" not in message
    results = {result.get_response().id: result for result, error in got if error is None}
    assert set(results) == set(xs)
    for rid, x in xs.items():
        assert_close(results[rid].as_numpy("logits"), mlp_reference(weights["mlp"], x))
    assert answers.empty()


def test_asyncio_stream(worker: WorkerProcess, weights: dict[str, Any]) -> None:
    xs = {f"a{i}": rows(2, 16, seed=70 + i) for i in range(6)}

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for rid, x in xs.items():
            tensor = aioclient.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            yield {"model_name": "mlp", "inputs": [tensor], "request_id": rid}
        bad = aioclient.InferInput("x", [1, 16], "INT32")
        bad.set_data_from_numpy(np.zeros((1, 16), np.int32))
        yield {"model_name": "mlp", "inputs": [bad], "request_id": "bad"}

    async def run() -> list[tuple[Any, Any]]:
        async with aioclient.InferenceServerClient(worker.url) as client:
            stream = client.stream_infer(requests())
            # the server ends the stream once the client half-closed and all answers are out
            return [(result, error) async for result, error in stream]

    got = asyncio.run(asyncio.wait_for(run(), WAIT_S))
    assert len(got) == len(xs) + 1
    assert sum(error is not None for _, error in got) == 1
    results = {result.get_response().id: result for result, error in got if error is None}
    assert set(results) == set(xs)
    for rid, x in xs.items():
        assert_close(results[rid].as_numpy("logits"), mlp_reference(weights["mlp"], x))


def test_raw_stream_error_carries_the_id_and_answers_in_completion_order(
    stub: Any, weights: dict[str, Any]
) -> None:
    x = rows(2, 16, seed=75)
    slow = rows(1, 16, seed=76)
    slow[0, 0], slow[0, 1] = HOOK_SLEEP, SLOW_S
    wrong = rows(2, 15, seed=0)
    requests = [
        raw_request(HOOKY, [("x", "FP32", slow.shape, slow.tobytes())], request_id="slow"),
        raw_request("mlp", [("x", "FP32", wrong.shape, wrong.tobytes())], request_id="bad"),
        raw_request("mlp", [("x", "FP32", x.shape, x.tobytes())], request_id="fast"),
    ]
    responses = list(stub.ModelStreamInfer(iter(requests), timeout=WAIT_S))
    by_id = {r.infer_response.id: r for r in responses}
    assert len(responses) == 3
    assert set(by_id) == {"slow", "bad", "fast"}
    bad = by_id["bad"]
    assert bad.error_message
    assert (bad.infer_response.model_name, bad.infer_response.id) == ("mlp", "bad")
    assert not bad.infer_response.outputs
    assert not by_id["fast"].error_message
    assert_close(response_array(by_id["fast"].infer_response, 0), mlp_reference(weights["mlp"], x))
    # completion order: the request held in its hook is answered last
    assert responses[-1].infer_response.id == "slow"
    assert not responses[-1].error_message
