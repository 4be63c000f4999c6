"""ModelInfer and ModelStreamInfer through the gateway: a worker's answers, spread round robin."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.worker_e2e._bundles import SPIN, assert_close
from tests.worker_e2e._harness import (
    WAIT_S,
    Answers,
    WorkerProcess,
    infer_input,
    model_stats,
    rows,
    spin_input,
    status_of,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def direct(workers: list[WorkerProcess]) -> Iterator[list[Any]]:
    """One ``tritonclient.grpc`` client per session worker (bypassing the gateway)."""
    clients = [grpcclient.InferenceServerClient(worker.url) for worker in workers]
    try:
        yield clients
    finally:
        for each in clients:
            each.close()


def _idle(workers: list[WorkerProcess]) -> None:
    """Wait until no worker runs anything (a timed-out spin keeps a worker busy a while)."""
    wait_for(
        lambda: all(
            worker.metric("reactantserver_worker_inflight_requests") == 0 for worker in workers
        ),
        "idle workers",
    )


def _successes(clients: list[Any], model: str) -> list[int]:
    return [int(model_stats(each, model).inference_stats.success.count) for each in clients]


def test_infer_matches_a_direct_worker(client: Any, direct: list[Any]) -> None:
    x = rows(5, 16, seed=11)
    a, b = rows(3, 8, seed=12), rows(3, 8, seed=13)
    for _ in range(2):  # both workers answer one of each
        mine = client.infer("mlp", [infer_input("x", x, "FP32")]).as_numpy("logits")
        theirs = direct[0].infer("mlp", [infer_input("x", x, "FP32")]).as_numpy("logits")
        assert_close(mine, theirs)
        pair = [infer_input("a", a, "FP32"), infer_input("b", b, "FP32")]
        mine_io = client.infer("two_io", pair)
        theirs_io = direct[1].infer("two_io", pair)
        for name in ("sum", "dot"):
            assert_close(mine_io.as_numpy(name), theirs_io.as_numpy(name))


def test_result_carries_the_request_id(client: Any) -> None:
    x = rows(1, 16, seed=14)
    result = client.infer("mlp", [infer_input("x", x, "FP32")], request_id="req-7")
    assert result.get_response().id == "req-7"
    assert result.get_response().model_name == "mlp"


def test_requests_alternate_between_the_workers(client: Any, direct: list[Any]) -> None:
    before = _successes(direct, "cnn")
    image = rows(2, 28 * 28, seed=15).reshape(2, 1, 28, 28)
    for _ in range(4):
        client.infer("cnn", [infer_input("image", image, "FP32")])
    after = _successes(direct, "cnn")
    assert [new - old for new, old in zip(after, before, strict=True)] == [2, 2]


def test_async_infer_through_the_gateway(client: Any, direct: list[Any]) -> None:
    before = _successes(direct, "mlp")
    answers = Answers(8)
    inputs = {f"r{i}": rows(1, 16, seed=100 + i) for i in range(8)}
    for key, x in inputs.items():
        client.async_infer("mlp", [infer_input("x", x, "FP32")], answers.callback(key))
    for key, (error, result) in answers.wait().items():
        assert error is None, (key, error)
        expected = direct[0].infer("mlp", [infer_input("x", inputs[key], "FP32")])
        assert_close(result.as_numpy("logits"), expected.as_numpy("logits"))
    grown = [new - old for new, old in zip(_successes(direct, "mlp"), before, strict=True)]
    assert grown == [4 + 8, 4]  # round robin, plus the 8 references from the first worker


def test_stream_through_the_gateway(client: Any, direct: list[Any]) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    good = {f"s{i}": rows(1 + i, 16, seed=200 + i) for i in range(5)}
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for key, x in good.items():
            client.async_stream_infer("mlp", [infer_input("x", x, "FP32")], request_id=key)
        bad = rows(1, 15, seed=9)
        client.async_stream_infer("mlp", [infer_input("x", bad, "FP32")], request_id="bad")
        client.async_stream_infer("no_such_model", [infer_input("x", bad, "FP32")])
        got = [answers.get(timeout=WAIT_S) for _ in range(len(good) + 2)]
    finally:
        client.stop_stream()
    errors = [error for _, error in got if error is not None]
    results = {result.get_response().id: result for result, error in got if error is None}
    assert len(errors) == 2, errors
    assert all(isinstance(error, InferenceServerException) for error in errors)
    assert any("no_such_model" in str(error.message()) for error in errors), errors
    assert set(results) == set(good)
    for key, x in good.items():
        expected = direct[0].infer("mlp", [infer_input("x", x, "FP32")]).as_numpy("logits")
        assert_close(results[key].as_numpy("logits"), expected)


def test_client_deadline_shorter_than_the_work(client: Any, workers: list[WorkerProcess]) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.infer(SPIN, [spin_input()], client_timeout=0.3)
    assert status_of(caught.value) == "DEADLINE_EXCEEDED"
    _idle(workers)
    x = rows(1, 16, seed=16)
    assert client.infer("mlp", [infer_input("x", x, "FP32")]).as_numpy("logits").shape == (1, 4)


def test_timeout_parameter_bounds_the_request(client: Any, workers: list[WorkerProcess]) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.infer(SPIN, [spin_input()], timeout=300_000)  # microseconds
    assert status_of(caught.value) == "DEADLINE_EXCEEDED"
    _idle(workers)
    result = client.infer(SPIN, [spin_input(1)], timeout=30_000_000)
    y = result.as_numpy("y")
    assert y.shape == (1, 16)
    assert float(y[0, 0]) == 1.0


def test_short_spin_answers_within_a_generous_deadline(client: Any) -> None:
    x = np.zeros((1, 16), np.float32)
    x[0, 0] = 3
    result = client.infer(SPIN, [infer_input("x", x, "FP32")], client_timeout=WAIT_S)
    assert float(result.as_numpy("y")[0, 0]) == 3.0
