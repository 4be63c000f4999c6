"""The worker's status page in a real browser: a real worker, real traffic, headless Chromium.

The worker serves the exported examples and ``spin`` with an on-demand weight budget smaller
than ``cnn`` plus ``mlp`` (so their weights churn) and ``cnn`` at twice the default fair
weight (residency control needs explicit mode, where unpinned models do not serve, so nothing
is pinned here). Every model but ``spin`` gets traffic from ``tritonclient.grpc``. The page must
list every loaded model with a residency state and a request count for the ones that got
traffic, and say so when ``/status`` stops answering.

The screenshot is always written under ``tmp_path``; with ``REACTANT_UPDATE_SCREENSHOTS=1`` it
also replaces ``docs/images/status-worker.png``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.support.wait import WebDriverWait

from reactantserver.core.protocol import control_pb2, control_pb2_grpc
from tests._e2e_support import worker_env
from tests.worker_e2e._bundles import SPIN
from tests.worker_e2e._harness import WAIT_S, WorkerProcess, open_channel, running_worker

from ._page import (
    MODELS,
    PAGE_TIMEOUT_S,
    TRAFFIC,
    WEIGHT_BUDGET,
    lists_every_model,
    page_rows,
    page_state,
    screenshot,
    send_traffic,
    status_document,
)

pytestmark = pytest.mark.slow


def set_cnn_weight(worker: WorkerProcess, weight: float) -> None:
    """``WorkerControl.SetModelPolicy``: ``cnn``'s fair weight."""
    with open_channel(worker.url) as channel:
        control = control_pb2_grpc.WorkerControlStub(channel)
        request = control_pb2.SetModelPolicyRequest(name="cnn", has_weight=True, weight=weight)
        control.SetModelPolicy(request, timeout=WAIT_S)


def shows_everything(browser: webdriver.Chrome) -> bool:
    """Every model listed with a residency, and a request count for those with traffic."""
    rows = page_rows(browser)
    return lists_every_model(rows) and all(rows[model][1] >= n for model, n in TRAFFIC.items())


@pytest.mark.timeout(1200)  # the first run may install Chromium (see conftest)
def test_page_shows_every_model_with_residency_and_traffic(
    browser: webdriver.Chrome,
    repo: Path,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    env = worker_env(cache_dir, "status-demo", RUNTIME_WEIGHT_CACHE_MAX_BYTES=str(WEIGHT_BUDGET))
    with running_worker(repo, tmp_path / "worker.log", env) as worker:
        set_cnn_weight(worker, 2.0)
        send_traffic(worker.url, TRAFFIC)
        document = status_document(worker.http_port)
        assert document["kind"] == "worker"
        assert sorted(m["name"] for m in document["models"]) == sorted(MODELS)
        cnn = next(m for m in document["models"] if m["name"] == "cnn")
        assert cnn["weight"] == 2.0

        browser.get(f"http://127.0.0.1:{worker.http_port}/")
        WebDriverWait(browser, PAGE_TIMEOUT_S).until(shows_everything)
        rows = page_rows(browser)
        for model, n in TRAFFIC.items():
            assert rows[model][1] >= n, (model, rows[model])
        assert rows[SPIN][1] == 0
        assert page_state(browser) == "ok"
        assert "status-demo" in browser.title
        screenshot(browser, tmp_path / "status-worker.png")

    # The worker is gone: the page keeps its last data, says why and keeps retrying.
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(lambda b: page_state(b) == "error")
    banner = browser.execute_script("return document.getElementById('banner').textContent")
    assert "Cannot read /status" in banner
    assert "Retrying" in banner
    assert set(page_rows(browser)) == set(MODELS)
