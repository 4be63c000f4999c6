"""The gateway's status page and ``/status`` document over two real workers (issue 16).

The session gateway (``round_robin``) fetches each worker's own ``/status`` from its HTTP port;
its document lists both workers with their model tables and the placement (the discovery
routing table: every model on both workers).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.worker_e2e._harness import WorkerProcess, wait_for

from ._gateway import GatewayProcess

pytestmark = pytest.mark.slow

REQUESTS = 6


def _status(gateway: GatewayProcess) -> dict[str, Any]:
    code, body = gateway.http_get("/status")
    assert code == 200, body
    document: dict[str, Any] = json.loads(body)
    return document


def _mlp_requests(document: dict[str, Any]) -> int:
    return sum(
        model["requests"]
        for worker in document["workers"]
        if worker["status"] is not None
        for model in worker["status"]["models"]
        if model["name"] == "mlp"
    )


def test_document_lists_both_workers_and_the_placement(
    gateway: GatewayProcess, workers: list[WorkerProcess], client: Any
) -> None:
    before = _mlp_requests(_status(gateway))
    rng = np.random.default_rng(16)
    for _ in range(REQUESTS):
        x = grpcclient.InferInput("x", [1, 16], "FP32")
        x.set_data_from_numpy(rng.standard_normal((1, 16)).astype(np.float32))
        client.infer("mlp", [x])
    wait_for(
        lambda: _mlp_requests(_status(gateway)) >= before + REQUESTS, "requests in the document"
    )
    doc = _status(gateway)
    assert doc["kind"] == "gateway"
    assert doc["ready"] is True
    assert doc["policy"] == "round_robin"
    assert doc["last_repack"] is None
    assert doc["uptime_seconds"] > 0
    assert [w["name"] for w in doc["workers"]] == ["w0", "w1"]
    for entry, worker in zip(doc["workers"], workers, strict=True):
        assert entry["endpoint"] == worker.url
        assert entry["ready"] is True
        assert entry["error"] is None
        status = entry["status"]
        assert status["kind"] == "worker"
        assert status["name"] == entry["name"]
        # The worker's own model table, as its /status answers it (counters move on, so
        # compare what does not).
        code, _, body = worker.http_get("/status")
        assert code == 200
        own = json.loads(body)
        assert [m["name"] for m in status["models"]] == [m["name"] for m in own["models"]]
        mlp = next(m for m in status["models"] if m["name"] == "mlp")
        assert mlp["state"] == "READY"
        assert mlp["residency"] in {"device", "host", "pinned"}
    # Round robin: the six requests went to both workers.
    for entry in doc["workers"]:
        mlp = next(m for m in entry["status"]["models"] if m["name"] == "mlp")
        assert mlp["requests"] > 0
    placement = {row["model"]: row["workers"] for row in doc["placement"]}
    assert list(placement) == sorted(placement)
    for name in ("mlp", "two_io"):
        assert placement[name] == ["w0", "w1"]
    served = {m["name"] for w in doc["workers"] for m in w["status"]["models"]}
    assert set(placement) <= served


def test_page_is_served(gateway: GatewayProcess) -> None:
    code, body = gateway.http_get("/")
    assert code == 200
    assert body.lstrip().lower().startswith("<!doctype html")
    assert "/status" in body
