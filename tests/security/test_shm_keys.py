"""Shared-memory keys name one object under ``/dev/shm`` and nothing else.

Every key that could reach outside ``/dev/shm`` (traversal, absolute paths, nested names) or
that names something other than a regular shared memory object there (a symlink, a directory,
a FIFO) is refused with ``INVALID_ARGUMENT``: the worker opens nothing outside ``/dev/shm``,
registers nothing, and keeps serving. A key tritonclient writes (``/name``) still works.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.worker_e2e._harness import WorkerProcess, infer_input, message_of, status_of

SHM = Path("/dev/shm")
REGION_BYTES = 4096

TRAVERSAL = [
    "../etc/passwd",
    "/../etc/passwd",
    "/../x",
    "..",
    "/..",
    ".",
    "/",
    "//x",
    "a/b",
    "/a/b",
    "/dev/shm/x",
    "dev/shm/x",
    "/etc/passwd",
    "/proc/self/mem",
    "x/../../etc/passwd",
    "x\0y",
]


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A regular file outside ``/dev/shm`` that a symlink in ``/dev/shm`` will point at."""
    path = tmp_path_factory.mktemp("outside") / "secret"
    path.write_bytes(b"s" * REGION_BYTES)
    return path


@pytest.fixture(scope="module")
def planted(outside: Path) -> Iterator[dict[str, str]]:
    """Objects under ``/dev/shm`` that are not shared memory objects: ``{kind: key}``."""
    tag = f"rs_sec_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    link, inner, folder, fifo = (SHM / f"{tag}_{k}" for k in ("link", "inner", "dir", "fifo"))
    inner_target = SHM / f"{tag}_target"
    inner_target.write_bytes(b"t" * REGION_BYTES)
    link.symlink_to(outside)
    inner.symlink_to(inner_target)
    folder.mkdir()
    os.mkfifo(fifo)
    try:
        yield {
            "symlink out of /dev/shm": f"/{link.name}",
            "symlink inside /dev/shm": f"/{inner.name}",
            "directory": f"/{folder.name}",
            "fifo": f"/{fifo.name}",
            "missing": f"/{tag}_missing",
        }
    finally:
        for path in (link, inner, fifo, inner_target):
            path.unlink(missing_ok=True)
        folder.rmdir()


def _register(worker: WorkerProcess, key: str) -> InferenceServerException:
    with (
        grpcclient.InferenceServerClient(worker.url) as client,
        pytest.raises(InferenceServerException) as caught,
    ):
        client.register_system_shared_memory("bad", key, REGION_BYTES)
    return caught.value


def _opened(worker: WorkerProcess) -> set[str]:
    assert worker.proc is not None
    process = psutil.Process(worker.proc.pid)
    return {f.path for f in process.open_files()} | {
        m.path for m in process.memory_maps(grouped=True)
    }


def _assert_serving(worker: WorkerProcess) -> None:
    x = np.ones((1, 16), np.float32)
    with grpcclient.InferenceServerClient(worker.url) as client:
        assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}
        result = client.infer("mlp", [infer_input("x", x, "FP32")], client_timeout=30)
    assert result.as_numpy("logits").shape[0] == 1


@pytest.mark.parametrize("key", TRAVERSAL)
def test_a_key_outside_dev_shm_is_invalid_argument(capped: WorkerProcess, key: str) -> None:
    error = _register(capped, key)
    assert status_of(error) == "INVALID_ARGUMENT", error
    assert "shared memory key" in message_of(error) or "/dev/shm" in message_of(error)
    _assert_serving(capped)


def test_objects_that_are_not_shm_regions_are_invalid_argument(
    capped: WorkerProcess, planted: dict[str, str], outside: Path
) -> None:
    codes = {kind: status_of(_register(capped, key)) for kind, key in planted.items()}
    assert codes == dict.fromkeys(planted, "INVALID_ARGUMENT")
    opened = _opened(capped)
    assert str(outside) not in opened
    assert not any(path.startswith(str(SHM / "rs_sec_")) for path in opened), opened
    _assert_serving(capped)


def test_a_tritonclient_key_still_works(capped: WorkerProcess) -> None:
    key = f"/rs_sec_{os.getpid()}_ok"
    handle = shm.create_shared_memory_region("ok", key, REGION_BYTES)
    try:
        with grpcclient.InferenceServerClient(capped.url) as client:
            client.register_system_shared_memory("ok", key, REGION_BYTES)
            status = client.get_system_shared_memory_status(as_json=True)
            assert status["regions"]["ok"]["key"] == key
            client.unregister_system_shared_memory("ok")
    finally:
        shm.destroy_shared_memory_region(handle)
    _assert_serving(capped)
