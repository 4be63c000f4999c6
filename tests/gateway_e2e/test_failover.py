"""Failover: a worker dies under load, then every worker.

Each test owns its workers (they are killed) and its gateway; workers start on the session
``cache_dir`` and so do not compile.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests._e2e_support import worker_env
from tests.worker_e2e._harness import (
    STOP_TIMEOUT_S,
    WorkerProcess,
    infer_input,
    rows,
    status_of,
    wait_for,
)

from ._gateway import GatewayProcess, running_gateway

pytestmark = pytest.mark.slow

CONCURRENCY = 4
X = rows(1, 16, seed=41)


@contextlib.contextmanager
def killable_workers(
    repo: Path, cache_dir: Path, directory: Path, count: int = 2
) -> Iterator[list[WorkerProcess]]:
    """``count`` ready workers the test may SIGKILL; survivors are stopped cleanly on exit."""
    started: list[WorkerProcess] = []
    try:
        for i in range(count):
            env = {**worker_env(cache_dir), "REACTANTSERVER_WORKER_NAME": f"k{i}"}
            worker = WorkerProcess(repo, directory / f"killable{i}.log", env)
            worker.start()
            started.append(worker)
        for worker in started:
            worker.wait_ready()
        yield started
    finally:
        for worker in started:
            assert worker.proc is not None
            alive = worker.proc.poll() is None
            code = worker.stop()
            if alive:
                assert code == 0, worker.log_tail(3000)


def _kill(worker: WorkerProcess) -> None:
    worker.signal(signal.SIGKILL)
    worker.wait(STOP_TIMEOUT_S)


class Load:
    """``CONCURRENCY`` threads sending ``mlp`` requests until stopped; outcomes by start time."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.outcomes: list[tuple[float, str]] = []  # (monotonic start, status or "OK")
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(CONCURRENCY)
        self._futures = [self._pool.submit(self._run) for _ in range(CONCURRENCY)]

    def _run(self) -> None:
        with grpcclient.InferenceServerClient(self.url) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    client.infer("mlp", [infer_input("x", X, "FP32")], client_timeout=30)
                    outcome = "OK"
                except InferenceServerException as error:
                    outcome = status_of(error)
                with self._lock:
                    self.outcomes.append((started, outcome))

    def count(self) -> int:
        """Requests answered so far."""
        with self._lock:
            return len(self.outcomes)

    def finish(self) -> list[tuple[float, str]]:
        """Stop the threads and return every outcome."""
        self.stop.set()
        for future in self._futures:
            future.result(timeout=60)
        self._pool.shutdown()
        return self.outcomes


def test_a_killed_worker_loses_no_request(repo: Path, cache_dir: Path, tmp_path: Path) -> None:
    with (
        killable_workers(repo, cache_dir, tmp_path) as (first, second),
        running_gateway([first, second], tmp_path, name="gateway-failover") as gateway,
        grpcclient.InferenceServerClient(gateway.url) as client,
    ):
        load = Load(gateway.url)
        try:
            wait_for(lambda: load.count() >= 40, "traffic before the kill")
            killed_at = time.monotonic()
            _kill(second)
            counted = load.count()
            wait_for(lambda: load.count() >= counted + 200, "traffic after the kill")
            assert client.is_server_ready()
        finally:
            outcomes = load.finish()
        failed = [(t, outcome) for t, outcome in outcomes if outcome != "OK"]
        # Only requests in flight on the killed worker may fail (and as UNAVAILABLE); the
        # gateway retries those on the survivor, so in practice none fails at all.
        assert all(outcome == "UNAVAILABLE" for _, outcome in failed), failed
        assert len(failed) <= CONCURRENCY, failed
        assert [f for f in failed if f[0] > killed_at] == [], failed
        assert gateway.metric("reactantserver_gateway_failovers_total") >= 1
        wait_for(
            lambda: gateway.metric("reactantserver_gateway_worker_ready", worker="w1") == 0,
            "w1 seen not ready",
        )
        assert gateway.metric("reactantserver_gateway_worker_ready", worker="w0") == 1
        assert client.is_server_ready()
        assert gateway.http_get("/readyz")[0] == 200
        assert client.infer("mlp", [infer_input("x", X, "FP32")]).as_numpy("logits").shape == (
            1,
            4,
        )
        _shm_with_a_dead_worker(client, first)


def _shm_with_a_dead_worker(client: Any, survivor: WorkerProcess) -> None:
    """Register rolls back on the survivor; unregister needs only one."""
    key = f"/rs_gw_dead_{os.getpid()}"
    handle = shm.create_shared_memory_region("gw_dead", key, 64)
    try:
        with grpcclient.InferenceServerClient(survivor.url) as direct:
            with pytest.raises(InferenceServerException) as caught:
                client.register_system_shared_memory("gw_dead", key, 64)
            assert status_of(caught.value) == "FAILED_PRECONDITION", caught.value
            assert "gw_dead" not in direct.get_system_shared_memory_status().regions
            direct.register_system_shared_memory("gw_dead", key, 64)
            client.unregister_system_shared_memory("gw_dead")  # OK: one worker succeeded
            assert "gw_dead" not in direct.get_system_shared_memory_status().regions
    finally:
        shm.destroy_shared_memory_region(handle)


def _health(gateway: GatewayProcess) -> int:
    with grpc.insecure_channel(gateway.url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        return int(answer.status)


def test_all_workers_dead_is_unavailable_and_not_ready(
    repo: Path, cache_dir: Path, tmp_path: Path
) -> None:
    with (
        killable_workers(repo, cache_dir, tmp_path) as (first, second),
        running_gateway([first, second], tmp_path, name="gateway-orphan") as gateway,
        grpcclient.InferenceServerClient(gateway.url) as client,
    ):
        assert client.infer("mlp", [infer_input("x", X, "FP32")]).as_numpy("logits").shape == (
            1,
            4,
        )
        _kill(first)
        _kill(second)
        for _ in range(3):  # before and after the probe notices
            with pytest.raises(InferenceServerException) as caught:
                client.infer("mlp", [infer_input("x", X, "FP32")], client_timeout=30)
            assert status_of(caught.value) in {"UNAVAILABLE", "NOT_FOUND"}, caught.value
        wait_for(lambda: not client.is_server_ready(), "the gateway not ready")
        assert client.is_server_live()
        assert gateway.http_get("/readyz")[0] == 503
        assert gateway.http_get("/healthz")[0] == 200
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        wait_for(lambda: _health(gateway) == not_serving, "health NOT_SERVING")
        with pytest.raises(InferenceServerException) as caught:
            client.infer("mlp", [infer_input("x", X, "FP32")], client_timeout=30)
        assert status_of(caught.value) == "UNAVAILABLE", caught.value
