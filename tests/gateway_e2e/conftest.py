"""Session fixtures of the gateway end-to-end suite: two real workers and a real gateway.

The repository holds the shipped examples and the ``spin`` test model; both workers serve it
from one executable cache (the second one starts without compiling). The session gateway runs
``round_robin`` over them; tests that need another mode or a worker they can kill start their
own processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests._e2e_support import attach_logs, export_repo, make_cache_dir, worker_env
from tests.worker_e2e._harness import WorkerProcess

from ._gateway import GatewayProcess, log_sections, running_gateway, running_workers

# The log tails of this session's workers and gateways go into a failing report.
pytest_runtest_makereport = attach_logs(Path(__file__).parent, log_sections)


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model repository: the examples and ``spin``, exported once."""
    return export_repo(tmp_path_factory)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cache_dir`` shared by every worker of the session (executables compile once)."""
    return make_cache_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this session's processes write their logs and gateway files."""
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def workers(repo: Path, cache_dir: Path, logs: Path) -> Iterator[list[WorkerProcess]]:
    """Two ready workers on the same repository (the second reuses the first's executables)."""
    envs = [{**worker_env(cache_dir), "REACTANTSERVER_WORKER_NAME": f"w{i}"} for i in range(2)]
    with running_workers(repo, logs, envs) as started:
        yield started


@pytest.fixture(scope="session")
def gateway(workers: list[WorkerProcess], logs: Path) -> Iterator[GatewayProcess]:
    """The session gateway (``round_robin``) over both workers, ready."""
    with running_gateway(workers, logs) as process:
        yield process


@pytest.fixture(scope="session")
def client(gateway: GatewayProcess) -> Iterator[Any]:
    """The sync ``tritonclient.grpc`` client of the session gateway."""
    with grpcclient.InferenceServerClient(gateway.url) as triton:
        yield triton
