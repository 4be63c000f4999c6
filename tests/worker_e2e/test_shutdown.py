"""A worker of its own: the in-flight cap, then a graceful SIGTERM."""

from __future__ import annotations

import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from ._bundles import HOOK_GATE, HOOKY, SPIN, assert_close, mlp_reference
from ._harness import (
    WAIT_S,
    WorkerProcess,
    dispatch_held,
    infer_input,
    message_of,
    open_channel,
    rows,
    status_of,
    wait_for,
)

pytestmark = pytest.mark.slow

GRACE_S = 60.0
"""Generous: the drain ends as soon as the queue is empty, the grace is only a bound."""
CAP = 4


@pytest.fixture
def gates(tmp_path: Path) -> Path:
    """The directory where a test opens the ``HOOK_GATE`` gates of ``hooky``."""
    path = tmp_path / "gates"
    path.mkdir()
    return path


@pytest.fixture
def own_worker(repo: Path, cache_dir: Path, tmp_path: Path, gates: Path) -> Iterator[WorkerProcess]:
    """A worker serving ``hooky`` and ``spin`` with at most :data:`CAP` requests in flight."""
    models = tmp_path / "models"
    models.mkdir()
    for name in (HOOKY, SPIN):
        shutil.copytree(repo / name, models / name)
    env = {
        "REACTANTSERVER_WORKER_CACHE_DIR": str(cache_dir),
        "REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "static",
        "REACTANTSERVER_WORKER_ENDPOINTS_MAX_CONCURRENT_REQUESTS": str(CAP),
        "REACTANTSERVER_WORKER_SHUTDOWN_GRACE_SECONDS": str(GRACE_S),
        "HOOKY_GATE_DIR": str(gates),
    }
    process = WorkerProcess(models, tmp_path / "worker.log", env)
    process.start()
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


class _Pending:
    """One ``async_infer`` whose answer arrives later."""

    def __init__(self, client: Any, model: str, x: np.ndarray[Any, Any]) -> None:
        self.x = x
        self.answer: tuple[Any, Any] | None = None
        self._done = threading.Event()
        client.async_infer(model, [infer_input("x", x, "FP32")], self._callback)

    def _callback(self, result: Any, error: Any) -> None:
        self.answer = (result, error)
        self._done.set()

    def status(self) -> str:
        """``OK`` or the status name of the error."""
        assert self._done.wait(WAIT_S), "no answer"
        assert self.answer is not None
        return "OK" if self.answer[1] is None else status_of(self.answer[1])

    def result(self) -> Any:
        assert self._done.wait(WAIT_S), "no answer"
        assert self.answer is not None
        result, error = self.answer
        assert error is None, f"{status_of(error)}: {message_of(error)}"
        return result


def _gated(gate: int, seed: int) -> np.ndarray[Any, Any]:
    """A ``hooky`` input whose preprocess hook waits for ``gate-<gate>`` (see ``gates``)."""
    x = rows(1, 16, seed=seed)
    x[0, 0], x[0, 1] = HOOK_GATE, gate
    return x


def _serving(worker: WorkerProcess) -> bool:
    with open_channel(worker.url) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        try:
            response = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        except grpc.RpcError:
            return False
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def test_inflight_cap_then_graceful_sigterm(
    own_worker: WorkerProcess, weights: dict[str, Any], gates: Path
) -> None:
    worker = own_worker
    with grpcclient.InferenceServerClient(worker.url) as client:
        # -- the in-flight cap: CAP requests held in their hook, the next one is shed at once
        held = [_Pending(client, HOOKY, _gated(gate=0, seed=i)) for i in range(CAP)]
        wait_for(lambda: _inflight(worker) == CAP, f"{CAP} requests in flight")
        with pytest.raises(InferenceServerException) as caught:
            client.infer(HOOKY, [infer_input("x", rows(1, 16, seed=9), "FP32")])
        assert status_of(caught.value) == "RESOURCE_EXHAUSTED", caught.value
        assert worker.metric("reactantserver_worker_requests_shed_total") >= 1
        (gates / "gate-0").touch()
        for pending in held:
            got = pending.result().as_numpy("logits")
            assert_close(got, mlp_reference(weights[HOOKY], pending.x))
        wait_for(lambda: _inflight(worker) == 0, "the held requests to leave")

        # -- SIGTERM with a request in its hook, one executing and one queued behind it: the
        #    queued work drains. The hooked request goes first so that the spin only has to
        #    outlast the signal, not the set-up.
        in_hook = _Pending(client, HOOKY, _gated(gate=1, seed=20))
        wait_for(lambda: _inflight(worker) == 1, "a request in its preprocess hook")
        with dispatch_held(client, worker, already_in_flight=1):
            worker.signal(signal.SIGTERM)
            # health flips first, then new work is refused
            wait_for(lambda: not _serving(worker), "health to leave SERVING")
            with pytest.raises(InferenceServerException) as refused:
                client.infer(HOOKY, [infer_input("x", rows(1, 16, seed=21), "FP32")])
            assert status_of(refused.value) == "UNAVAILABLE", refused.value
            (gates / "gate-1").touch()
        # the request that was in its hook gets exactly one answer (a
        # request reaching the queue after shutdown began is refused)
        assert in_hook.status() in {"OK", "UNAVAILABLE"}
    assert worker.wait(GRACE_S) == 0, worker.log_tail()


def _inflight(worker: WorkerProcess) -> float:
    return worker.metric("reactantserver_worker_inflight_requests")
