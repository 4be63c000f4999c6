"""SharedMemoryRegistry against real /dev/shm objects."""

from __future__ import annotations

import array
import gc
import mmap
import os
import threading
import uuid
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest

from reactantserver.core import shm
from reactantserver.core.errors import InvalidArgumentError, RegionNotRegisteredError
from reactantserver.core.shm import Lease, RegionStatus, SharedMemoryRegistry, resolve_key

ShmFactory = Callable[[int], str]


@pytest.fixture
def make_shm() -> Iterator[ShmFactory]:
    """Create /dev/shm objects of a given size (returns the '/key'); unlinks them afterwards."""
    created: list[str] = []

    def create(size: int) -> str:
        name = f"rs-test-shm-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        path = os.path.join("/dev/shm", name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        created.append(path)
        return "/" + name

    yield create
    for path in created:
        if os.path.exists(path):
            os.unlink(path)


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    reg = SharedMemoryRegistry()
    yield reg
    reg.close()


def _path(key: str) -> str:
    return os.path.join("/dev/shm", key.lstrip("/"))


def _fill(key: str, offset: int, data: bytes) -> None:
    fd = os.open(_path(key), os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def _contents(key: str, offset: int, n: int) -> bytes:
    fd = os.open(_path(key), os.O_RDONLY)
    try:
        return os.pread(fd, n, offset)
    finally:
        os.close(fd)


def test_public_surface_sorted() -> None:
    assert shm.__all__ == [
        "SHM_DIR",
        "Lease",
        "RegionStatus",
        "SharedMemoryRegistry",
        "resolve_key",
    ]


# --- key resolution -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "path"),
    [
        ("/input_simple", "/dev/shm/input_simple"),
        ("plain", "/dev/shm/plain"),
        ("/a.b", "/dev/shm/a.b"),
    ],
)
def test_resolve_key(key: str, path: str) -> None:
    assert resolve_key(key) == path


@pytest.mark.parametrize("key", ["", "/", "a/b", "/a/b", "//x", ".", "/.", "..", "/..", "a\0b"])
def test_resolve_key_rejects(key: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        resolve_key(key)
    assert info.value.status == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("key", ["a/b", "/../etc/passwd", "..", "/.", "x\0y", ""])
def test_register_rejects_bad_keys(registry: SharedMemoryRegistry, key: str) -> None:
    with pytest.raises(InvalidArgumentError):
        registry.register("r", key, 0, 1)
    assert registry.status() == {}


def test_register_refuses_symlinks(registry: SharedMemoryRegistry, make_shm: ShmFactory) -> None:
    target = make_shm(4096)
    link = f"rs-test-link-{uuid.uuid4().hex[:12]}"
    os.symlink(_path(target), _path(link))
    try:
        with pytest.raises(InvalidArgumentError, match="cannot open"):
            registry.register("r", "/" + link, 0, 16)
    finally:
        os.unlink(_path(link))


def test_register_missing_object(registry: SharedMemoryRegistry) -> None:
    key = f"/rs-test-missing-{uuid.uuid4().hex}"
    with pytest.raises(InvalidArgumentError, match="cannot open") as info:
        registry.register("r", key, 0, 16)
    assert "'r'" in str(info.value)


# --- bounds -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "byte_size", "match"),
    [
        (-1, 16, "negative"),
        (0, 0, "positive"),
        (0, -5, "positive"),
        (2**63, 1, "overflow"),
        (0, 2**63, "overflow"),
        (2**62, 2**62, "overflow"),
        (2**63 - 1, 1, "overflow"),
        (4000, 97, "exceeds"),
        (0, 4097, "exceeds"),
        (4096, 1, "exceeds"),
        (True, 1, "integer"),
        (0, 1.5, "integer"),
    ],
)
def test_register_bounds(
    registry: SharedMemoryRegistry,
    make_shm: ShmFactory,
    offset: object,
    byte_size: object,
    match: str,
) -> None:
    key = make_shm(4096)
    with pytest.raises(InvalidArgumentError, match=match):
        registry.register("r", key, offset, byte_size)  # type: ignore[arg-type]
    assert registry.status() == {}
    assert registry.live_mappings() == 0


def test_register_empty_name(registry: SharedMemoryRegistry, make_shm: ShmFactory) -> None:
    with pytest.raises(InvalidArgumentError, match="name"):
        registry.register("", make_shm(16), 0, 16)


def test_register_whole_object_and_unaligned_offsets(
    registry: SharedMemoryRegistry, make_shm: ShmFactory
) -> None:
    size = 3 * mmap.ALLOCATIONGRANULARITY + 123
    key = make_shm(size)
    payload = bytes(range(256)) * 4
    _fill(key, mmap.ALLOCATIONGRANULARITY + 7, payload)
    registry.register("whole", key, 0, size)
    registry.register("mid", key, mmap.ALLOCATIONGRANULARITY + 7, len(payload))
    with registry.read("mid", 0, len(payload)) as lease:
        assert bytes(lease.view) == payload
    with registry.read("whole", mmap.ALLOCATIONGRANULARITY + 7 + 10, 5) as lease:
        assert bytes(lease.view) == payload[10:15]
    # The last byte of the object is reachable.
    registry.write("whole", size - 1, b"\xaa")
    assert _contents(key, size - 1, 1) == b"\xaa"


@pytest.mark.parametrize(
    ("offset", "nbytes", "match"),
    [
        (-1, 1, "negative"),
        (0, -1, "negative"),
        (60, 5, "exceeds"),
        (65, 0, "exceeds"),
        (2**63, 0, "overflow"),
        (1, 2**63 - 1, "overflow"),
        (2**64, 2**64, "overflow"),
        ("0", 1, "integer"),
    ],
)
def test_read_write_bounds(
    registry: SharedMemoryRegistry,
    make_shm: ShmFactory,
    offset: object,
    nbytes: object,
    match: str,
) -> None:
    registry.register("r", make_shm(4096), 100, 64)
    with pytest.raises(InvalidArgumentError, match=match) as info:
        registry.read("r", offset, nbytes)  # type: ignore[arg-type]
    assert "'r'" in str(info.value)
    with pytest.raises(InvalidArgumentError, match=match):
        registry.check("r", offset, nbytes)  # type: ignore[arg-type]
    if isinstance(nbytes, int) and 0 <= nbytes < 4096:
        with pytest.raises(InvalidArgumentError, match=match):
            registry.write("r", offset, bytes(nbytes))  # type: ignore[arg-type]


def test_read_and_write_at_region_edges(
    registry: SharedMemoryRegistry, make_shm: ShmFactory
) -> None:
    registry.register("r", make_shm(4096), 100, 64)
    with registry.read("r", 64, 0) as lease:
        assert lease.view.nbytes == 0
    assert registry.write("r", 60, b"abcd") == 4
    with registry.read("r", 0, 64) as lease:
        assert bytes(lease.view[60:]) == b"abcd"
    assert registry.check("r", 0, 64) == RegionStatus("r", registry.status()["r"].key, 100, 64)


@pytest.mark.parametrize("op", ["read", "write", "check"])
def test_unknown_region(registry: SharedMemoryRegistry, op: str) -> None:
    calls: dict[str, Callable[[], object]] = {
        "read": lambda: registry.read("nope", 0, 1),
        "write": lambda: registry.write("nope", 0, b"x"),
        "check": lambda: registry.check("nope", 0, 1),
    }
    with pytest.raises(
        RegionNotRegisteredError, match="unregistered shared memory region 'nope'"
    ) as info:
        calls[op]()
    assert info.value.status == grpc.StatusCode.FAILED_PRECONDITION


# --- views and writes -----------------------------------------------------------------------


def test_read_is_zero_copy_and_read_only(
    registry: SharedMemoryRegistry, make_shm: ShmFactory
) -> None:
    key = make_shm(4096)
    registry.register("r", key, 8, 256)
    lease = registry.read("r", 0, 16)
    assert lease.view.readonly
    with pytest.raises(TypeError):
        lease.view[0] = 1
    array = np.frombuffer(lease.view, dtype=np.uint32)
    assert not array.flags.writeable
    assert list(array) == [0, 0, 0, 0]
    # Another process's write (here: a plain file write) shows through the view.
    _fill(key, 8, np.array([1, 2, 3, 4], dtype="<u4").tobytes())
    assert list(array) == [1, 2, 3, 4]
    del array
    lease.release()
    assert lease.released
    with pytest.raises(ValueError, match="released"):
        _ = lease.view


def test_write_arrays_and_buffers(registry: SharedMemoryRegistry, make_shm: ShmFactory) -> None:
    key = make_shm(256)
    registry.register("r", key, 0, 256)
    matrix = np.arange(12, dtype="<i4").reshape(3, 4)
    assert registry.write("r", 0, matrix.T) == 48  # non-contiguous: written row-major
    assert _contents(key, 0, 48) == np.ascontiguousarray(matrix.T).tobytes()
    # A typed (format "d") buffer is written as its bytes.
    assert registry.write("r", 48, memoryview(array.array("d", [1.5]))) == 8
    assert _contents(key, 48, 8) == np.array([1.5], dtype="<f8").tobytes()
    assert registry.write("r", 56, np.array(True)) == 1
    assert _contents(key, 56, 1) == b"\x01"
    assert registry.write("r", 57, bytearray(b"xyz")) == 3
    with pytest.raises(TypeError, match="object"):
        registry.write("r", 0, np.array([b"a"], dtype=object))


def test_status(registry: SharedMemoryRegistry, make_shm: ShmFactory) -> None:
    k1, k2 = make_shm(4096), make_shm(4096)
    registry.register("b", k1, 0, 10)
    registry.register("a", k2, 16, 32)
    everything = registry.status("")
    assert list(everything) == ["a", "b"]
    assert everything["a"] == RegionStatus("a", k2, 16, 32)
    assert registry.status("b") == {"b": RegionStatus("b", k1, 0, 10)}
    assert registry.status("zzz") == {}
    assert "a" in registry
    assert "zzz" not in registry


# --- unregister ---------------------------------------------------------------------------


def test_unregister_is_idempotent_and_never_unlinks(
    registry: SharedMemoryRegistry, make_shm: ShmFactory
) -> None:
    key = make_shm(4096)
    registry.register("r", key, 0, 4096)
    registry.unregister("r")
    registry.unregister("r")
    registry.unregister("never-registered")
    assert registry.status() == {}
    assert registry.live_mappings() == 0
    assert os.path.exists(_path(key))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_truncated_object_is_refused_not_touched(
    registry: SharedMemoryRegistry, make_shm: ShmFactory
) -> None:
    # Touching mapped pages past the end of a shrunk object raises SIGBUS and kills the
    # process (a fault test found it); the registry checks the object's size first.
    key = make_shm(2 * 4096)
    fds = _open_fds()
    registry.register("r", key, 4096, 4096)
    registry.register("other", make_shm(4096), 0, 64)
    with registry.read("r", 0, 8) as lease:
        assert bytes(lease.view) == bytes(8)
    os.truncate(_path(key), 4096 + 16)
    with registry.read("r", 8, 8) as lease:  # still inside the object
        assert bytes(lease.view) == bytes(8)
    for call in (lambda: registry.read("r", 0, 64), lambda: registry.write("r", 0, b"x" * 64)):
        with pytest.raises(InvalidArgumentError, match="shrank to 4112 bytes"):
            call()
    os.truncate(_path(key), 0)
    with pytest.raises(InvalidArgumentError, match="shrank to 0 bytes"):
        registry.read("r", 0, 1)
    assert registry.write("other", 0, b"fine") == 4
    registry.unregister("")
    assert registry.live_mappings() == 0
    assert _open_fds() == fds


def test_unregister_all(registry: SharedMemoryRegistry, make_shm: ShmFactory) -> None:
    keys = [make_shm(4096) for _ in range(3)]
    for i, key in enumerate(keys):
        registry.register(f"r{i}", key, 0, 64)
    registry.unregister("")
    assert registry.status() == {}
    assert registry.live_mappings() == 0
    assert all(os.path.exists(_path(k)) for k in keys)


def test_lease_survives_unregister(registry: SharedMemoryRegistry, make_shm: ShmFactory) -> None:
    key = make_shm(4096)
    _fill(key, 0, b"payload!")
    registry.register("r", key, 0, 4096)
    lease = registry.read("r", 0, 8)
    registry.unregister("r")
    # The name is gone at once...
    assert registry.status("r") == {}
    with pytest.raises(RegionNotRegisteredError):
        registry.read("r", 0, 8)
    # ...but the in-flight lease still sees the bytes, and the object still exists.
    assert registry.live_mappings() == 1
    assert bytes(lease.view) == b"payload!"
    lease.release()
    lease.release()  # idempotent
    assert registry.live_mappings() == 0
    assert os.path.exists(_path(key))


def test_array_kept_past_release_stays_valid(
    registry: SharedMemoryRegistry, make_shm: ShmFactory
) -> None:
    key = make_shm(4096)
    _fill(key, 0, np.arange(4, dtype="<f4").tobytes())
    registry.register("r", key, 0, 16)
    lease = registry.read("r", 0, 16)
    array = np.frombuffer(lease.view, dtype="<f4")
    registry.unregister("r")
    lease.release()
    # The registry has let go; the mapping lives on through the array instead of dangling.
    assert registry.live_mappings() == 0
    assert list(array) == [0.0, 1.0, 2.0, 3.0]
    del array
    gc.collect()


def test_reregister_replaces(registry: SharedMemoryRegistry, make_shm: ShmFactory) -> None:
    k1, k2 = make_shm(4096), make_shm(4096)
    _fill(k1, 0, b"one")
    _fill(k2, 0, b"two")
    registry.register("r", k1, 0, 3)
    old = registry.read("r", 0, 3)
    registry.register("r", k2, 0, 3)
    assert registry.status("r")["r"].key == k2
    with registry.read("r", 0, 3) as new:
        assert bytes(new.view) == b"two"
    assert bytes(old.view) == b"one"
    assert registry.live_mappings() == 2
    old.release()
    assert registry.live_mappings() == 1


def test_failed_reregister_keeps_old(registry: SharedMemoryRegistry, make_shm: ShmFactory) -> None:
    key = make_shm(64)
    registry.register("r", key, 0, 64)
    with pytest.raises(InvalidArgumentError):
        registry.register("r", key, 0, 65)
    assert registry.status("r") == {"r": RegionStatus("r", key, 0, 64)}


def test_write_shows_in_object(registry: SharedMemoryRegistry, make_shm: ShmFactory) -> None:
    key = make_shm(8192)
    registry.register("r", key, 5000, 100)
    registry.write("r", 10, b"hello")
    assert _contents(key, 5010, 5) == b"hello"


def test_concurrent_leases_and_unregister(
    registry: SharedMemoryRegistry, make_shm: ShmFactory
) -> None:
    key = make_shm(4096)
    _fill(key, 0, b"x" * 4096)
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                with registry.read("r", 0, 4096) as lease:
                    assert bytes(lease.view[:1]) == b"x"
            except RegionNotRegisteredError:
                pass
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(200):
        registry.register("r", key, 0, 4096)
        registry.unregister("r")
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert registry.live_mappings() == 0


def test_lease_type() -> None:
    assert Lease.__doc__


# --- is_same_namespace --------------------------------------------------------------------


def test_is_same_namespace(registry: SharedMemoryRegistry, make_shm: ShmFactory) -> None:
    key = make_shm(16)
    assert registry.is_same_namespace(key)
    assert registry.is_same_namespace(key.lstrip("/"))
    assert not registry.is_same_namespace(f"/rs-test-missing-{uuid.uuid4().hex}")
    for bad in ["", "a/b", "..", "x\0", "/"]:
        assert not registry.is_same_namespace(bad)
    assert not registry.is_same_namespace(None)  # type: ignore[arg-type]
    assert not registry.is_same_namespace("x" * 1000)
