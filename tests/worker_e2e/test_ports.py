"""Triton's ports and flags on a real worker: REST on its own port, metrics on theirs.

The worker is started the way a Triton user would start ``tritonserver``: the model
repository, the three ports, the control mode and the start-up models on the command line (the
flags win over the harness's environment ports). Stock ``tritonclient.http`` talks to the REST
port; Prometheus-style scrapes and the status page stay on the metrics port.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from ._bundles import assert_close, load_weights, mlp_reference
from ._harness import WorkerProcess, free_port, running_worker

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def flagged(
    repo: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, int]]:
    """A worker serving only ``mlp`` (explicit mode) with a REST port of its own."""
    rest = free_port()
    log = tmp_path_factory.mktemp("logs") / "worker-ports.log"
    env = {"REACTANTSERVER_WORKER_CACHE_DIR": str(cache_dir)}
    args = [
        "--http-port",
        str(rest),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "mlp",
        "--log-format",
        "json",
    ]
    with running_worker(repo, log, env, args) as process:
        yield process, rest


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read()


def test_rest_port_serves_kserve_and_probes_only(flagged: tuple[WorkerProcess, int]) -> None:
    worker, rest = flagged
    for path in ("/v2/health/ready", "/v2/health/live", "/healthz", "/readyz", "/v2"):
        assert _get(rest, path)[0] == 200, path
    for path in ("/metrics", "/status", "/"):
        assert _get(rest, path)[0] == 404, path
    # The metrics port keeps the operator's views and no longer answers REST.
    assert _get(worker.http_port, "/metrics")[0] == 200
    assert _get(worker.http_port, "/status")[0] == 200
    assert _get(worker.http_port, "/v2/health/ready")[0] == 404


def test_tritonclient_http_infers_on_the_rest_port(
    flagged: tuple[WorkerProcess, int], repo: Path
) -> None:
    _, rest = flagged
    x = np.random.default_rng(3).standard_normal((2, 16), dtype=np.float32)
    with httpclient.InferenceServerClient(f"127.0.0.1:{rest}") as client:
        assert client.is_server_ready()
        assert client.is_model_ready("mlp")
        given = httpclient.InferInput("x", list(x.shape), "FP32")
        given.set_data_from_numpy(x)
        result = client.infer("mlp", [given])
    assert_close(result.as_numpy("logits"), mlp_reference(load_weights(repo / "mlp"), x))


def test_flags_set_control_mode_and_log_format(flagged: tuple[WorkerProcess, int]) -> None:
    worker, rest = flagged
    with httpclient.InferenceServerClient(f"127.0.0.1:{rest}") as client:
        index = {entry["name"]: entry for entry in client.get_model_repository_index()}
        # Explicit mode: every model in the repository is known; --load-model pinned mlp.
        assert {"mlp", "cnn"} <= set(index)
        assert client.is_model_ready("mlp")
    lines = [line for line in worker.log_tail(200_000).splitlines() if line.startswith("{")]
    assert lines, worker.log_tail()
    records = [json.loads(line) for line in lines]
    assert any("listening" in record.get("msg", "") for record in records)
