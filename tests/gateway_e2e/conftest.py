"""Session fixtures of the gateway end-to-end suite: two real workers and a real gateway.

The repository holds the shipped examples and the ``spin`` test model; both workers serve it
from one executable cache (the second one starts without compiling). The session gateway runs
``round_robin`` over them; tests that need another mode or a worker they can kill start their
own processes.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.worker_e2e._bundles import export_examples
from tests.worker_e2e._harness import STARTED, WorkerProcess

from ._gateway import GATEWAYS, GatewayProcess, running_gateway, worker_env


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, Any]:
    """Attach the log tails of this session's workers and gateways to a failing report."""
    report = yield
    if report.failed and Path(str(item.path)).parent == Path(__file__).parent:
        for worker in STARTED:
            report.sections.append((f"worker log {worker.log.name}", worker.log_tail(4000)))
        for gateway in GATEWAYS:
            report.sections.append((f"gateway log {gateway.log.name}", gateway.log_tail(6000)))
    return report


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model repository: the examples and ``spin``, exported once."""
    root = tmp_path_factory.mktemp("models")
    export_examples(root)
    return root


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cache_dir`` shared by every worker of the session (executables compile once)."""
    path = tmp_path_factory.mktemp("cache")
    path.chmod(0o700)
    return path


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this session's processes write their logs and gateway files."""
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def workers(repo: Path, cache_dir: Path, logs: Path) -> Iterator[list[WorkerProcess]]:
    """Two ready workers on the same repository (the second reuses the first's executables)."""
    started: list[WorkerProcess] = []
    try:
        for i in range(2):
            env = {**worker_env(cache_dir), "REACTANT_WORKER_NAME": f"w{i}"}
            worker = WorkerProcess(repo, logs / f"worker{i}.log", env)
            worker.start()
            worker.wait_ready()
            started.append(worker)
        yield started
    finally:
        codes = [worker.stop() for worker in started]
    assert codes == [0] * len(started), [w.log_tail(3000) for w in started]


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
