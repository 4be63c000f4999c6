"""The executable cache must be private to the server user (enforced).

Deserialising a cached executable trusts its bytes, so a worker whose executable cache folder
(``<cache_dir>/executables``) is group- or world-writable, or owned by another user, keeps
serving with the cache disabled and a warning, and never reads or writes an entry there. The
check is on that folder, not on ``cache_dir`` itself: a Kubernetes volume root is group-writable
under ``fsGroup`` (deploy/k8s/deployment.yaml), while the folder the worker creates is ``0o700``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.worker_e2e._harness import WorkerProcess, infer_input, running_worker

from .conftest import base_env

pytestmark = pytest.mark.slow

DISABLED = "executable cache disabled"
NOBODY = 65534
"""The uid that owns the "foreign" folder (only root can hand a folder to someone else)."""


def _prepare(executables: Path, how: str) -> None:
    executables.mkdir()
    if how == "world":
        executables.chmod(0o777)
    elif how == "group":
        executables.chmod(0o770)
    else:
        if os.getuid() != 0:
            pytest.skip("only root can make a folder owned by another user")
        executables.chmod(0o700)
        os.chown(executables, NOBODY, NOBODY)


@pytest.fixture(scope="module", params=["world", "group", "foreign"])
def unsafe(
    request: pytest.FixtureRequest, repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, Path]]:
    """A worker whose private ``cache_dir`` holds an ``executables`` folder others control."""
    directory = tmp_path_factory.mktemp(f"unsafe_{request.param}")
    cache = directory / "cache"
    cache.mkdir(mode=0o700)
    _prepare(cache / "executables", str(request.param))
    with running_worker(repo, directory / "worker.log", base_env(cache)) as worker:
        yield worker, cache


def _check_disabled(worker: WorkerProcess, cache: Path) -> None:
    log = worker.log_tail(100000)
    assert DISABLED in log, log
    x = np.ones((2, 16), np.float32)
    with grpcclient.InferenceServerClient(worker.url) as client:
        result = client.infer("mlp", [infer_input("x", x, "FP32")], client_timeout=60)
    assert result.as_numpy("logits").shape[0] == 2
    assert list((cache / "executables").iterdir()) == []
    assert worker.metric("reactantserver_worker_executable_cache_hits_total") == 0


def test_an_executables_folder_others_control_disables_the_cache(
    unsafe: tuple[WorkerProcess, Path],
) -> None:
    _check_disabled(*unsafe)


def test_the_private_cache_is_used(capped: WorkerProcess, cache_dir: Path) -> None:
    assert DISABLED not in capped.log_tail(100000)
    assert list((cache_dir / "executables").rglob("*.bin"))
