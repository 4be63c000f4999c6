"""A one-worker node: the worker itself serves the public ports; there is no gateway."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import yaml

from tests.worker_e2e._bundles import ROOT
from tests.worker_e2e._harness import (
    STARTUP_TIMEOUT_S,
    free_port,
    stop_process,
    wait_server_ready,
)

from ._node import NodeProcess, running_node

pytestmark = pytest.mark.slow


def test_a_single_worker_node_has_no_gateway(tmp_path: Path, node_settings: dict[str, Any]) -> None:
    with running_node(tmp_path, node_settings, workers=1) as node:
        names = [" ".join(child.cmdline()) for child in node.children()]
        assert not any("reactantserver.gateway" in name for name in names), names
        worker = node.child("reactantserver.worker", "worker0")
        assert worker.environ().get("CUDA_VISIBLE_DEVICES") == ""
        with grpcclient.InferenceServerClient(node.url) as client:
            assert client.is_model_ready("mlp")
        assert node.run("healthcheck").returncode == 0

        shown = node.run("materialize")
        assert shown.returncode == 0, shown.stderr
        document = yaml.safe_load(shown.stdout)
        assert [child["name"] for child in document["children"]] == ["worker0"]
        assert document["gateway"] is None
    assert node.proc is not None
    assert node.proc.returncode == 0, node.tail()
    # The node is gone, so it is no longer healthy.
    unhealthy = node.run("healthcheck")
    assert unhealthy.returncode == 1
    assert "not healthy" in unhealthy.stderr


def test_a_configuration_error_exits_1_with_the_key_path(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path, {"model_repo": str(tmp_path), "gpus": -1}, workers=1)
    done = node.run()
    assert done.returncode == 1
    assert "gpus" in done.stderr
    assert "configuration error" in done.stderr


def test_a_node_runs_from_flags_alone_on_tritons_three_ports(
    tmp_path: Path, repo: Path, cache_dir: Path
) -> None:
    """``reactantserver-node --model-repository DIR`` with no node file, as ``tritonserver``."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    while len({http, grpc, metrics}) < 3:
        grpc, metrics = free_port(), free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("REACTANTSERVER_", "REACTANT_", "INFERENCE_SERVER_"))
    }
    env.update(
        {
            "REACTANTSERVER_CACHE_DIR": str(cache_dir),
            "XDG_RUNTIME_DIR": str(tmp_path / "run"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    (tmp_path / "run").mkdir(mode=0o700)
    flags = [
        "--model-repository",
        str(repo),
        "--http-port",
        str(http),
        "--grpc-port",
        str(grpc),
        "--metrics-port",
        str(metrics),
        "--model-control-mode",
        "none",
        "--log-format",
        "json",
    ]
    command = [sys.executable, "-m", "reactantserver.node", *flags]
    log = tmp_path / "node.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    def tail(nchars: int = 8000) -> str:
        return log.read_text(errors="replace")[-nchars:]

    try:
        wait_server_ready(f"127.0.0.1:{grpc}", proc, tail, STARTUP_TIMEOUT_S, "node")
        with httpclient.InferenceServerClient(f"127.0.0.1:{http}") as client:
            assert client.is_server_ready()
            assert client.is_model_ready("mlp")
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=30) as reply:
            assert b"reactantserver_worker_" in reply.read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=30)
        assert refused.value.code == 404
        refused.value.close()
        health = subprocess.run(
            [*command[:3], "healthcheck", *flags],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert health.returncode == 0, health.stderr
    finally:
        code = stop_process(proc)
    assert code == 0, tail()
    # JSON lines throughout: the supervisor's own and its worker's.
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert {record.get("process") for record in records} >= {"supervisor", "worker0"}, tail()
