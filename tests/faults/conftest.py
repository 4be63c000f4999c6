"""Session fixtures of the fault suite: one exported repository, one cache, one static worker.

The repository holds ``mlp``, ``two_io`` and ``spin`` (``tests/worker_e2e/_bundles.py``). The
static worker serves the disconnect and shared-memory faults; the node, dynamic and
cache-corruption faults start processes of their own (they kill or break them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests._e2e_support import attach_logs, make_cache_dir
from tests.node_e2e._node import NODES
from tests.worker_e2e._bundles import export_examples
from tests.worker_e2e._harness import WorkerProcess, running_worker, worker_logs

MODELS = ("mlp", "two_io")
"""The shipped examples exported for this suite (``spin`` comes with them)."""


def _logs() -> list[tuple[str, str]]:
    nodes = [(f"node log {node.log.name}", node.tail(8000)) for node in NODES]
    return [*worker_logs(6000), *nodes]


# The log tails of every worker and node this session started go into a failing report.
pytest_runtest_makereport = attach_logs(Path(__file__).parent, _logs)


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model repository: :data:`MODELS` and ``spin``, exported once."""
    root = tmp_path_factory.mktemp("models")
    export_examples(root, MODELS)
    return root


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cache_dir`` shared by the session's workers (executables compile once)."""
    return make_cache_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def worker(
    repo: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A ``static`` worker on :func:`repo`, ready; it must exit 0 at the end of the session."""
    log = tmp_path_factory.mktemp("logs") / "worker.log"
    env = {
        "REACTANTSERVER_WORKER_CACHE_DIR": str(cache_dir),
        "REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "static",
    }
    with running_worker(repo, log, env) as process:
        yield process


@pytest.fixture(scope="session")
def client(worker: WorkerProcess) -> Iterator[Any]:
    """A sync ``tritonclient.grpc`` client of the static worker."""
    with grpcclient.InferenceServerClient(worker.url) as triton:
        yield triton
