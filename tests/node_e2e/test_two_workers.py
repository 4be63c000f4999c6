"""A node with ``gpus: 2`` on a CPU machine: two workers behind the embedded gateway.

One node serves the whole module; the tests run in file order and the last one stops it with
SIGTERM (the fixture only cleans up if that test did not run).
"""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from tests.worker_e2e._harness import wait_for

from ._node import NodeProcess, running_node

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(
    tmp_path_factory: pytest.TempPathFactory, repo: Path, cache_dir: Path
) -> Iterator[NodeProcess]:
    """The module's node: ``gpus: 2`` on the CPU backend."""
    settings: dict[str, Any] = {
        "model_repo": str(repo),
        "gpus": 2,
        "global": {"cache_dir": str(cache_dir), "model_control_mode": "static"},
        "supervisor": {"max_backoff_seconds": 1.0, "liveness_interval_seconds": 1.0},
    }
    with running_node(tmp_path_factory.mktemp("node2"), settings, workers=2) as process:
        yield process


def _infer(url: str, rows: int = 3) -> np.ndarray:
    x = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16) / 100
    given = grpcclient.InferInput("x", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(url) as client:
        result = client.infer("mlp", [given], client_timeout=30)
    logits = result.as_numpy("logits")
    assert logits is not None
    return np.asarray(logits)


def _worker_url(node: NodeProcess, index: int) -> str:
    return f"127.0.0.1:{node.base_port + index}"


def test_two_workers_and_a_gateway_run_under_the_supervisor(node: NodeProcess) -> None:
    for name in ("worker0", "worker1"):
        argv = node.child("reactantserver.worker", name).cmdline()
        assert argv[argv.index("--worker") + 1] == name
    node.child("reactantserver.gateway")
    text = node.text()
    for prefix in ("[supervisor] ", "[worker0] ", "[worker1] ", "[gateway] "):
        assert prefix in text
    # Behind the gateway the workers listen on loopback at base_port + i.
    for index in range(2):
        with grpcclient.InferenceServerClient(_worker_url(node, index)) as client:
            assert client.is_server_ready()


def test_tritonclient_infers_through_the_public_port(node: NodeProcess) -> None:
    direct = _infer(_worker_url(node, 0))
    for _ in range(6):
        np.testing.assert_allclose(_infer(node.url), direct, rtol=1e-5, atol=1e-5)


def test_public_metrics_aggregate_both_workers(node: NodeProcess) -> None:
    url = f"http://127.0.0.1:{node.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    labels = {
        sample.labels.get("worker")
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert {"worker0", "worker1"} <= labels


def test_a_killed_worker_is_restarted_and_requests_resume(node: NodeProcess) -> None:
    victim = node.child("reactantserver.worker", "worker1")
    victim.send_signal(signal.SIGKILL)
    node.wait_log(r"^\[supervisor\] .*worker1.*SIGKILL")
    node.wait_log(r"^\[supervisor\] .*restarting worker1")
    # Requests keep working through the public port while worker1 is away ...
    for _ in range(4):
        _infer(node.url)

    def back() -> bool:
        try:
            restarted = node.child("reactantserver.worker", "worker1")
        except AssertionError:
            return False
        if restarted.pid == victim.pid:
            return False
        with grpcclient.InferenceServerClient(_worker_url(node, 1)) as client:
            try:
                return bool(client.is_server_ready(client_timeout=2))
            except Exception:
                return False

    wait_for(back, "worker1 restarted and ready", timeout_s=120)
    node.pids.add(node.child("reactantserver.worker", "worker1").pid)

    # ... and once it is back, the gateway routes to it again.
    def served_by_worker1() -> bool:
        _infer(node.url)
        with grpcclient.InferenceServerClient(_worker_url(node, 1)) as client:
            stats = client.get_inference_statistics("mlp", as_json=True)
        return any(int(m.get("inference_count", 0)) > 0 for m in stats["model_stats"])

    wait_for(served_by_worker1, "the restarted worker1 serving traffic", timeout_s=60)


def test_sigterm_stops_the_whole_tree_with_exit_0(node: NodeProcess) -> None:
    assert node.stop() == 0, node.tail()
    assert not node.survivors(), node.tail()
