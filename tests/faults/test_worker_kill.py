"""Fault: a worker SIGKILLed under load behind a node.

A ``gpus: 2`` node on the CPU backend runs two workers behind its gateway. Eight stock clients
send ``mlp`` requests through the public port without pause; ``worker1`` is SIGKILLed. The
supervisor restarts it, the gateway fails requests over to ``worker0`` meanwhile (in-flight
ones die with ``UNAVAILABLE`` and are retried there) and routes to ``worker1`` again once it is
back. Bar: not one request lost or failed, every answer numerically right.
"""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.node_e2e._node import NodeProcess, running_node
from tests.worker_e2e._bundles import load_weights, mlp_reference
from tests.worker_e2e._harness import rows, sum_samples, wait_for

from ._load import Load

pytestmark = pytest.mark.slow

X = rows(2, 16, seed=14)
THREADS = 8
BEFORE, DURING, AFTER = 100, 200, 100
"""Answers to collect before the kill, while ``worker1`` is away, and once it serves again."""


def _worker1_back(node: NodeProcess, old_pid: int) -> bool:
    try:
        worker = node.child("reactantserver.worker", "worker1")
    except AssertionError:
        return False
    if worker.pid == old_pid:
        return False
    with grpcclient.InferenceServerClient(f"127.0.0.1:{node.base_port + 1}") as client:
        try:
            return bool(client.is_server_ready(client_timeout=2))
        except Exception:
            return False


def _served_by_worker1(node: NodeProcess) -> bool:
    with grpcclient.InferenceServerClient(f"127.0.0.1:{node.base_port + 1}") as client:
        stats = client.get_inference_statistics("mlp", as_json=True)
    return any(int(m.get("inference_count", 0)) > 0 for m in stats["model_stats"])


def _public_metric(node: NodeProcess, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/metrics", timeout=10) as r:
        return sum_samples(r.read().decode(), name)


def test_sigkilled_worker_loses_no_request(
    tmp_path: Path, repo: Path, cache_dir: Path, capsys: Any
) -> None:
    settings: dict[str, Any] = {
        "model_repo": str(repo),
        "gpus": 2,
        "global": {"cache_dir": str(cache_dir), "model_control_mode": "static"},
        "supervisor": {"max_backoff_seconds": 1.0, "liveness_interval_seconds": 1.0},
    }
    expected = mlp_reference(load_weights(repo / "mlp"), X)
    with running_node(tmp_path, settings, workers=2, name="kill") as node:
        load = Load(node.url, "mlp", X, expected, threads=THREADS)
        try:
            load.wait_more(BEFORE, wait_for)
            victim = node.child("reactantserver.worker", "worker1")
            victim.send_signal(signal.SIGKILL)
            node.wait_log(r"^\[supervisor\] .*worker1.*SIGKILL")
            load.wait_more(DURING, wait_for)
            wait_for(lambda: _worker1_back(node, victim.pid), "worker1 restarted", 120)
            node.pids.add(node.child("reactantserver.worker", "worker1").pid)
            wait_for(lambda: _served_by_worker1(node), "the restarted worker1 serving", 60)
            load.wait_more(AFTER, wait_for)
        finally:
            tally = load.finish()
        failovers = _public_metric(node, "reactantserver_gateway_failovers_total")
        with capsys.disabled():
            print(f"\n[faults] worker SIGKILL under load: {tally} failovers={failovers:g}")
        assert "restarting worker1" in node.text()
    assert tally.sent >= BEFORE + DURING + AFTER
    assert tally.lost == 0, tally
    assert tally.failed == {}, tally
    assert tally.wrong == 0, tally
