"""Fixtures of the fuzz suite: an exported repository, real workers, real ``/dev/shm`` regions.

The repository holds ``mlp`` and ``two_io`` (plus the harness's ``spin``). The request fuzz
drives one ``static`` worker; the loader fuzz its own ``explicit`` worker on a private copy
of ``mlp`` (it writes broken bundles next to it). Both share one executable cache. The figures
of the run (cases per strategy, statuses, RSS) are printed in the terminal summary.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import tritonclient.utils.shared_memory as shm
from hypothesis.configuration import set_hypothesis_home_dir
from tritonclient.grpc import service_pb2

from tests._e2e_support import attach_logs, make_cache_dir, worker_env
from tests.worker_e2e._bundles import export_examples, load_weights
from tests.worker_e2e._harness import (
    WorkerProcess,
    inference_stub,
    open_channel,
    running_worker,
    worker_logs,
)

from ._probe import CLIENT_DEADLINE_S, Probe
from ._report import summary_lines
from ._requests import x_rows
from ._wire import SHM_IN, SHM_OUT, SHM_SMALL

# The log tail of every worker this session started goes into a failing report.
pytest_runtest_makereport = attach_logs(Path(__file__).parent, lambda: worker_logs(6000))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the fuzz figures (issue 14 asks for them) when any case ran."""
    lines = summary_lines()
    if lines:
        terminalreporter.section("fuzz figures")
        for line in lines:
            terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    """Hypothesis keeps its caches in the temporary directory, never ``.hypothesis`` here.

    Its pytest plugin writes a cache of source constants while collecting, so this has to
    happen when this conftest registers (``database=None`` covers the example database).
    """
    del config
    set_hypothesis_home_dir(
        Path(tempfile.gettempdir()) / f"reactantserver-hypothesis-{os.getuid()}"
    )


@pytest.fixture(scope="session")
def fuzz_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mlp``, ``two_io`` and ``spin``, exported once."""
    root = tmp_path_factory.mktemp("fuzz_models")
    export_examples(root, ("mlp", "two_io"))
    return root


@pytest.fixture(scope="session")
def fuzz_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The executable cache of the suite's workers (modules compile once)."""
    return make_cache_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def mlp_weights(fuzz_repo: Path) -> dict[str, Any]:
    """``mlp``'s weights, for the NumPy reference of every health check."""
    return load_weights(fuzz_repo / "mlp")


@pytest.fixture(scope="module")
def request_worker(
    fuzz_repo: Path, fuzz_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """The worker the request fuzz drives (``static`` mode); must exit 0 at the end."""
    log = tmp_path_factory.mktemp("logs") / "request_worker.log"
    with running_worker(fuzz_repo, log, worker_env(fuzz_cache)) as process:
        yield process


@pytest.fixture(scope="module")
def channel(request_worker: WorkerProcess) -> Iterator[grpc.Channel]:
    """A raw channel to the request worker."""
    with open_channel(request_worker.url) as opened:
        yield opened


@pytest.fixture(scope="module")
def regions(channel: grpc.Channel) -> Iterator[None]:
    """``fz_in`` (holding ``x`` rows), ``fz_out`` and the 64-byte ``fz_small``, registered."""
    stub = inference_stub(channel)
    tag = f"/rs_fuzz_{os.getpid()}"
    handles = []
    try:
        for name, size in (SHM_IN, SHM_OUT, SHM_SMALL):
            handle = shm.create_shared_memory_region(name, f"{tag}_{name}", size)
            handles.append(handle)
            stub.SystemSharedMemoryRegister(
                service_pb2.SystemSharedMemoryRegisterRequest(
                    name=name, key=f"{tag}_{name}", offset=0, byte_size=size
                ),
                timeout=CLIENT_DEADLINE_S,
            )
        shm.set_shared_memory_region(handles[0], [x_rows(SHM_IN[1] // 64)])
        yield
    finally:
        stub.SystemSharedMemoryUnregister(
            service_pb2.SystemSharedMemoryUnregisterRequest(name=""), timeout=CLIENT_DEADLINE_S
        )
        for handle in handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture(scope="module")
def probe(
    request_worker: WorkerProcess, channel: grpc.Channel, regions: None, mlp_weights: Any
) -> Probe:
    """The request worker's :class:`Probe`, healthy before the first case."""
    del regions
    checked = Probe(request_worker, channel, mlp_weights)
    checked.assert_healthy("start-up")
    return checked


@pytest.fixture(scope="module")
def loader_repo(fuzz_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private model directory holding ``mlp`` (the loader fuzz adds bundles next to it)."""
    root = tmp_path_factory.mktemp("loader_models")
    shutil.copytree(fuzz_repo / "mlp", root / "mlp")
    return root


@pytest.fixture(scope="module")
def loader_worker(
    loader_repo: Path, fuzz_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """The worker the loader fuzz drives (``explicit`` mode); must exit 0 at the end."""
    log = tmp_path_factory.mktemp("logs") / "loader_worker.log"
    with running_worker(
        loader_repo, log, worker_env(fuzz_cache, MODEL_CONTROL_MODE="explicit")
    ) as process:
        yield process


@pytest.fixture(scope="module")
def loader_probe(loader_worker: WorkerProcess, mlp_weights: Any) -> Iterator[Probe]:
    """The loader worker's :class:`Probe`, healthy before the first case."""
    with open_channel(loader_worker.url) as opened:
        checked = Probe(loader_worker, opened, mlp_weights)
        checked.assert_healthy("start-up")
        yield checked
