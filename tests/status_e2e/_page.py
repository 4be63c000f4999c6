"""Helpers of the status page browser suite: traffic, the page's rows, screenshots.

The page marks what a test reads: ``tr[data-model]`` rows in ``table.models`` (one table per
worker document) with ``data-field="residency"`` / ``data-field="requests"`` cells carrying
``data-value``; ``body[data-state]`` is ``ok`` after a successful refresh and ``error`` while
``/status`` fails.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from selenium import webdriver

from tests.worker_e2e._bundles import EXAMPLES, ROOT, SPIN
from tests.worker_e2e._harness import WAIT_S

MODELS = (*EXAMPLES, SPIN)
"""Every model a worker of this suite loads (static mode: all of the repository)."""
TRAFFIC = {"mlp": 60, "cnn": 40, "classifier_hooks": 16, "two_io": 24}
"""Requests per model; ``spin`` gets none."""
WEIGHT_BUDGET = 8192
"""Bytes: holds ``cnn`` or ``mlp`` but not both, so alternating traffic evicts."""
RESIDENCIES = frozenset({"device", "host", "pinned"})
CONCURRENCY = 8
PAGE_TIMEOUT_S = 60.0
"""Upper bound for the page to show something (it refreshes every 2 s)."""
IMAGES = ROOT / "docs" / "images"
UPDATE_SCREENSHOTS = "REACTANT_UPDATE_SCREENSHOTS"
"""Set to ``1`` to replace the screenshots under ``docs/images``."""

_NUMPY = {"FP32": np.float32, "UINT8": np.uint8, "INT64": np.int64, "INT32": np.int32}

# [model, residency, requests] per row of every models table under `root`.
_ROWS_JS = """
const root = arguments[0] ? document.querySelector(arguments[0]) : document;
if (!root) return [];
return Array.from(root.querySelectorAll("table.models tbody tr")).map((tr) => [
  tr.dataset.model,
  tr.querySelector('[data-field="residency"]').dataset.value,
  Number(tr.querySelector('[data-field="requests"]').dataset.value),
]);
"""


def _inputs(meta: Mapping[str, Any], rows: int, rng: np.random.Generator) -> list[Any]:
    """Random tensors for ``rows`` rows of every input in ``meta`` (tritonclient JSON)."""
    tensors = []
    for spec in meta["inputs"]:
        shape = [rows if int(d) < 0 else int(d) for d in spec["shape"]]
        data = (rng.random(shape) * 255).astype(_NUMPY[spec["datatype"]])
        tensor = grpcclient.InferInput(spec["name"], shape, spec["datatype"])
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors


def send_traffic(url: str, counts: Mapping[str, int]) -> None:
    """``counts[m]`` requests of 1..8 random rows per model at ``url``, ``CONCURRENCY`` open."""
    rng = np.random.default_rng(16)
    plan = [model for model, n in counts.items() for _ in range(n)]
    rng.shuffle(plan)
    errors: list[BaseException] = []
    slots = threading.Semaphore(CONCURRENCY)
    done = threading.Semaphore(0)

    def finished(result: Any, error: Any) -> None:
        if error is not None:
            errors.append(error)
        slots.release()
        done.release()

    with grpcclient.InferenceServerClient(url) as client:
        metas = {m: client.get_model_metadata(m, as_json=True) for m in counts}
        for model in plan:
            slots.acquire()
            rows = int(rng.integers(1, 9))
            client.async_infer(model, _inputs(metas[model], rows, rng), callback=finished)
        for _ in plan:
            assert done.acquire(timeout=WAIT_S), "a request never completed"
    assert not errors, errors[:3]


def status_document(http_port: int) -> dict[str, Any]:
    """The ``/status`` JSON served on ``http_port``."""
    url = f"http://127.0.0.1:{http_port}/status"
    with urllib.request.urlopen(url, timeout=10) as response:
        document: dict[str, Any] = json.load(response)
    return document


def page_rows(browser: webdriver.Chrome, root: str = "") -> dict[str, tuple[str, int]]:
    """``model -> (residency, requests)`` of the models tables under CSS ``root`` (page-wide)."""
    rows: Sequence[Sequence[Any]] = browser.execute_script(_ROWS_JS, root)
    return {str(m): (str(r), int(n)) for m, r, n in rows}


def lists_every_model(rows: Mapping[str, tuple[str, int]]) -> bool:
    """Whether ``rows`` (from :func:`page_rows`) are exactly ``MODELS``, each with a residency."""
    if set(rows) != set(MODELS):
        return False
    return all(residency in RESIDENCIES for residency, _ in rows.values())


def page_state(browser: webdriver.Chrome) -> str:
    """``loading``, ``ok`` or ``error`` (``body[data-state]``)."""
    return str(browser.execute_script("return document.body.dataset.state"))


def screenshot(browser: webdriver.Chrome, path: Path) -> None:
    """Capture the whole page into ``path``; with ``UPDATE_SCREENSHOTS=1`` also into the docs.

    The window is resized to the page's height first (headless Chromium captures the window).
    """
    height = browser.execute_script("return document.documentElement.scrollHeight")
    width = browser.get_window_size()["width"]
    browser.set_window_size(width, int(height) + 40)
    assert browser.save_screenshot(str(path)), path
    assert path.read_bytes().startswith(b"\x89PNG")
    if os.environ.get(UPDATE_SCREENSHOTS) == "1":
        IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, IMAGES / path.name)
