"""The safetensors header reader: rejection rules, weight_nbytes, preadv reads, 2.0 reversal."""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
from safetensors.numpy import save_file

from reactantserver.core import _safetensors
from reactantserver.core.dtypes import DType
from reactantserver.core.errors import BundleError
from reactantserver.core.weights import (
    MAX_HEADER_BYTES,
    FileIdentity,
    SafetensorsReader,
    TensorInfo,
    WeightSpec,
    aligned_empty,
)


def _save(path: Path, tensors: dict[str, npt.NDArray[Any]], order: list[str] | None = None) -> Path:
    metadata = None if order is None else {"argument_order": json.dumps(order)}
    save_file(tensors, str(path), metadata=metadata)
    return path


def _write_raw(path: Path, header: object, data: bytes = b"", *, length: int | None = None) -> Path:
    """A hand-made file: ``header`` is JSON-encoded unless it is already bytes."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    prefix = struct.pack("<Q", len(raw) if length is None else length)
    path.write_bytes(prefix + raw + data)
    return path


def _entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def _order(*names: str) -> dict[str, str]:
    return {"argument_order": json.dumps(list(names))}


@pytest.fixture
def sample() -> dict[str, npt.NDArray[Any]]:
    rng = np.random.default_rng(7)
    return {
        "w1": rng.standard_normal((3, 5)).astype(np.float32),
        "b1": rng.standard_normal(5).astype(np.float16),
        "idx": np.arange(24, dtype=np.int64).reshape(2, 3, 4),
        "mask": np.array([True, False, True]),
        "scalar": np.array(2.5, dtype=np.float64),
        "bytes": np.arange(7, dtype=np.uint8),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


ORDER = ["idx", "w1", "b1", "mask", "scalar", "empty", "bytes"]


def _read_all(reader: SafetensorsReader) -> dict[str, npt.NDArray[Any]]:
    return {name: reader.read(name) for name in reader.argument_order}


# -- reading valid files -----------------------------------------------------------------------


def test_header_facts_match_the_saved_file(
    tmp_path: Path, sample: dict[str, npt.NDArray[Any]]
) -> None:
    path = _save(tmp_path / "weights.safetensors", sample, ORDER)
    with SafetensorsReader(path) as reader:
        assert reader.path == path
        assert reader.argument_order == tuple(ORDER)
        assert set(reader.tensors) == set(sample)
        for name, array in sample.items():
            info = reader.tensors[name]
            assert isinstance(info, TensorInfo)
            assert info.dtype is DType.from_numpy(array.dtype)
            assert info.shape == array.shape
            assert info.nbytes == array.nbytes
            assert info.file_offset == reader.data_start + info.data_offsets[0]
        offsets = [info.data_offsets for info in reader.tensors.values()]
        assert offsets == sorted(offsets)  # tensors are listed in data order
        assert reader.metadata["argument_order"] == json.dumps(ORDER)
        assert reader.weight_nbytes == sum(a.nbytes for a in sample.values())


def test_preadv_reads_equal_the_saved_arrays(
    tmp_path: Path, sample: dict[str, npt.NDArray[Any]]
) -> None:
    path = _save(tmp_path / "weights.safetensors", sample, ORDER)
    with SafetensorsReader(path) as reader:
        for name, got in _read_all(reader).items():
            assert got.dtype == sample[name].dtype
            np.testing.assert_array_equal(got, sample[name])
            assert got.ctypes.data % 64 == 0


def test_fill_reads_argument_order_into_caller_arrays(
    tmp_path: Path, sample: dict[str, npt.NDArray[Any]]
) -> None:
    path = _save(tmp_path / "weights.safetensors", sample, ORDER)
    with SafetensorsReader(path) as reader:
        specs = reader.specs()
        assert [s.name for s in specs] == ORDER
        assert all(isinstance(s, WeightSpec) for s in specs)
        arrays = [aligned_empty(s.shape, s.dtype.numpy) for s in specs]
        reader.fill(arrays)
    for spec, array in zip(specs, arrays, strict=True):
        np.testing.assert_array_equal(array, sample[spec.name])
    assert sum(s.nbytes for s in specs) == reader.weight_nbytes


def test_bf16_and_fp8_tensors_read_bit_exact(tmp_path: Path) -> None:
    bf = np.array([[1.5, -2.0, 3.25]], dtype=ml_dtypes.bfloat16)
    f8 = np.array([0.5, 1.0, -4.0, 8.0], dtype=ml_dtypes.float8_e4m3fn)
    data = bf.tobytes() + f8.tobytes()
    header = {
        "__metadata__": _order("bf", "f8"),
        "bf": _entry("BF16", [1, 3], 0, 6),
        "f8": _entry("F8_E4M3", [4], 6, 10),
    }
    with SafetensorsReader(_write_raw(tmp_path / "w.safetensors", header, data)) as reader:
        assert reader.weight_nbytes == 10
        got_bf, got_f8 = reader.read("bf"), reader.read("f8")
    assert got_bf.dtype == ml_dtypes.bfloat16
    assert got_bf.tobytes() == bf.tobytes()
    assert got_f8.tobytes() == f8.tobytes()


def test_weight_nbytes_counts_listed_tensors_only(
    tmp_path: Path, sample: dict[str, npt.NDArray[Any]], caplog: pytest.LogCaptureFixture
) -> None:
    path = _save(tmp_path / "weights.safetensors", sample, ["w1", "idx"])
    with caplog.at_level(logging.WARNING), SafetensorsReader(path) as reader:
        assert reader.argument_order == ("w1", "idx")
        assert reader.weight_nbytes == sample["w1"].nbytes + sample["idx"].nbytes
        assert [s.name for s in reader.specs()] == ["w1", "idx"]
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert str(path) in warning
    for ignored in ("b1", "mask", "scalar", "bytes", "empty"):
        assert ignored in warning


def test_file_without_tensors_has_no_weights(tmp_path: Path) -> None:
    path = _write_raw(tmp_path / "empty.safetensors", {})
    with SafetensorsReader(path) as reader:
        assert reader.tensors == {}
        assert reader.argument_order == ()
        assert reader.weight_nbytes == 0
        assert reader.specs() == []
        reader.fill([])


def test_file_without_tensors_and_empty_order(tmp_path: Path) -> None:
    path = _write_raw(tmp_path / "e.safetensors", {"__metadata__": _order()})
    with SafetensorsReader(path) as reader:
        assert reader.argument_order == ()


def test_header_padding_spaces_are_accepted(tmp_path: Path) -> None:
    raw = json.dumps({"__metadata__": _order("a"), "a": _entry("U8", [2], 0, 2)}).encode()
    raw += b" " * (8 - len(raw) % 8)
    with SafetensorsReader(_write_raw(tmp_path / "p.safetensors", raw, b"\x01\x02")) as reader:
        np.testing.assert_array_equal(reader.read("a"), [1, 2])


# -- axis reversal (format 2.0) ----------------------------------------------------------------


@pytest.mark.parametrize("chunk_bytes", [64 << 20, 1, 40])
def test_reverse_axes_materialises_the_transpose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_bytes: int
) -> None:
    # Tiny chunk sizes force the bounded-buffer path to run one or a few rows at a time.
    monkeypatch.setattr(_safetensors, "_REVERSE_CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(1)
    tensors: dict[str, npt.NDArray[Any]] = {
        "k": rng.standard_normal((5, 3, 2)).astype(np.float32),
        "m": rng.integers(0, 100, (4, 7)).astype(np.int16),
        "v": np.arange(6, dtype=np.float64),
        "s": np.array(3, dtype=np.int32),
    }
    path = _save(tmp_path / "w.safetensors", tensors, ["k", "m", "v", "s"])
    with SafetensorsReader(path) as reader:
        specs = reader.specs(reverse_axes=True)
        assert [s.shape for s in specs] == [(2, 3, 5), (7, 4), (6,), ()]
        arrays = [aligned_empty(s.shape, s.dtype.numpy) for s in specs]
        reader.fill(arrays, reverse_axes=True)
        single = reader.read("k", reverse_axes=True)
    for spec, got in zip(specs, arrays, strict=True):
        want = np.ascontiguousarray(tensors[spec.name].transpose())
        np.testing.assert_array_equal(got, want)
        assert got.flags.c_contiguous
    np.testing.assert_array_equal(single, tensors["k"].transpose())


def test_reverse_axes_requires_the_reversed_shape(tmp_path: Path) -> None:
    path = _save(tmp_path / "w.safetensors", {"m": np.zeros((2, 3), np.float32)}, ["m"])
    with SafetensorsReader(path) as reader, pytest.raises(ValueError, match="needs a"):
        reader.read_into("m", np.zeros((2, 3), np.float32), reverse_axes=True)


# -- read_into argument checks -----------------------------------------------------------------


def test_read_into_rejects_wrong_out_arrays(tmp_path: Path) -> None:
    path = _save(tmp_path / "w.safetensors", {"m": np.ones((2, 4), np.float32)}, ["m"])
    with SafetensorsReader(path) as reader:
        with pytest.raises(KeyError, match="nope"):
            reader.read_into("nope", np.zeros(1))
        with pytest.raises(KeyError):
            reader.read("nope")
        with pytest.raises(ValueError, match="needs a"):
            reader.read_into("m", np.zeros((2, 4), np.float64))
        with pytest.raises(ValueError, match="needs a"):
            reader.read_into("m", np.zeros((4, 2), np.float32))
        with pytest.raises(ValueError, match="C-contiguous"):
            reader.read_into("m", np.zeros((4, 2), np.float32).T)
        frozen = np.zeros((2, 4), np.float32)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="writeable"):
            reader.read_into("m", frozen)
        with pytest.raises(ValueError, match="1 weights, got 2"):
            reader.fill([np.zeros((2, 4), np.float32)] * 2)


# -- descriptor lifetime -----------------------------------------------------------------------


def test_reader_keeps_its_descriptor_not_a_mapping(tmp_path: Path) -> None:
    path = _save(tmp_path / "w.safetensors", {"a": np.arange(4, dtype=np.int32)}, ["a"])
    with SafetensorsReader(path) as reader:
        # Replacing the bundle file in place must not affect an open generation.
        replacement = _save(tmp_path / "new.safetensors", {"a": np.full(4, 9, np.int32)}, ["a"])
        os.replace(replacement, path)
        np.testing.assert_array_equal(reader.read("a"), [0, 1, 2, 3])
        maps = Path("/proc/self/maps").read_text()
        assert str(path) not in maps
        assert reader.identity != FileIdentity.from_stat(path.stat())


def test_identity_is_the_fstat_of_the_opened_file(tmp_path: Path) -> None:
    path = _save(tmp_path / "w.safetensors", {"a": np.arange(4, dtype=np.int32)}, ["a"])
    with SafetensorsReader(path) as reader:
        st = path.stat()
        assert reader.identity == FileIdentity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def test_truncated_file_is_a_short_read(tmp_path: Path) -> None:
    tensors = {"a": np.arange(100, dtype=np.float64), "b": np.arange(10, dtype=np.float64)}
    path = _save(tmp_path / "w.safetensors", tensors, ["a", "b"])
    with SafetensorsReader(path) as reader:
        os.truncate(path, reader.tensors["b"].file_offset + 8)
        with pytest.raises(BundleError, match="short read") as excinfo:
            reader.read("b")
        assert str(path) in str(excinfo.value)
        np.testing.assert_array_equal(reader.read("a"), tensors["a"])


def test_close_is_idempotent_and_stops_reads(tmp_path: Path) -> None:
    path = _save(tmp_path / "w.safetensors", {"a": np.arange(4, dtype=np.int32)}, ["a"])
    reader = SafetensorsReader(path)
    assert not reader.closed
    reader.close()
    reader.close()
    assert reader.closed
    assert reader.argument_order == ("a",)  # header facts outlive the descriptor
    with pytest.raises(ValueError, match="closed"):
        reader.read("a")
    assert "weight_nbytes=16" in repr(reader)


def test_missing_file_is_a_bundle_error(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="cannot open"):
        SafetensorsReader(tmp_path / "absent.safetensors")
    with pytest.raises(BundleError, match="not a regular file"):
        SafetensorsReader(tmp_path)


# -- rejection rules ---------------------------------------------------------------------------

A4 = _entry("F32", [1], 0, 4)

REJECTS: list[tuple[str, object, bytes, int | None, str]] = [
    ("too short for a length", b"", b"", 0, "too short"),
    ("absurd header length", b"{}", b"", MAX_HEADER_BYTES + 1, "exceeds the limit"),
    ("header past end of file", b"{}", b"", 4096, "runs past the end"),
    ("not utf-8", b'{"\xff": 1}', b"", None, "not valid JSON"),
    ("not json", b"{nope", b"", None, "not valid JSON"),
    ("not an object", [1, 2], b"", None, "must be a JSON object"),
    ("duplicate key", b'{"a": 1, "a": 2}', b"", None, "duplicate key"),
    ("metadata not an object", {"__metadata__": ["x"]}, b"", None, "__metadata__"),
    (
        "metadata value not a string",
        {"__metadata__": {"argument_order": ["a"]}, "a": A4},
        bytes(4),
        None,
        "must be a string",
    ),
    ("entry not an object", {"__metadata__": _order("a"), "a": 3}, b"", None, "JSON object"),
    (
        "entry missing keys",
        {"__metadata__": _order("a"), "a": {"dtype": "F32"}},
        b"",
        None,
        "missing shape, data_offsets",
    ),
    (
        "dtype not a string",
        {"__metadata__": _order("a"), "a": {"dtype": 4, "shape": [], "data_offsets": [0, 0]}},
        b"",
        None,
        "dtype must be a string",
    ),
    (
        "unknown dtype",
        {"__metadata__": _order("a"), "a": _entry("C64", [1], 0, 8)},
        bytes(8),
        None,
        "unsupported safetensors dtype",
    ),
    (
        "negative dim",
        {"__metadata__": _order("a"), "a": _entry("U8", [-1], 0, 0)},
        b"",
        None,
        "non-negative ints",
    ),
    (
        "boolean dim",
        {"__metadata__": _order("a"), "a": _entry("U8", [True], 0, 1)},
        b"\x00",
        None,
        "non-negative ints",
    ),
    (
        "shape not a list",
        {"__metadata__": _order("a"), "a": {"dtype": "U8", "shape": 3, "data_offsets": [0, 3]}},
        bytes(3),
        None,
        "non-negative ints",
    ),
    (
        "three offsets",
        {
            "__metadata__": _order("a"),
            "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 2]},
        },
        b"\x00",
        None,
        "two non-negative ints",
    ),
    (
        "negative offset",
        {"__metadata__": _order("a"), "a": _entry("U8", [1], -1, 0)},
        b"",
        None,
        "two non-negative ints",
    ),
    (
        "out-of-order offsets",
        {"__metadata__": _order("a"), "a": _entry("U8", [0], 4, 0)},
        bytes(4),
        None,
        "out of order",
    ),
    (
        "size mismatch",
        {"__metadata__": _order("a"), "a": _entry("F32", [2], 0, 4)},
        bytes(4),
        None,
        "needs 8",
    ),
    (
        "offsets past end of file",
        {"__metadata__": _order("a"), "a": _entry("F32", [2], 0, 8)},
        bytes(4),
        None,
        "past the end",
    ),
    (
        "overlapping tensors",
        {
            "__metadata__": _order("a", "b"),
            "a": _entry("F32", [2], 0, 8),
            "b": _entry("F32", [1], 4, 8),
        },
        bytes(8),
        None,
        "overlap",
    ),
    (
        "hole between tensors",
        {
            "__metadata__": _order("a", "b"),
            "a": _entry("F32", [1], 0, 4),
            "b": _entry("F32", [1], 8, 12),
        },
        bytes(12),
        None,
        "hole",
    ),
    (
        "trailing bytes",
        {"__metadata__": _order("a"), "a": A4},
        bytes(6),
        None,
        "2 bytes after the last tensor",
    ),
    ("tensors without argument_order", {"a": A4}, bytes(4), None, "argument_order is missing"),
    (
        "argument_order not json",
        {"__metadata__": {"argument_order": "[a"}, "a": A4},
        bytes(4),
        None,
        "argument_order is not valid JSON",
    ),
    (
        "argument_order not a list of names",
        {"__metadata__": {"argument_order": '{"a": 1}'}, "a": A4},
        bytes(4),
        None,
        "JSON list of tensor names",
    ),
    (
        "argument_order names a missing tensor",
        {"__metadata__": _order("a", "ghost"), "a": A4},
        bytes(4),
        None,
        "'ghost', which is not a tensor",
    ),
    (
        "argument_order with a duplicate",
        {"__metadata__": _order("a", "a"), "a": A4},
        bytes(4),
        None,
        "lists 'a' twice",
    ),
    (
        "argument_order names tensors of an empty file",
        {"__metadata__": _order("a")},
        b"",
        None,
        "not a tensor of the file",
    ),
]


@pytest.mark.parametrize(
    ("header", "data", "length", "message"),
    [r[1:] for r in REJECTS],
    ids=[r[0] for r in REJECTS],
)
def test_corrupt_headers_are_bundle_errors_naming_the_file(
    tmp_path: Path, header: object, data: bytes, length: int | None, message: str
) -> None:
    path = tmp_path / "weights.safetensors"
    if length == 0:
        path.write_bytes(b"\x01\x02\x03")
    else:
        _write_raw(path, header, data, length=length)
    with pytest.raises(BundleError) as excinfo:
        SafetensorsReader(path)
    assert str(path) in str(excinfo.value)
    assert message in str(excinfo.value)


def test_rejected_file_leaves_no_descriptor_open(tmp_path: Path) -> None:
    path = _write_raw(tmp_path / "w.safetensors", {"a": A4}, bytes(4))
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(BundleError):
            SafetensorsReader(path)
    assert len(os.listdir("/proc/self/fd")) == before


# -- aligned allocation ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.bool_, np.int64, ml_dtypes.bfloat16])
@pytest.mark.parametrize("shape", [(), (0,), (3, 5), (1, 7, 2)])
def test_aligned_empty_is_aligned_and_contiguous(shape: tuple[int, ...], dtype: Any) -> None:
    for align in (64, 128, 4096):
        array = aligned_empty(shape, dtype, align)
        assert array.shape == shape
        assert array.dtype == np.dtype(dtype)
        assert array.flags.c_contiguous
        assert array.flags.writeable
        assert array.ctypes.data % align == 0


def test_aligned_empty_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="dtype"):
        aligned_empty((2,), object)
    with pytest.raises(ValueError, match="power of two"):
        aligned_empty((2,), np.float32, 48)
    with pytest.raises(ValueError, match="negative"):
        aligned_empty((-1,), np.float32)


def test_weight_spec_nbytes() -> None:
    assert WeightSpec("w", DType.BF16, (3, 4)).nbytes == 24
    assert WeightSpec("s", DType.F64, ()).nbytes == 8
    assert WeightSpec("z", DType.F32, (0, 9)).nbytes == 0
