"""Weight stores in one process: private arrays, shared regions, digest, layout, sweep, rename."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import stat
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from safetensors.numpy import save_file

from reactantserver.core import weights
from reactantserver.core.dtypes import DType
from reactantserver.core.weights import (
    REGION_HEADER_BYTES,
    REGION_MAGIC,
    FileIdentity,
    PrivateWeightStore,
    SafetensorsReader,
    SharedWeightStore,
    WeightHandle,
    WeightSpec,
    WeightStore,
    region_layout,
    region_name,
    weights_digest,
)

SHM = Path("/dev/shm")
SPECS = [
    WeightSpec("w", DType.F32, (4, 5)),
    WeightSpec("b", DType.F16, (3,)),
    WeightSpec("s", DType.I64, ()),
    WeightSpec("m", DType.BOOL, (7,)),
]
IDENTITY = FileIdentity(dev=1, ino=2, size=3, mtime_ns=4)


class Filler:
    """A fill callback that counts its calls and writes a seeded pattern."""

    def __init__(self, seed: int = 0) -> None:
        self.calls = 0
        self.seed = seed
        self.saw_writeable = False

    def __call__(self, arrays: list[npt.NDArray[Any]]) -> None:
        self.calls += 1
        self.saw_writeable = all(a.flags.writeable for a in arrays)
        for array, expected in zip(arrays, expected_arrays(self.seed), strict=True):
            array[...] = expected


def expected_arrays(seed: int) -> list[npt.NDArray[Any]]:
    rng = np.random.default_rng(seed)
    return [
        rng.integers(-50, 50, spec.shape).astype(spec.dtype.numpy)
        if spec.dtype is not DType.BOOL
        else rng.integers(0, 2, spec.shape).astype(bool)
        for spec in SPECS
    ]


def never_fill(arrays: list[npt.NDArray[Any]]) -> None:
    raise AssertionError("fill must not be called when attaching")


@pytest.fixture
def model() -> Iterator[str]:
    """A model name unique to the test; its /dev/shm files are removed afterwards."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    yield name
    for path in SHM.glob(f"rsw-{name}-*"):
        path.unlink(missing_ok=True)


def _paths(model: str, digest: int) -> tuple[Path, Path]:
    name = region_name(model, digest)
    return SHM / name, SHM / f"{name}.lock"


# -- private store -----------------------------------------------------------------------------


def test_private_store_allocates_aligned_arrays_and_fills_them() -> None:
    store = PrivateWeightStore()
    filler = Filler(seed=3)
    handle = store.materialize("m", 7, SPECS, filler)
    assert filler.calls == 1
    assert filler.saw_writeable
    assert handle.key == "m"
    assert handle.digest == 7
    assert handle.region is None
    assert handle.nbytes == sum(s.nbytes for s in SPECS) == 80 + 6 + 8 + 7
    for array, spec, want in zip(handle.arrays, SPECS, expected_arrays(3), strict=True):
        assert array.shape == spec.shape
        assert array.dtype == spec.dtype.numpy
        assert array.ctypes.data % 64 == 0
        assert not array.flags.writeable
        np.testing.assert_array_equal(array, want)
    store.release(handle)
    assert handle.released
    assert handle.arrays == []
    with pytest.raises(ValueError, match="not live"):
        store.release(handle)


def test_private_store_gives_each_materialisation_its_own_copy() -> None:
    store = PrivateWeightStore()
    first, second = Filler(), Filler()
    a = store.materialize("m", 1, SPECS, first)
    b = store.materialize("m", 1, SPECS, second)
    assert first.calls == second.calls == 1
    assert not np.shares_memory(a.arrays[0], b.arrays[0])
    store.release(a)
    store.release(b)


def test_private_store_rename_and_foreign_handles() -> None:
    store = PrivateWeightStore()
    handle = store.materialize("old", 1, SPECS, Filler())
    other = store.materialize("other", 1, SPECS, Filler())
    store.rename("old", "new")
    assert handle.key == "new"
    assert other.key == "other"
    with pytest.raises(ValueError, match="not live"):
        store.release(WeightHandle(key="x", digest=0, arrays=[], nbytes=0))
    store.release(handle)
    store.release(other)


def test_private_store_rejects_bytes_weights() -> None:
    with pytest.raises(ValueError, match="cannot be a weight"):
        PrivateWeightStore().materialize("m", 1, [WeightSpec("x", DType.BYTES, (1,))], Filler())


def test_both_stores_satisfy_the_weight_store_protocol() -> None:
    assert isinstance(PrivateWeightStore(), WeightStore)
    assert isinstance(SharedWeightStore(0o600), WeightStore)


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions, each alphabetical.
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_public_surface_is_sorted_and_complete() -> None:
    assert weights.__all__ == sorted(weights.__all__, key=_isort_key)
    for name in weights.__all__:
        assert hasattr(weights, name), name


# -- digest, names, layout ---------------------------------------------------------------------


def test_digest_is_blake2b_of_canonical_json() -> None:
    document = [
        "rsw-1",
        "resnet",
        [[s.name, s.dtype.token, list(s.shape)] for s in SPECS],
        [1, 2, 3, 4],
    ]
    canonical = json.dumps(document, separators=(",", ":")).encode()
    want = int.from_bytes(hashlib.blake2b(canonical).digest()[:8], "big")
    assert weights_digest("resnet", SPECS, IDENTITY) == want
    assert (
        region_name("resnet", want) == f"rsw-resnet-{hashlib.blake2b(canonical).hexdigest()[:16]}"
    )


def test_digest_changes_with_model_layout_and_file_identity() -> None:
    base = weights_digest("m", SPECS, IDENTITY)
    assert weights_digest("m", SPECS, IDENTITY) == base
    assert weights_digest("m2", SPECS, IDENTITY) != base
    assert weights_digest("m", SPECS[:-1], IDENTITY) != base
    assert weights_digest("m", [WeightSpec("w", DType.F32, (5, 4)), *SPECS[1:]], IDENTITY) != base
    assert weights_digest("m", [WeightSpec("w", DType.I32, (4, 5)), *SPECS[1:]], IDENTITY) != base
    for changed in (
        FileIdentity(9, 2, 3, 4),
        FileIdentity(1, 9, 3, 4),
        FileIdentity(1, 2, 9, 4),
        FileIdentity(1, 2, 3, 9),
    ):
        assert weights_digest("m", SPECS, changed) != base
    assert 0 <= base < 1 << 64


def test_region_names_are_sanitised() -> None:
    assert region_name("bert.v2_x-1", 0xAB) == "rsw-bert.v2_x-1-00000000000000ab"
    assert region_name("a/b c", 1) == "rsw-a_b_c-0000000000000001"
    assert region_name("", 1) == "rsw-_-0000000000000001"
    assert len(region_name("x" * 500, 1)) == 4 + 128 + 1 + 16
    with pytest.raises(ValueError, match="64-bit"):
        region_name("m", 1 << 64)
    with pytest.raises(ValueError, match="64-bit"):
        region_name("m", -1)


def test_region_layout_aligns_every_tensor() -> None:
    offsets, size = region_layout(SPECS)
    assert offsets == [64, 64 + 128, 64 + 128 + 64, 64 + 128 + 64 + 64]
    assert all(o % 64 == 0 for o in offsets)
    assert size == 64 + 128 + 64 + 64 + 64
    assert region_layout([]) == ([], REGION_HEADER_BYTES)


# -- shared store in one process ---------------------------------------------------------------


def test_shared_region_is_created_then_attached_without_fill(model: str) -> None:
    digest = 0x0123456789ABCDEF
    obj, lock = _paths(model, digest)
    creator, attacher = SharedWeightStore(0o640), SharedWeightStore(0o640)
    filler = Filler(seed=5)
    first = creator.materialize(model, digest, SPECS, filler)
    assert filler.calls == 1
    assert filler.saw_writeable
    assert first.region == obj
    second = attacher.materialize(model, digest, SPECS, never_fill)
    assert second.region == obj

    for a, b, want, spec in zip(
        first.arrays, second.arrays, expected_arrays(5), SPECS, strict=True
    ):
        np.testing.assert_array_equal(a, want)
        np.testing.assert_array_equal(b, want)
        assert a.dtype == b.dtype == spec.dtype.numpy
        assert not a.flags.writeable
        assert not b.flags.writeable
        assert a.ctypes.data % 64 == 0
    with pytest.raises(ValueError, match="read-only"):
        first.arrays[0][0, 0] = 1

    # The object on disk follows the layout: header, then tensors at aligned offsets.
    raw = obj.read_bytes()
    offsets, size = region_layout(SPECS)
    assert len(raw) == size
    assert struct.unpack_from("<IIQ", raw) == (REGION_MAGIC, 1, digest)
    assert raw[16:64] == bytes(48)
    for offset, want in zip(offsets, expected_arrays(5), strict=True):
        assert raw[offset : offset + want.nbytes] == want.tobytes()

    for path in (obj, lock):
        assert stat.S_IMODE(path.stat().st_mode) == 0o640

    del a, b
    creator.release(first)
    assert obj.exists()
    assert lock.exists()
    attacher.release(second)
    assert not obj.exists()
    assert not lock.exists()


def test_shared_mode_ignores_umask(model: str) -> None:
    old = os.umask(0o077)
    try:
        store = SharedWeightStore(0o666)
        handle = store.materialize(model, 1, SPECS, Filler())
    finally:
        os.umask(old)
    obj, lock = _paths(model, 1)
    assert stat.S_IMODE(obj.stat().st_mode) == 0o666
    assert stat.S_IMODE(lock.stat().st_mode) == 0o666
    store.release(handle)


def test_shared_store_validates_arguments() -> None:
    with pytest.raises(ValueError, match="mode"):
        SharedWeightStore(0o1777)
    with pytest.raises(ValueError, match="timeout"):
        SharedWeightStore(0o600, attach_timeout_s=-1)
    store = SharedWeightStore(0o600, shm_dir="/tmp")
    assert store.mode == 0o600
    assert store.shm_dir == Path("/tmp")


def test_failed_fill_leaves_nothing_behind(model: str) -> None:
    store = SharedWeightStore(0o600)
    obj, lock = _paths(model, 2)

    def broken(arrays: list[npt.NDArray[Any]]) -> None:
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        store.materialize(model, 2, SPECS, broken)
    assert not obj.exists()
    assert not lock.exists()
    filler = Filler()
    handle = store.materialize(model, 2, SPECS, filler)
    assert filler.calls == 1
    store.release(handle)


@pytest.mark.parametrize(
    "header",
    [
        struct.pack("<IIQ", REGION_MAGIC, 0, 3),  # creator died before READY
        struct.pack("<IIQ", REGION_MAGIC, 1, 4),  # another digest's bytes under this name
        struct.pack("<IIQ", 0xDEADBEEF, 1, 3),  # not a region at all
    ],
)
def test_unready_or_foreign_leftover_is_recreated(model: str, header: bytes) -> None:
    obj, lock = _paths(model, 3)
    _, size = region_layout(SPECS)
    obj.write_bytes(header + bytes(size - len(header)))
    lock.touch()
    filler = Filler(seed=8)
    store = SharedWeightStore(0o600)
    handle = store.materialize(model, 3, SPECS, filler)
    assert filler.calls == 1
    np.testing.assert_array_equal(handle.arrays[0], expected_arrays(8)[0])
    store.release(handle)
    assert not obj.exists()
    assert not lock.exists()


def test_leftover_of_the_wrong_size_is_recreated(model: str) -> None:
    obj, _ = _paths(model, 3)
    obj.write_bytes(struct.pack("<IIQ", REGION_MAGIC, 1, 3) + bytes(100))
    filler = Filler()
    store = SharedWeightStore(0o600)
    handle = store.materialize(model, 3, SPECS, filler)
    assert filler.calls == 1
    assert obj.stat().st_size == region_layout(SPECS)[1]
    store.release(handle)


def test_ready_leftover_without_holders_is_reused(model: str) -> None:
    # A worker that died while attached leaves a complete region: it is reused as is.
    store = SharedWeightStore(0o600)
    handle = store.materialize(model, 4, SPECS, Filler(seed=2))
    obj, lock = _paths(model, 4)
    saved = obj.read_bytes()
    store.release(handle)
    obj.write_bytes(saved)
    obj.chmod(0o600)
    again = store.materialize(model, 4, SPECS, never_fill)
    np.testing.assert_array_equal(again.arrays[0], expected_arrays(2)[0])
    store.release(again)
    assert not obj.exists()
    assert not lock.exists()


def test_attach_times_out_while_another_holds_the_lock_exclusively(model: str) -> None:
    _, lock = _paths(model, 5)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        store = SharedWeightStore(0o600, attach_timeout_s=0.2)
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="not ready"):
            store.materialize(model, 5, SPECS, never_fill)
        assert time.monotonic() - start >= 0.2
    finally:
        os.close(fd)


def test_concurrent_attacher_waits_for_the_filler(model: str) -> None:
    filling, proceed = threading.Event(), threading.Event()
    filler = Filler(seed=4)

    def slow_fill(arrays: list[npt.NDArray[Any]]) -> None:
        filling.set()
        assert proceed.wait(10)
        filler(arrays)

    creator, attacher = SharedWeightStore(0o600), SharedWeightStore(0o600)
    handles: dict[str, WeightHandle] = {}
    thread = threading.Thread(
        target=lambda: handles.setdefault("a", creator.materialize(model, 6, SPECS, slow_fill))
    )
    thread.start()
    assert filling.wait(10)
    waiter = threading.Thread(
        target=lambda: handles.setdefault("b", attacher.materialize(model, 6, SPECS, never_fill))
    )
    waiter.start()
    time.sleep(0.05)
    assert "b" not in handles  # still polling: the region is not READY
    proceed.set()
    thread.join(10)
    waiter.join(10)
    assert filler.calls == 1
    np.testing.assert_array_equal(handles["a"].arrays[0], handles["b"].arrays[0])
    creator.release(handles["a"])
    attacher.release(handles["b"])
    assert not any(SHM.glob(f"rsw-{model}-*"))


def test_sweep_removes_holder_free_regions_of_other_digests(model: str) -> None:
    old_obj, old_lock = _paths(model, 0x10)
    old_obj.write_bytes(bytes(128))
    old_lock.touch()
    orphan_obj, orphan_lock = _paths(model, 0x11)  # object without its lock file
    orphan_obj.write_bytes(bytes(64))
    lonely_lock = _paths(model, 0x12)[1]  # lock file without its object
    lonely_lock.touch()
    held_store = SharedWeightStore(0o600)
    held = held_store.materialize(model, 0x13, SPECS, Filler())
    held_obj, held_lock = _paths(model, 0x13)
    neighbour = SHM / f"rsw-{model}x-{0x10:016x}"  # another model's name, similar prefix
    neighbour.write_bytes(b"keep")
    try:
        store = SharedWeightStore(0o600)
        handle = store.materialize(model, 0x20, SPECS, Filler())
        assert not old_obj.exists()
        assert not old_lock.exists()
        assert not orphan_obj.exists()
        assert not orphan_lock.exists()
        assert not lonely_lock.exists()
        assert held_obj.exists()
        assert held_lock.exists()
        assert neighbour.exists()
        store.release(handle)
        held_store.release(held)
        assert not held_obj.exists()
    finally:
        neighbour.unlink(missing_ok=True)


def test_rename_rekeys_without_touching_the_region(model: str) -> None:
    store = SharedWeightStore(0o600)
    handle = store.materialize(model, 7, SPECS, Filler(seed=6))
    obj, lock = _paths(model, 7)
    inode = obj.stat().st_ino
    store.rename(model, f"{model}-renamed")
    assert handle.key == f"{model}-renamed"
    assert handle.region == obj
    assert obj.stat().st_ino == inode
    np.testing.assert_array_equal(handle.arrays[0], expected_arrays(6)[0])
    store.release(handle)
    assert not obj.exists()
    assert not lock.exists()


def test_release_rules(model: str) -> None:
    store = SharedWeightStore(0o600)
    handle = store.materialize(model, 8, SPECS, Filler())
    with pytest.raises(ValueError, match="not live"):
        SharedWeightStore(0o600).release(handle)
    store.release(handle)
    assert handle.released
    assert handle.arrays == []
    with pytest.raises(ValueError, match="not live"):
        store.release(handle)


def test_arrays_kept_past_release_stay_readable(model: str) -> None:
    store = SharedWeightStore(0o600)
    handle = store.materialize(model, 9, SPECS, Filler(seed=1))
    kept = handle.arrays[0]
    store.release(handle)
    assert not _paths(model, 9)[0].exists()
    np.testing.assert_array_equal(kept, expected_arrays(1)[0])  # mapping outlives the name


def test_same_store_attaches_twice_and_counts_both_holders(model: str) -> None:
    store = SharedWeightStore(0o600)
    filler = Filler()
    one = store.materialize(model, 10, SPECS, filler)
    two = store.materialize(model, 10, SPECS, filler)
    assert filler.calls == 1
    store.release(one)
    assert _paths(model, 10)[0].exists()
    store.release(two)
    assert not _paths(model, 10)[0].exists()


def test_model_without_weights_gets_a_header_only_region(model: str) -> None:
    store = SharedWeightStore(0o600)
    calls: list[int] = []
    handle = store.materialize(model, 11, [], lambda arrays: calls.append(len(arrays)))
    assert calls == [0]
    assert handle.arrays == []
    assert _paths(model, 11)[0].stat().st_size == REGION_HEADER_BYTES
    store.release(handle)


@pytest.mark.parametrize("reverse_axes", [False, True])
def test_shared_store_materialises_a_safetensors_file(
    model: str, tmp_path: Path, reverse_axes: bool
) -> None:
    rng = np.random.default_rng(0)
    tensors: dict[str, npt.NDArray[Any]] = {
        "k": rng.standard_normal((3, 4, 5)).astype(np.float32),
        "b": rng.standard_normal(9).astype(np.float64),
    }
    path = tmp_path / "weights.safetensors"
    save_file(tensors, str(path), metadata={"argument_order": json.dumps(["k", "b"])})
    with SafetensorsReader(path) as reader:
        specs = reader.specs(reverse_axes=reverse_axes)
        digest = weights_digest(model, specs, reader.identity)
        store = SharedWeightStore(0o600)
        handle = store.materialize(
            model, digest, specs, functools.partial(reader.fill, reverse_axes=reverse_axes)
        )
    k, b = handle.arrays
    want_k = np.ascontiguousarray(tensors["k"].transpose()) if reverse_axes else tensors["k"]
    np.testing.assert_array_equal(k, want_k)
    np.testing.assert_array_equal(b, tensors["b"])
    assert handle.nbytes == reader.weight_nbytes
    del k, b
    store.release(handle)
