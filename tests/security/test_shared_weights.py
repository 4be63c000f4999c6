"""Shared host weight regions: mode ``0o660`` by default, ``666`` warns.

A worker with ``runtime.shared_host_weights`` maps each model's weights from
``/dev/shm/rsw-<model>-<digest>`` and holds ``<name>.lock`` next to it; both are created with
``runtime.shared_host_weights_mode`` whatever the umask (the workers here run under ``077``).
The regions of *this* worker are found through its own memory maps and open files, so other
servers on the machine do not matter. A gracefully stopped worker, the last holder, unlinks them.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.worker_e2e._harness import WorkerProcess

from .conftest import base_env

pytestmark = pytest.mark.slow


def _start(repo: Path, cache_dir: Path, directory: Path, **extra: str) -> Iterator[WorkerProcess]:
    # The on-demand weight cache keeps a host floor (PINNED_SYSTEM), which the store shares.
    env = base_env(
        cache_dir,
        RUNTIME_SHARED_HOST_WEIGHTS="true",
        RUNTIME_WEIGHT_CACHE_MAX_BYTES=str(1 << 20),
        **extra,
    )
    worker = WorkerProcess(repo, directory / "worker.log", env)
    # A strict umask, inherited by the worker: the configured mode must win over it.
    old = os.umask(0o077)
    try:
        worker.start()
    finally:
        os.umask(old)
    try:
        worker.wait_ready()
        yield worker
    finally:
        code = worker.stop()
    assert code == 0, worker.log_tail()


@pytest.fixture(scope="module")
def shared(
    repo: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A worker with shared host weights and the default mode."""
    yield from _start(repo, cache_dir, tmp_path_factory.mktemp("shared"))


@pytest.fixture(scope="module")
def world_writable(
    repo: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """``runtime.shared_host_weights_mode: 666`` on a copy of the repository (its own regions)."""
    directory = tmp_path_factory.mktemp("shared666")
    copy = directory / "models"
    shutil.copytree(repo, copy)
    yield from _start(copy, cache_dir, directory, RUNTIME_SHARED_HOST_WEIGHTS_MODE="666")


def regions(worker: WorkerProcess) -> dict[str, int]:
    """``{path: permission bits}`` of the worker's ``/dev/shm/rsw-*`` regions and lock files."""
    assert worker.proc is not None
    process = psutil.Process(worker.proc.pid)
    paths = {m.path for m in process.memory_maps(grouped=True)}
    paths |= {f.path for f in process.open_files()}
    found = {p for p in paths if p.startswith("/dev/shm/rsw-")}
    return {p: stat.S_IMODE(os.stat(p).st_mode) for p in found}


def test_regions_and_lock_files_default_to_0o660(shared: WorkerProcess) -> None:
    modes = regions(shared)
    names = {Path(p).name for p in modes}
    for model in ("mlp", "spin"):
        region = [n for n in names if n.startswith(f"rsw-{model}-") and not n.endswith(".lock")]
        assert len(region) == 1, names
        assert f"{region[0]}.lock" in names, names
    assert set(modes.values()) == {0o660}, {p: oct(m) for p, m in modes.items()}
    assert "shared_host_weights_mode" not in shared.log_tail(100000)


def test_mode_666_warns_and_is_applied(world_writable: WorkerProcess) -> None:
    log = world_writable.log_tail(100000)
    warning = "runtime.shared_host_weights_mode '666' lets any local user write"
    assert warning in log, log
    modes = regions(world_writable)
    assert modes
    assert set(modes.values()) == {0o666}, {p: oct(m) for p, m in modes.items()}


def test_a_stopped_worker_leaves_no_region_behind(
    repo: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    directory = tmp_path_factory.mktemp("shared_stop")
    copy = directory / "models"
    shutil.copytree(repo, copy)  # regions of its own, held by no other worker
    starting = _start(copy, cache_dir, directory)
    worker = next(starting)
    held = regions(worker)
    assert len(held) == 4, held  # mlp and spin, each a region and a lock file
    with pytest.raises(StopIteration):
        next(starting)  # SIGTERM, graceful exit 0
    assert [path for path in held if os.path.exists(path)] == []
