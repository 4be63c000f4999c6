"""Fault: a client disconnecting mid-request.

The static worker's dispatch thread is held by a long ``spin`` execution. A *leaving* client
queues ``two_io`` requests behind it, cancels one explicitly and then closes its channel (which
cancels the rest); a *staying* client queues ``mlp`` requests at the same time. The leaver's
work must be dropped while still queued (counted as cancelled, never executed: ``two_io``'s
statistics do not move) and every request of the staying client must succeed.
"""

from __future__ import annotations

from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.worker_e2e._bundles import assert_close, load_weights, mlp_reference
from tests.worker_e2e._harness import (
    Answers,
    WorkerProcess,
    dispatch_held,
    infer_input,
    model_stats,
    rows,
    status_of,
    wait_for,
)

pytestmark = pytest.mark.slow

LEAVING = 8
STAYING = 8
X = rows(2, 16, seed=19)
A, B = rows(1, 8, seed=20), rows(1, 8, seed=21)
CANCELLED = "reactantserver_worker_requests_cancelled_total"


def _queued(worker: WorkerProcess, model: str) -> float:
    return worker.metric("reactantserver_worker_queue_depth", model=model)


def test_disconnected_clients_queued_work_is_dropped(
    worker: WorkerProcess, client: Any, capsys: Any
) -> None:
    before = model_stats(client, "two_io")
    cancelled = worker.metric(CANCELLED, model="two_io")
    expected = mlp_reference(load_weights(worker.repo / "mlp"), X)
    leaving, staying = Answers(LEAVING), Answers(STAYING)
    leaver = grpcclient.InferenceServerClient(worker.url)
    try:
        with dispatch_held(client, worker):
            calls = [
                leaver.async_infer(
                    "two_io",
                    [infer_input("a", A, "FP32"), infer_input("b", B, "FP32")],
                    leaving.callback(f"leave{i}"),
                )
                for i in range(LEAVING)
            ]
            for i in range(STAYING):
                client.async_infer("mlp", [infer_input("x", X, "FP32")], staying.callback(str(i)))
            wait_for(
                lambda: _queued(worker, "two_io") == LEAVING and _queued(worker, "mlp") == STAYING,
                "both clients' requests queued behind the spin",
            )
            calls[0].cancel()
            wait_for(
                lambda: worker.metric(CANCELLED, model="two_io") == cancelled + 1,
                "the explicitly cancelled request dropped",
            )
            leaver.close()  # the channel goes: every RPC still on it is cancelled
            wait_for(lambda: _queued(worker, "two_io") == 0, "the leaver's queue emptied")
            assert _queued(worker, "mlp") == STAYING
    finally:
        leaver.close()
    statuses = {status_of(error) for error, _ in leaving.wait().values()}
    assert statuses == {"CANCELLED"}, leaving.answers
    for key, (error, result) in staying.wait().items():
        assert error is None, (key, error)
        assert_close(result.as_numpy("logits"), expected)
    dropped = worker.metric(CANCELLED, model="two_io") - cancelled
    after = model_stats(client, "two_io")
    with capsys.disabled():
        print(
            f"\n[faults] disconnect: leaver sent={LEAVING} cancelled={dropped:g} "
            f"executed={after.execution_count - before.execution_count}; "
            f"staying sent={STAYING} ok={STAYING} failed=0"
        )
    assert dropped == LEAVING
    assert after.execution_count == before.execution_count
    assert after.inference_stats.success.count == before.inference_stats.success.count
    assert after.inference_count == before.inference_count
