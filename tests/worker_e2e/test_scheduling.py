"""Deadlines, statistics and coalescing, observed through ModelStatistics."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from ._bundles import HOOK_SLEEP, HOOKY, assert_close, mlp_reference, two_io_reference
from ._harness import (
    Answers,
    WorkerProcess,
    dispatch_held,
    infer_input,
    message_of,
    model_stats,
    rows,
    running_worker,
    status_of,
    wait_for,
)

pytestmark = pytest.mark.slow

HOOK_SLEEP_S = 0.6
"""How long the slow hook holds a request before it can be queued."""
CLIENT_TIMEOUT_S = 0.05
"""A budget well inside :data:`HOOK_SLEEP_S` and the spin of ``dispatch_held``."""
BURST = 24


def _sleepy(seconds: float = HOOK_SLEEP_S) -> list[Any]:
    x = rows(1, 16, seed=31)
    x[0, 0], x[0, 1] = HOOK_SLEEP, seconds
    return [infer_input("x", x, "FP32")]


def _deadline_error(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    assert status_of(caught.value) == "DEADLINE_EXCEEDED", caught.value
    return caught.value


def test_expired_budget_is_never_dispatched(client: Any, weights: dict[str, Any]) -> None:
    x = rows(2, 16, seed=32)
    inputs = [infer_input("x", x, "FP32")]
    before = model_stats(client, "mlp")
    # Triton's `timeout` (µs) and our `reactant_timeout_ns`: 1 unit is over before admission
    error = _deadline_error(client.infer, "mlp", inputs, timeout=1)
    assert "mlp" in message_of(error)
    assert "\n" not in message_of(error)
    _deadline_error(client.infer, "mlp", inputs, parameters={"reactant_timeout_ns": 1})
    after = model_stats(client, "mlp")
    assert after.execution_count == before.execution_count
    assert after.inference_count == before.inference_count
    # and the next request is served normally
    got = client.infer("mlp", inputs).as_numpy("logits")
    assert_close(got, mlp_reference(weights["mlp"], x))


def test_deadline_passing_in_the_hook_is_not_dispatched(client: Any) -> None:
    before = model_stats(client, HOOKY)
    # the budget ends while the preprocess hook still sleeps: the server answers, not gRPC
    error = _deadline_error(client.infer, HOOKY, _sleepy(), timeout=int(CLIENT_TIMEOUT_S * 1e6))
    assert HOOKY in message_of(error)
    after = model_stats(client, HOOKY)
    assert after.execution_count == before.execution_count
    assert after.inference_count == before.inference_count


def test_deadlines_expiring_in_the_queue_are_not_dispatched(
    client: Any, worker: WorkerProcess, weights: dict[str, Any]
) -> None:
    expired_rows = rows(3, 16, seed=33)
    good = rows(2, 16, seed=34)
    before = model_stats(client, "mlp")
    answers = Answers(2)
    with dispatch_held(client, worker):
        # both expire while queued behind the spin: the gRPC deadline (tritonclient's
        # client_timeout) and Triton's `timeout` parameter, answered by the server's purge
        for key, budget in (
            ("client_timeout", {"client_timeout": CLIENT_TIMEOUT_S}),
            ("timeout", {"timeout": int(CLIENT_TIMEOUT_S * 1e6)}),
        ):
            client.async_infer(
                "mlp", [infer_input("x", expired_rows, "FP32")], answers.callback(key), **budget
            )
        expired = answers.wait()
    for key, (error, _) in expired.items():
        assert error is not None, key
        assert status_of(error) == "DEADLINE_EXCEEDED", (key, error)
    assert "mlp" in message_of(expired["timeout"][0])
    # FIFO behind the expired requests: once this one is served, they were purged
    got = client.infer("mlp", [infer_input("x", good, "FP32")]).as_numpy("logits")
    assert_close(got, mlp_reference(weights["mlp"], good))
    after = model_stats(client, "mlp")
    assert after.execution_count - before.execution_count == 1
    assert after.inference_count - before.inference_count == len(good)


def test_statistics_values(client: Any, weights: dict[str, Any]) -> None:
    before = model_stats(client, "two_io")
    started_ms = time.time() * 1000
    sizes = (1, 2, 5)  # dispatched alone at compiled sizes 1, 8 and 8
    for n in sizes:
        a, b = rows(n, 8, seed=40 + n), rows(n, 8, seed=50 + n)
        result = client.infer("two_io", [infer_input("a", a, "FP32"), infer_input("b", b, "FP32")])
        want_sum, _ = two_io_reference(weights["two_io"], a, b)
        assert_close(result.as_numpy("sum"), want_sum)
    after = model_stats(client, "two_io")
    assert (after.name, after.version) == ("two_io", "1")
    assert after.inference_count - before.inference_count == sum(sizes)
    assert after.execution_count - before.execution_count == len(sizes)
    assert after.last_inference >= started_ms - 1000
    assert after.last_inference <= time.time() * 1000 + 1000
    stats, old = after.inference_stats, before.inference_stats
    assert stats.success.count - old.success.count == len(sizes)
    assert stats.success.ns > old.success.ns
    assert stats.fail.count == old.fail.count
    assert stats.queue.count - old.queue.count == len(sizes)
    for phase in ("compute_input", "compute_infer", "compute_output"):
        assert getattr(stats, phase).count - getattr(old, phase).count == len(sizes), phase
        assert getattr(stats, phase).ns > getattr(old, phase).ns, phase

    def by_size(entry: Any) -> dict[int, int]:
        return {b.batch_size: b.compute_infer.count for b in entry.batch_stats}

    grown = by_size(after)
    old_sizes = by_size(before)
    assert set(grown) <= {1, 8}
    assert grown.get(1, 0) - old_sizes.get(1, 0) == 1
    assert grown.get(8, 0) - old_sizes.get(8, 0) == 2


def test_concurrent_requests_coalesce_and_keep_their_rows(
    client: Any, worker: WorkerProcess, weights: dict[str, Any]
) -> None:
    xs = [rows(2 + i % 2, 16, seed=90 + i) for i in range(BURST)]
    before = model_stats(client, "mlp")
    answers = Answers(BURST)
    with dispatch_held(client, worker):
        for i, x in enumerate(xs):
            client.async_infer(
                "mlp", [infer_input("x", x, "FP32")], answers.callback(str(i)), request_id=str(i)
            )
        wait_for(
            lambda: worker.metric("reactantserver_worker_queue_depth", model="mlp") == BURST,
            "the burst to queue behind the spin",
        )
        results = answers.wait()
    after = model_stats(client, "mlp")
    for i, x in enumerate(xs):
        error, result = results[str(i)]
        assert error is None, error
        assert result.get_response().id == str(i)
        assert_close(result.as_numpy("logits"), mlp_reference(weights["mlp"], x))
    assert after.inference_count - before.inference_count == sum(len(x) for x in xs)
    # 24 requests (60 rows) queued together: batch planning takes the largest compiled
    # size <= the queued rows, so 32, then 8s (e.g. 32 + 8 + 8 + 8 + a padded 8 = 5)
    executions = after.execution_count - before.execution_count
    assert 2 <= executions <= BURST // 4, executions
    grown = {b.batch_size: b.compute_infer.count for b in after.batch_stats}
    old = {b.batch_size: b.compute_infer.count for b in before.batch_stats}
    assert grown.get(32, 0) - old.get(32, 0) >= 1
    assert sum(grown.values()) - sum(old.values()) == executions


QUEUE_DELAY_US = 1_000_000
"""Long enough that a burst sent back to back always lands inside one wait."""


def test_queue_delay_coalesces_requests_sent_to_an_idle_worker(
    repo: Path, cache_dir: Path, tmp_path: Path, weights: dict[str, Any]
) -> None:
    env = {
        "REACTANTSERVER_WORKER_CACHE_DIR": str(cache_dir),
        "REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "static",
        "REACTANTSERVER_WORKER_SCHEDULER_MAX_QUEUE_DELAY_MICROSECONDS": str(QUEUE_DELAY_US),
    }
    # mlp compiles 1, 8 and 32: eight one-row requests fill one 8.
    xs = [rows(1, 16, seed=140 + i) for i in range(8)]
    with (
        running_worker(repo, tmp_path / "worker.log", env) as worker,
        grpcclient.InferenceServerClient(worker.url) as client,
    ):
        config = client.get_model_config("mlp", as_json=True)["config"]
        assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == QUEUE_DELAY_US
        answers = Answers(len(xs))
        for i, x in enumerate(xs):
            client.async_infer("mlp", [infer_input("x", x, "FP32")], answers.callback(str(i)))
        results = answers.wait()
        stats = model_stats(client, "mlp")
    for i, x in enumerate(xs):
        error, result = results[str(i)]
        assert error is None, error
        assert_close(result.as_numpy("logits"), mlp_reference(weights["mlp"], x))
    # Without the delay an idle worker runs each of these on arrival (eight executions).
    assert (stats.inference_count, stats.execution_count) == (len(xs), 1), stats
    assert [b.batch_size for b in stats.batch_stats] == [8]
