"""Plumbing the end-to-end suites share: failure logs, the cache, the repository, a worker's env.

Fixtures stay in each suite's ``conftest.py`` (pytest finds them there); they call these.

    pytest_runtest_makereport = attach_logs(Path(__file__).parent, lambda: worker_logs(6000))
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.worker_e2e._bundles import export_examples

Sections = Callable[[], Iterable[tuple[str, str]]]
"""Lists the ``(title, text)`` sections to add to a failing report (log tails, usually)."""


def attach_logs(
    directory: Path, sections: Sections
) -> Callable[[pytest.Item, pytest.CallInfo[None]], Generator[None, Any, Any]]:
    """A ``pytest_runtest_makereport`` adding ``sections()`` to failures in ``directory``.

    A conftest binds the result to that name; only tests directly in ``directory`` are covered.
    """

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, Any, Any]:
        report = yield
        if report.failed and Path(str(item.path)).parent == directory:
            report.sections.extend(sections())
        return report

    return pytest_runtest_makereport


def make_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh private (``0o700``) ``cache_dir`` for the session's workers."""
    path = tmp_path_factory.mktemp("cache")
    path.chmod(0o700)
    return path


def export_repo(
    tmp_path_factory: pytest.TempPathFactory, *extras: Callable[[Path], object]
) -> Path:
    """A fresh model repository with the shipped examples, then each of ``extras`` applied."""
    root = tmp_path_factory.mktemp("models")
    export_examples(root)
    for add in extras:
        add(root)
    return root


def worker_env(cache_dir: Path, name: str | None = None, **settings: str) -> dict[str, str]:
    """The environment of a test worker: static model control, loopback only, ``cache_dir``.

    ``settings`` name ``REACTANTSERVER_WORKER_*`` variables by their suffix
    (``SCHEDULER_DISCIPLINE="fifo"``) and win over the defaults; ``name`` is the worker's
    ``REACTANTSERVER_WORKER_NAME``. The one helper every end-to-end suite builds workers with.
    """
    env = {
        "REACTANTSERVER_WORKER_CACHE_DIR": str(cache_dir),
        "REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "static",
        "REACTANTSERVER_WORKER_ENDPOINTS_HOST": "127.0.0.1",
    }
    env.update({f"REACTANTSERVER_WORKER_{key}": value for key, value in settings.items()})
    if name is not None:
        env["REACTANTSERVER_WORKER_NAME"] = name
    return env
