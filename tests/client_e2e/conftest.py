"""Session fixtures of the client end-to-end suite: one exported repository, one worker.

The repository holds the shipped examples (``mlp``, ``cnn``, ``classifier_hooks``, ``two_io``)
and the ``spin`` test model of the worker suite; one worker serves it for the whole session.
Tests that need a special server (a restart, an in-flight cap) start their own on the same
executable cache, so it starts without compiling. After every test the client is shut down and
must have left nothing behind: no SHM object of this process, no registration on the session
worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from reactantserver import client as rc
from tests._e2e_support import attach_logs, export_repo, make_cache_dir, worker_env
from tests.worker_e2e._bundles import load_weights
from tests.worker_e2e._harness import WorkerProcess, running_worker, worker_logs

from ._helpers import OURS, registered, shm_leftovers

# The log tail of every worker this session started goes into a failing report.
pytest_runtest_makereport = attach_logs(Path(__file__).parent, lambda: worker_logs(6000))


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model repository: the four examples and ``spin``, exported once."""
    return export_repo(tmp_path_factory)


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
    with running_worker(repo, log, worker_env(cache_dir)) as process:
        OURS.append(process)
        yield process


@pytest.fixture(scope="session")
def triton(worker: WorkerProcess) -> Iterator[Any]:
    """The sync ``tritonclient.grpc`` client of the session worker (the reference)."""
    with grpcclient.InferenceServerClient(worker.url) as client:
        yield client


@pytest.fixture(scope="session")
def weights(repo: Path) -> dict[str, dict[str, np.ndarray[Any, Any]]]:
    """Weights of the bundles with NumPy references, by model."""
    return {name: load_weights(repo / name) for name in ("mlp", "two_io")}


@pytest.fixture
def make_pool() -> Iterator[Callable[..., rc.StagingPool]]:
    """``make_pool(nbytes, slots, shm=True)``: staging pools kept alive until ``shutdown()``.

    ``shutdown`` unregisters and unlinks only pools still alive; one collected before leaks
    (``test_lifecycle.test_shutdown_cleans_a_pool_dropped_without_close``), so tests hold them.
    """
    made: list[rc.StagingPool] = []

    def make(nbytes: int, slots: int, *, shm: bool = True) -> rc.StagingPool:
        pool = rc.StagingPool(nbytes, slots, shm=shm)
        made.append(pool)
        return pool

    yield make
    rc.shutdown()
    assert all(pool.closed for pool in made)


@pytest.fixture(autouse=True)
def client_left_clean() -> Iterator[None]:
    """After each test: ``shutdown()``; then no SHM object of ours and no registration remain."""
    yield
    rc.shutdown()
    assert shm_leftovers() == []
    for process in OURS:
        if process.proc is not None and process.proc.poll() is None:
            with grpcclient.InferenceServerClient(process.url) as client:
                assert registered(client) == {}, process.url
