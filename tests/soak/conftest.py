"""Fixtures of the soak test: the examples exported once, one worker with a tight weight budget.

The worker serves ``mlp``, ``cnn``, ``two_io``, ``classifier_hooks`` and the meta ``pipeline``
with its sub-models under the ``fair`` scheduler, with an on-demand weight budget
(:data:`WEIGHT_BUDGET`) that holds ``cnn`` alone or the others together: mixed traffic keeps
evicting.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._e2e_support import attach_logs, make_cache_dir
from tests.worker_e2e._bundles import EXAMPLES, export_examples
from tests.worker_e2e._harness import WorkerProcess, running_worker, worker_logs

WEIGHT_BUDGET = 6500
"""Bytes: ``cnn`` weighs 6,200, ``mlp`` 3,064, the rest under 1,100 each."""

# The worker's log tail goes into a failing report.
pytest_runtest_makereport = attach_logs(Path(__file__).parent, lambda: worker_logs(6000))


@pytest.fixture(scope="module")
def soak_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The examples and the ``pipeline`` meta model with its sub-models."""
    root = tmp_path_factory.mktemp("soak-models")
    export_examples(root, names=(*EXAMPLES, "pipeline"))
    return root


@pytest.fixture(scope="module")
def soak_worker(
    soak_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """The worker under soak; it must exit with 0 when the module is done."""
    env = {
        "REACTANTSERVER_WORKER_CACHE_DIR": str(make_cache_dir(tmp_path_factory)),
        "REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "static",
        "REACTANTSERVER_WORKER_SCHEDULER_DISCIPLINE": "fair",
        "REACTANTSERVER_WORKER_RUNTIME_WEIGHT_CACHE_MAX_BYTES": str(WEIGHT_BUDGET),
        "REACTANTSERVER_WORKER_ENDPOINTS_HOST": "127.0.0.1",
    }
    log = tmp_path_factory.mktemp("soak-logs") / "worker.log"
    with running_worker(soak_repo, log, env) as process:
        yield process
