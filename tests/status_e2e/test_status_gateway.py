"""The gateway's status page in a real browser: two real workers behind ``lpt_packing``.

Traffic goes through the gateway; the page must show the placement table and, per worker,
that worker's own document with every model, a residency state and the requests it served.
The screenshot goes under ``tmp_path`` and, with ``REACTANT_UPDATE_SCREENSHOTS=1``, replaces
``docs/images/status-gateway.png``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.support.wait import WebDriverWait

from tests._e2e_support import worker_env
from tests.gateway_e2e._gateway import LPT, running_gateway
from tests.worker_e2e._harness import running_worker

from ._page import (
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

WORKERS = ("w0", "w1")


def shows_everything(browser: webdriver.Chrome) -> bool:
    """Placement rows, and every worker's models with residencies and all the traffic."""
    placed = browser.execute_script(
        "return document.querySelectorAll('table.grid tbody tr').length"
    )
    if not placed:
        return False
    served = dict.fromkeys(TRAFFIC, 0)
    for name in WORKERS:
        rows = page_rows(browser, f'[data-gw-worker="{name}"]')
        if not lists_every_model(rows):
            return False
        for model in served:
            served[model] += rows[model][1]
    return all(served[model] >= n for model, n in TRAFFIC.items())


@pytest.mark.timeout(1200)  # the first run may install Chromium (see conftest)
def test_gateway_page_shows_placement_and_every_worker(
    browser: webdriver.Chrome,
    repo: Path,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    with contextlib.ExitStack() as stack:
        workers = [
            stack.enter_context(
                running_worker(
                    repo,
                    tmp_path / f"{name}.log",
                    worker_env(
                        cache_dir,
                        name,
                        RUNTIME_WEIGHT_CACHE_MAX_BYTES=str(WEIGHT_BUDGET),
                        SCHEDULER_DISCIPLINE="fifo",
                    ),
                )
            )
            for name in WORKERS
        ]
        gateway = stack.enter_context(running_gateway(workers, tmp_path, settings=LPT))
        send_traffic(gateway.url, TRAFFIC)
        document = status_document(gateway.http_port)
        assert document["kind"] == "gateway"
        assert [w["name"] for w in document["workers"]] == list(WORKERS)
        assert all(w["status"] is not None for w in document["workers"]), document["workers"]

        browser.get(f"http://127.0.0.1:{gateway.http_port}/")
        WebDriverWait(browser, PAGE_TIMEOUT_S).until(shows_everything)
        assert page_state(browser) == "ok"
        screenshot(browser, tmp_path / "status-gateway.png")
