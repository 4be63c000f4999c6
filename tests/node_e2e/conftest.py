"""Session fixtures of the node end-to-end suite: the exported examples and a shared cache.

Every test starts its own ``reactantserver-node`` (see ``_node.py``); all of them serve one
model repository from one executable cache, so only the first worker of the session compiles.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests._e2e_support import attach_logs, export_repo, make_cache_dir

from ._node import NODES

# The logs of this session's nodes go into a failing report.
pytest_runtest_makereport = attach_logs(
    Path(__file__).parent, lambda: [(f"node log {n.log.name}", n.tail(8000)) for n in NODES]
)


@pytest.fixture(scope="session")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model repository: the shipped examples, exported once."""
    return export_repo(tmp_path_factory)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cache_dir`` shared by every worker of the session (executables compile once)."""
    return make_cache_dir(tmp_path_factory)


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
