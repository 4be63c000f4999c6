"""The gateway end-to-end harness: a real ``reactantserver-gateway`` in front of real workers.

The gateway runs as ``python -m reactantserver.gateway --config FILE`` with a ``gateway.yml``
written by the test (its own free ports, the workers' gRPC and HTTP addresses); clients talk to
it with ``tritonclient.grpc`` exactly as they would to a worker.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import yaml

from tests.worker_e2e._bundles import ROOT
from tests.worker_e2e._harness import (
    STARTUP_TIMEOUT_S,
    WorkerProcess,
    free_port,
    stop_process,
    sum_samples,
    wait_server_ready,
    worker_logs,
)

__all__ = [
    "GATEWAYS",
    "LPT",
    "GatewayProcess",
    "log_sections",
    "raw_unary",
    "running_gateway",
    "running_workers",
    "sum_samples",
]

LPT: dict[str, Any] = {
    "scheduling": {
        "mode": "lpt_packing",
        "first_rebalance_compute_seconds": 1e-6,
        "rebalance_compute_seconds": 1e-6,
        "compaction_mode": "off",
    },
    "startup_wait_seconds": 60,
}
"""Gateway settings: ``lpt_packing`` repacking after the first microsecond of compute.

Its workers must run discipline ``fifo`` (``lpt_packing`` refuses ``fair``).
"""


class GatewayProcess:
    """One ``reactantserver-gateway`` subprocess over ``workers``, with a captured log."""

    def __init__(
        self,
        workers: Sequence[WorkerProcess],
        directory: Path,
        *,
        settings: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        name: str = "gateway",
    ) -> None:
        self.workers = list(workers)
        self.grpc_port = free_port()
        self.http_port = free_port()
        while self.http_port == self.grpc_port:
            self.http_port = free_port()
        self.log = directory / f"{name}.log"
        self.config_file = directory / f"{name}.yml"
        config: dict[str, Any] = {
            "listen": {
                "grpc": f"127.0.0.1:{self.grpc_port}",
                "metrics": f"127.0.0.1:{self.http_port}",
            },
            "endpoints": [worker.url for worker in self.workers],
            "metrics_endpoints": [f"127.0.0.1:{worker.http_port}" for worker in self.workers],
            "worker_names": [f"w{i}" for i in range(len(self.workers))],
            "health": {"interval_seconds": 0.5},
        }
        for key, value in (settings or {}).items():
            config[key] = value
        self.config_file.write_text(yaml.safe_dump(config))
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``host:port`` of the gateway's gRPC listener."""
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> None:
        """Spawn the process (returns at once; see :meth:`wait_ready`)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("REACTANTSERVER_GATEWAY_")}
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        command = [
            sys.executable,
            "-m",
            "reactantserver.gateway",
            "--config",
            str(self.config_file),
        ]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        GATEWAYS.append(self)

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Poll ``ServerReady`` through the gateway until true (fails with the log)."""
        assert self.proc is not None
        wait_server_ready(self.url, self.proc, self.log_tail, timeout_s, "gateway", poll_s=0.1)

    def stop(self) -> int | None:
        """SIGTERM, wait, then SIGKILL; the exit status (``None`` if never started)."""
        return stop_process(self.proc)

    def log_tail(self, nchars: int = 12000) -> str:
        """The end of the gateway's stdout + stderr."""
        if not self.log.exists():
            return "(no log)"
        return self.log.read_text(errors="replace")[-nchars:]

    def http_get(self, path: str) -> tuple[int, str]:
        """``(status, body)`` of ``GET path`` on the gateway's HTTP port."""
        url = f"http://127.0.0.1:{self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            with error:
                return error.code, error.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """Σ of the samples called ``name`` whose labels include ``labels`` (0 when none)."""
        status, text = self.http_get("/metrics")
        assert status == 200
        return sum_samples(text, name, **labels)


GATEWAYS: list[GatewayProcess] = []
"""Every gateway started by this test session (their logs are attached to failures)."""


@contextlib.contextmanager
def running_gateway(
    workers: Sequence[WorkerProcess],
    directory: Path,
    *,
    settings: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    name: str = "gateway",
) -> Iterator[GatewayProcess]:
    """A ready gateway over ``workers``; on exit it is stopped and must have exited with 0."""
    gateway = GatewayProcess(workers, directory, settings=settings, env=env, name=name)
    gateway.start()
    try:
        gateway.wait_ready()
        yield gateway
    finally:
        code = gateway.stop()
    assert code == 0, f"the gateway exited with {code}:\n{gateway.log_tail()}"


@contextlib.contextmanager
def running_workers(
    repo: Path, directory: Path, envs: Sequence[Mapping[str, str]]
) -> Iterator[list[WorkerProcess]]:
    """Ready workers on ``repo``, one per ``envs`` entry; on exit each is stopped, and must exit 0.

    They start one after the other, so a later one reuses the executables an earlier one compiled.
    """
    started: list[WorkerProcess] = []
    try:
        for i, env in enumerate(envs):
            worker = WorkerProcess(repo, directory / f"worker{i}.log", env)
            worker.start()
            worker.wait_ready()
            started.append(worker)
        yield started
    finally:
        codes = [worker.stop() for worker in started]
    assert codes == [0] * len(started), [w.log_tail(3000) for w in started]


def log_sections() -> list[tuple[str, str]]:
    """The log tails of this session's workers and gateways, for a failing report."""
    gateways = [(f"gateway log {g.log.name}", g.log_tail(6000)) for g in GATEWAYS]
    return [*worker_logs(4000), *gateways]


def raw_unary(url: str, path: str, body: bytes, timeout: float = 30.0) -> bytes:
    """One unary call at ``path`` with ``body`` as is; the answer's bytes (``grpc.RpcError``)."""
    channel = grpc.insecure_channel(url)
    try:
        call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
        answer: bytes = call(body, timeout=timeout)
        return answer
    finally:
        channel.close()
