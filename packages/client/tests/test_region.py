"""ShmRegion / create_region: real POSIX SHM objects in /dev/shm."""

from __future__ import annotations

import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from reactantserver.client import ShmRegion, create_region

SHM = Path("/dev/shm")


@pytest.fixture
def key() -> Iterator[str]:
    """A fresh ``/name`` key; its object is removed afterwards whatever the test did."""
    name = f"rsclient-unit-region-{uuid.uuid4().hex[:12]}"
    yield f"/{name}"
    (SHM / name).unlink(missing_ok=True)


def test_create_makes_a_private_object(key: str) -> None:
    region = create_region(key, 4096)
    try:
        path = SHM / key[1:]
        assert path.is_file()
        info = path.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_size >= 4096
        assert (region.key, region.name, region.nbytes) == (key, key[1:], 4096)
        assert not region.closed
        assert repr(region) == f"ShmRegion({key!r}, 4096 bytes, name={key[1:]!r})"
    finally:
        region.close(unlink=True)


def test_key_without_a_leading_slash(key: str) -> None:
    with create_region(key[1:], 64) as region:
        assert region.key == key
        assert region.name == key[1:]
        assert (SHM / key[1:]).is_file()


def test_write_read_round_trip(key: str) -> None:
    with create_region(key, 4096) as region:
        data = np.arange(12, dtype=np.float32).reshape(3, 4)
        assert region.write(64, data) == 48
        got = region.read(64, (3, 4), np.float32)
        np.testing.assert_array_equal(got, data)
        assert got.dtype == np.float32
        assert got.shape == (3, 4)
        # A copy by default: later writes do not show through.
        region.write(64, np.zeros_like(data))
        np.testing.assert_array_equal(got, data)
        np.testing.assert_array_equal(region.read(64, [12], "float32"), np.zeros(12))


def test_write_is_row_major(key: str) -> None:
    with create_region(key, 256) as region:
        data = np.arange(6, dtype=np.int32).reshape(2, 3)
        region.write(0, data.T)
        np.testing.assert_array_equal(region.read(0, (3, 2), np.int32), data.T)
        np.testing.assert_array_equal(region.read(0, (6,), np.int32), [0, 3, 1, 4, 2, 5])


def test_write_accepts_lists(key: str) -> None:
    with create_region(key, 64) as region:
        assert region.write(8, [1, 2, 3]) == 3 * np.asarray([1]).itemsize
        np.testing.assert_array_equal(region.read(8, (3,), np.asarray([1]).dtype), [1, 2, 3])


def test_read_without_copy_shares_memory(key: str) -> None:
    with create_region(key, 256) as region:
        view = region.read(16, (4,), np.int64, copy=False)
        copied = region.read(16, (4,), np.int64)
        assert not np.shares_memory(view, copied)
        region.write(16, np.array([5, 6, 7, 8], np.int64))
        np.testing.assert_array_equal(view, [5, 6, 7, 8])
        np.testing.assert_array_equal(copied, [0, 0, 0, 0])
        again = region.read(16, (4,), np.int64, copy=False)
        assert np.shares_memory(view, again)
        del view, again


def test_two_mappings_of_one_object_see_each_other(key: str) -> None:
    with create_region(key, 128) as writer:
        reader = ShmRegion(key, 128, create=False)
        try:
            writer.write(0, np.array([1.25, -3.5], np.float64))
            np.testing.assert_array_equal(reader.read(0, (2,), np.float64), [1.25, -3.5])
            reader.write(16, np.array([9], np.uint8))
            assert writer.read(16, (1,), np.uint8)[0] == 9
        finally:
            reader.close()
        # Closing the second mapping without unlink leaves the object for the first.
        assert (SHM / key[1:]).is_file()
        assert writer.read(16, (1,), np.uint8)[0] == 9


def test_create_region_opens_an_existing_object(key: str) -> None:
    with create_region(key, 128) as first:
        first.write(0, np.array([42], np.int32))
        second = create_region(key, 128)
        try:
            assert second.read(0, (1,), np.int32)[0] == 42
        finally:
            second.close()


def test_create_region_grows_a_smaller_object(key: str) -> None:
    with create_region(key, 64) as small:
        small.write(0, np.array([7], np.int16))
        big = create_region(key, 8192)
        try:
            assert (SHM / key[1:]).stat().st_size >= 8192
            assert big.read(0, (1,), np.int16)[0] == 7
            big.write(8190, np.array([1], np.int16))
        finally:
            big.close()


def test_open_without_create(key: str) -> None:
    with pytest.raises(FileNotFoundError):
        ShmRegion(key, 64, create=False)
    with create_region(key, 64), pytest.raises(ValueError, match="smaller"):
        ShmRegion(key, 65, create=False)


@pytest.mark.parametrize(("offset", "nbytes"), [(-1, 4), (0, 257), (253, 4), (256, 1), (10**15, 1)])
def test_bounds(key: str, offset: int, nbytes: int) -> None:
    with create_region(key, 256) as region:
        with pytest.raises(ValueError, match="do not fit"):
            region.write(offset, np.zeros(nbytes, np.uint8))
        with pytest.raises(ValueError, match="do not fit"):
            region.read(offset, (nbytes,), np.uint8)
        with pytest.raises(ValueError, match="do not fit"):
            region.read(offset, (nbytes,), np.uint8, copy=False)


def test_exact_fit_at_the_end(key: str) -> None:
    with create_region(key, 256) as region:
        region.write(252, np.array([3], np.int32))
        assert region.read(252, (1,), np.int32)[0] == 3


def test_close_keeps_the_object_unless_unlinked(key: str) -> None:
    path = SHM / key[1:]
    region = create_region(key, 64)
    region.close()
    assert region.closed
    assert path.is_file()
    with pytest.raises(ValueError, match="closed"):
        region.read(0, (1,), np.uint8)
    with pytest.raises(ValueError, match="closed"):
        region.write(0, np.zeros(1, np.uint8))
    region.close()  # idempotent
    region.close(unlink=True)
    assert not path.exists()
    region.close(unlink=True)  # unlinking an already gone object is fine


def test_close_unlink_removes_the_object(key: str) -> None:
    region = create_region(key, 64)
    region.close(unlink=True)
    assert region.closed
    assert not (SHM / key[1:]).exists()


def test_context_manager_unmaps_and_unlinks(key: str) -> None:
    with create_region(key, 64) as region:
        assert (SHM / key[1:]).is_file()
    assert region.closed
    assert not (SHM / key[1:]).exists()


def test_context_manager_cleans_up_on_error(key: str) -> None:
    with pytest.raises(RuntimeError, match="boom"), create_region(key, 64):
        raise RuntimeError("boom")
    assert not (SHM / key[1:]).exists()


def test_close_while_a_view_is_alive(key: str) -> None:
    region = create_region(key, 64)
    region.write(0, np.array([11, 12], np.uint8))
    view = region.read(0, (2,), np.uint8, copy=False)
    region.close(unlink=True)  # must not raise: the mapping lives on until the view goes
    assert region.closed
    assert not (SHM / key[1:]).exists()
    np.testing.assert_array_equal(view, [11, 12])
    del view


@pytest.mark.parametrize("bad", ["a/b", "/a/b", "..", "/..", ".", "", "/", "x\0y"])
def test_bad_keys(bad: str) -> None:
    with pytest.raises(ValueError, match="single path component"):
        create_region(bad, 64)


@pytest.mark.parametrize("nbytes", [0, -1])
def test_empty_regions_are_refused(key: str, nbytes: int) -> None:
    with pytest.raises(ValueError, match="at least one byte"):
        create_region(key, nbytes)
    assert not (SHM / key[1:]).exists()
