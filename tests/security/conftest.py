"""Session fixtures of the security suite: a small repository, a shared cache, a capped worker.

The repository holds ``mlp`` and ``spin`` only (start-up stays short). The ``capped`` worker is
a standalone worker with the defaults an operator would tighten: a 1 MiB receive cap and no
``WorkerControl`` service; its host is left at the default. A gateway in front of it has its
own cap (2 MiB) and no control services. Tests that need another server (TLS, shared weights,
an unsafe cache, a node) start their own in their module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._e2e_support import attach_logs, make_cache_dir
from tests.gateway_e2e._gateway import GatewayProcess, log_sections, running_gateway
from tests.node_e2e._node import NODES
from tests.worker_e2e._bundles import export_examples
from tests.worker_e2e._harness import WorkerProcess, running_worker

WORKER_CAP = 1 << 20
"""``grpc.max_recv_msg_bytes`` of the capped worker."""
GATEWAY_CAP = 2 << 20
"""``grpc.max_recv_msg_bytes`` of the gateway in front of it."""


def _sections() -> list[tuple[str, str]]:
    nodes = [(f"node log {node.log.name}", node.tail(6000)) for node in NODES]
    return [*log_sections(), *nodes]


# The logs of every worker, gateway and node this session started go into a failing report.
pytest_runtest_makereport = attach_logs(Path(__file__).parent, _sections)


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository with ``mlp`` (and ``spin``), exported once."""
    root = tmp_path_factory.mktemp("models")
    export_examples(root, ("mlp",))
    return root


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The private ``cache_dir`` shared by the session's workers (executables compile once)."""
    return make_cache_dir(tmp_path_factory)


def base_env(cache_dir: Path, **extra: str) -> dict[str, str]:
    """A worker's environment: the shared cache, static mode, ``extra``
    ``REACTANTSERVER_WORKER_*``."""
    env = {
        "REACTANTSERVER_WORKER_CACHE_DIR": str(cache_dir),
        "REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "static",
    }
    env.update({f"REACTANTSERVER_WORKER_{key}": value for key, value in extra.items()})
    return env


@pytest.fixture(scope="session")
def capped(
    repo: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A standalone worker: default host, 1 MiB receive cap, ``endpoints.control_service`` off."""
    env = base_env(
        cache_dir,
        GRPC_MAX_RECV_MSG_BYTES=str(WORKER_CAP),
        ENDPOINTS_CONTROL_SERVICE="false",
    )
    log = tmp_path_factory.mktemp("capped") / "capped.log"
    with running_worker(repo, log, env) as worker:
        yield worker


@pytest.fixture(scope="session")
def gateway(
    capped: WorkerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """A gateway over :func:`capped` with a 2 MiB receive cap and ``control_service: false``."""
    settings: dict[str, Any] = {
        "grpc": {"max_recv_msg_bytes": GATEWAY_CAP},
        "control_service": False,
    }
    directory = tmp_path_factory.mktemp("gateway")
    with running_gateway([capped], directory, settings=settings) as process:
        yield process
