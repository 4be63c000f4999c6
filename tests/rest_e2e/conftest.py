"""Session fixtures of the REST end-to-end suite: two real workers and a real gateway over them.

Both workers serve the shipped examples in ``explicit`` mode (so ``RepositoryModelLoad`` and
``Unload`` are honoured) from one executable cache (the second one starts without compiling);
the gateway runs ``round_robin`` over them. Every test talks to a :class:`Target`: the first
worker's or the gateway's HTTP port (REST, stock ``tritonclient.http``) and the same process's
gRPC port (stock ``tritonclient.grpc``), whose answers REST must reproduce exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._e2e_support import attach_logs, export_repo, make_cache_dir
from tests.gateway_e2e._gateway import (
    GatewayProcess,
    log_sections,
    running_gateway,
    running_workers,
)
from tests.worker_e2e._harness import WorkerProcess

from ._target import Target, explicit_env

# The log tails of this session's workers and gateways go into a failing report.
pytest_runtest_makereport = attach_logs(Path(__file__).parent, log_sections)


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model repository: the shipped examples (and ``spin``), exported once."""
    return export_repo(tmp_path_factory)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cache_dir`` shared by every worker of the session (executables compile once)."""
    return make_cache_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this session's processes write their logs and gateway files."""
    return tmp_path_factory.mktemp("rest-logs")


@pytest.fixture(scope="session")
def workers(repo: Path, cache_dir: Path, logs: Path) -> Iterator[list[WorkerProcess]]:
    """Two ready workers on the same repository (the second reuses the first's executables)."""
    envs = [explicit_env(cache_dir, f"w{i}") for i in range(2)]
    with running_workers(repo, logs, envs) as started:
        yield started


@pytest.fixture(scope="session")
def gateway(workers: list[WorkerProcess], logs: Path) -> Iterator[GatewayProcess]:
    """The session gateway (``round_robin``) over both workers, ready."""
    with running_gateway(workers, logs) as process:
        yield process


@pytest.fixture(scope="session", params=["worker", "gateway"])
def target(request: pytest.FixtureRequest, workers: list[WorkerProcess]) -> Target:
    """The first worker directly, then the gateway (every test runs against both)."""
    if request.param == "worker":
        worker = workers[0]
        return Target("worker", worker.http_port, worker.grpc_port)
    gateway: GatewayProcess = request.getfixturevalue("gateway")
    return Target("gateway", gateway.http_port, gateway.grpc_port)
