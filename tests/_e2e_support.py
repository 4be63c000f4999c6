"""Plumbing the end-to-end suites' conftests share: failure logs, the cache, the repository.

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
