"""The repository watcher's thread: start and stop in either order, from different threads.

A shutdown can begin while the loader thread is still starting the watcher (a request
answered before start-up finished); stopping must then neither fail nor leave a thread
polling. Real worker state, an empty repository.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from packages.worker.tests._world import World, start_world, world_config
from reactantserver.worker.repository.lifecycle import ModelLifecycle
from reactantserver.worker.repository.watcher import RepositoryWatcher


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    started = start_world(world_config(tmp_path / "cache"), [])
    try:
        yield started
    finally:
        started.close()


def _watcher(world: World) -> RepositoryWatcher:
    return RepositoryWatcher(world.state, ModelLifecycle(world.state, world.runtime), seed={})


def _watcher_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "reactant-watcher"]


def test_stop_joins_the_started_thread(world: World) -> None:
    watcher = _watcher(world)
    watcher.start()
    watcher.start()  # a second start is a no-op, not a second thread
    assert len(_watcher_threads()) == 1
    watcher.stop(5.0)
    assert _watcher_threads() == []


def test_a_watcher_stopped_before_it_started_never_starts(world: World) -> None:
    watcher = _watcher(world)
    watcher.stop(1.0)
    watcher.start()
    assert _watcher_threads() == []


def test_stop_while_another_thread_is_starting_it_never_fails(world: World) -> None:
    # The shutdown's stop() lands while the loader thread is inside start(): the new thread
    # exists (threading lists it) but has not run yet. Before the fix, stop() joined it
    # then and failed with "cannot join thread before it is started".
    errors: list[BaseException] = []
    for _ in range(200):
        watcher = _watcher(world)
        starter = threading.Thread(target=watcher.start)
        starter.start()
        deadline = time.monotonic() + 5.0
        while not _watcher_threads() and time.monotonic() < deadline:
            pass  # spin, holding the GIL, so the new thread is caught before it runs
        try:
            watcher.stop(5.0)
        except BaseException as exc:  # collected, so one failure does not hide the count
            errors.append(exc)
        starter.join()
        watcher.stop(5.0)  # whichever came first, nothing is left polling
        assert _watcher_threads() == []
    assert errors == []
