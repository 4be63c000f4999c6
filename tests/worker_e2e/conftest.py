"""Session fixtures of the worker end-to-end suite: one exported repository, one worker.

The repository holds the shipped examples (``mlp``, ``cnn``, ``classifier_hooks``,
``two_io``) and the test bundles of ``_bundles.py``: ``hooky`` (``mlp`` with test hooks),
``spin`` (holds the dispatch thread on request) and ``broken`` (fails to load on purpose). One
worker serves it for the whole session in ``static`` mode; tests that need a special server
(shutdown, in-flight cap) start their own on the same executable cache.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests._e2e_support import attach_logs, export_repo, make_cache_dir

from ._bundles import HOOKY, add_broken, add_hooky, load_weights
from ._harness import WorkerProcess, inference_stub, open_channel, running_worker, worker_logs

# The log tail of every worker this session started goes into a failing report.
pytest_runtest_makereport = attach_logs(Path(__file__).parent, lambda: worker_logs(6000))


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model repository: the examples and the test bundles, exported once."""
    return export_repo(tmp_path_factory, add_hooky, add_broken)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cache_dir`` shared by every worker of the session (executables compile once)."""
    return make_cache_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def worker(
    repo: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """The session's worker, ready; always terminated at the end."""
    log = tmp_path_factory.mktemp("logs") / "worker.log"
    env = {
        "REACTANTSERVER_WORKER_CACHE_DIR": str(cache_dir),
        "REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "static",
    }
    with running_worker(repo, log, env) as process:
        yield process


@pytest.fixture(scope="session")
def client(worker: WorkerProcess) -> Iterator[Any]:
    """The sync ``tritonclient.grpc`` client of the session worker."""
    with grpcclient.InferenceServerClient(worker.url) as triton:
        yield triton


@pytest.fixture(scope="session")
def channel(worker: WorkerProcess) -> Iterator[grpc.Channel]:
    """A raw channel to the session worker."""
    with open_channel(worker.url) as opened:
        yield opened


@pytest.fixture(scope="session")
def stub(channel: grpc.Channel) -> Any:
    """tritonclient's generated stub, for requests the high-level client will not build."""
    return inference_stub(channel)


@pytest.fixture(scope="session")
def weights(repo: Path) -> dict[str, dict[str, np.ndarray[Any, Any]]]:
    """Weights of the bundles with NumPy references, by model."""
    return {name: load_weights(repo / name) for name in ("mlp", "two_io", HOOKY)}
