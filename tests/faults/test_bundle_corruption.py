"""Fault: a served bundle overwritten with garbage.

A ``dynamic`` worker polls its own directory every :data:`POLL_S` and serves two copies of
``mlp``: ``victim`` and ``bystander``. While stock clients keep both busy, ``victim``'s
``weights.safetensors``, its ``manifest.yaml`` or one of its modules is overwritten in place
with random bytes. The old generation must keep serving (every request OK, the same numbers),
the failed reload is logged and counted, ``bystander`` never notices, and restoring the file
reloads the bundle.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.worker_e2e._bundles import load_weights, mlp_reference
from tests.worker_e2e._harness import WorkerProcess, rows, running_worker, wait_for

from ._load import Load, Tally

pytestmark = pytest.mark.slow

POLL_S = 0.1
X = rows(3, 16, seed=15)
FAILURES = "reactantserver_worker_model_load_failures_total"
FILES = ("weights.safetensors", "manifest.yaml", "model.b8.mlir")


@pytest.fixture(scope="module")
def dynamic(
    repo: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A ``dynamic`` worker on copies of ``mlp``: ``victim`` and ``bystander``."""
    base = tmp_path_factory.mktemp("corrupt-bundle")
    models = base / "models"
    for name in ("victim", "bystander"):
        shutil.copytree(repo / "mlp", models / name)
    env = {
        "REACTANTSERVER_WORKER_CACHE_DIR": str(cache_dir),
        "REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "dynamic",
        "REACTANTSERVER_WORKER_MODEL_POLL_SECONDS": str(POLL_S),
    }
    with running_worker(models, base / "worker.log", env) as process:
        yield process


def _reason(client: Any, model: str) -> str:
    row = next(r for r in client.get_model_repository_index().models if r.name == model)
    return str(row.reason)


@pytest.mark.parametrize("victim_file", FILES)
def test_garbage_bundle_keeps_serving_the_old_generation(
    dynamic: WorkerProcess, victim_file: str, capsys: Any
) -> None:
    bundle = dynamic.repo / "victim"
    expected = mlp_reference(load_weights(bundle), X)
    good = (bundle / victim_file).read_bytes()
    failures = dynamic.metric(FAILURES, model="victim")
    loads = [Load(dynamic.url, name, X, expected, threads=4) for name in ("victim", "bystander")]
    with grpcclient.InferenceServerClient(dynamic.url) as client:
        try:
            for load in loads:
                load.wait_more(50, wait_for)
            # In place, not atomically: the watcher may even see a half-written file.
            garbage = np.random.default_rng(14).bytes(len(good))
            (bundle / victim_file).write_bytes(garbage)
            wait_for(
                lambda: dynamic.metric(FAILURES, model="victim") > failures,
                "the failed reload to be counted",
            )
            assert _reason(client, "victim").startswith("reload failed"), _reason(client, "victim")
            assert dynamic.metric(FAILURES, model="bystander") == 0
            for load in loads:
                load.wait_more(100, wait_for)
            assert client.is_model_ready("victim")
            # Restored (atomically, as an operator publishes): the digest changes, it reloads.
            tmp = bundle / f".{victim_file}.tmp"
            tmp.write_bytes(good)
            os.replace(tmp, bundle / victim_file)
            wait_for(lambda: _reason(client, "victim") == "", "the restored bundle to reload")
            for load in loads:
                load.wait_more(50, wait_for)
        finally:
            tallies: list[Tally] = [load.finish() for load in loads]
    assert re.search(r"ERROR .* model reload failed model=victim", dynamic.log_tail(200_000))
    with capsys.disabled():
        print(f"\n[faults] corrupt {victim_file}: victim {tallies[0]}; bystander {tallies[1]}")
    for tally in tallies:
        assert (tally.lost, tally.failed, tally.wrong) == (0, {}, 0), tally
