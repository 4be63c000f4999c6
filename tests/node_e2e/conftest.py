"""Session fixtures of the node end-to-end suite: the exported examples and a shared cache.

Every test starts its own ``reactantserver-node`` (see ``_node.py``); all of them serve one
model repository from one executable cache, so only the first worker of the session compiles.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from tests.worker_e2e._bundles import export_examples

from ._node import NODES


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, Any]:
    """Attach the logs of this session's nodes to a failing report."""
    report = yield
    if report.failed and Path(str(item.path)).parent == Path(__file__).parent:
        for node in NODES:
            report.sections.append((f"node log {node.log.name}", node.tail(8000)))
    return report


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model repository: the shipped examples, exported once."""
    root = tmp_path_factory.mktemp("models")
    export_examples(root)
    return root


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cache_dir`` shared by every worker of the session (executables compile once)."""
    path = tmp_path_factory.mktemp("cache")
    path.chmod(0o700)
    return path


@pytest.fixture
def node_settings(repo: Path, cache_dir: Path) -> dict[str, Any]:
    """The node-file keys every test starts from (static models, a fast restart policy)."""
    return {
        "model_repo": str(repo),
        "global": {"cache_dir": str(cache_dir), "model_control_mode": "static"},
        "supervisor": {
            "max_backoff_seconds": 1.0,
            "worker_grace_seconds": 15.0,
            "gateway_grace_seconds": 10.0,
            "liveness_interval_seconds": 1.0,
        },
    }
