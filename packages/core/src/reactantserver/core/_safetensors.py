"""Safetensors header reader and ``preadv`` data access for ``weights.safetensors``.

The header is parsed here rather than by the ``safetensors`` package so every rule of
The ``weights.safetensors`` format (docs/reference/bundle.md) is checked in one place and data
never come through a long-lived
mmap: a bundle rewritten in place cannot fault the process::

    with SafetensorsReader(bundle / "weights.safetensors") as reader:
        arrays = [aligned_empty(s.shape, s.dtype.numpy) for s in reader.specs()]
        reader.fill(arrays)
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import struct
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from reactantserver.core.dtypes import DType
from reactantserver.core.errors import BundleError

__all__ = [
    "ALIGNMENT",
    "MAX_HEADER_BYTES",
    "FileIdentity",
    "SafetensorsReader",
    "TensorInfo",
    "WeightSpec",
    "aligned_empty",
]

_log = logging.getLogger("reactantserver.core.weights")

ALIGNMENT = 64
"""Byte alignment of every materialised weight array (host stores and shared regions)."""

MAX_HEADER_BYTES = 100_000_000
"""Largest JSON header accepted; the ``safetensors`` package itself refuses larger ones."""

_LENGTH = struct.Struct("<Q")
_METADATA_KEY = "__metadata__"
_ARGUMENT_ORDER_KEY = "argument_order"
# Linux moves at most 0x7ffff000 bytes per read call; smaller requests keep the loop simple.
_MAX_IO_BYTES = 1 << 30
# Bounds the temporary buffer of an axis-reversed read (format 2.0 weights).
_REVERSE_CHUNK_BYTES = 64 << 20


@attrs.frozen
class WeightSpec:
    """One weight as a store materialises it: name, element type and (materialised) shape."""

    name: str
    dtype: DType
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the dense array."""
        return math.prod(self.shape) * self.dtype.itemsize


@attrs.frozen
class TensorInfo:
    """One tensor entry of a safetensors header, already bounds-checked against the file."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]
    """``[begin, end)`` relative to the start of the data section, as written in the header."""
    file_offset: int
    """Absolute file offset of the first data byte."""

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data."""
        return self.data_offsets[1] - self.data_offsets[0]


@attrs.frozen
class FileIdentity:
    """The identity of an opened file (``st_dev``, ``st_ino``, ``st_size``, ``st_mtime_ns``).

    Part of the shared-region digest, so a weights-only update gets a new region.
    """

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def from_stat(cls, st: os.stat_result) -> FileIdentity:
        """The identity recorded in a ``stat``/``fstat`` result."""
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def aligned_empty(
    shape: Sequence[int], dtype: npt.DTypeLike, align: int = ALIGNMENT
) -> npt.NDArray[Any]:
    """An uninitialised C-contiguous array whose data start on an ``align``-byte boundary."""
    dt = np.dtype(dtype)
    if dt.hasobject or dt.itemsize == 0:
        raise ValueError(f"cannot allocate an aligned array of dtype {dt}")
    if align < 1 or align & (align - 1):
        raise ValueError(f"align must be a positive power of two, got {align}")
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in shape {dims}")
    count = math.prod(dims)
    # At least one element, so even an empty array keeps an aligned data pointer.
    nbytes = max(count, 1) * dt.itemsize
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = -int(raw.ctypes.data) % align
    return raw[start : start + nbytes].view(dt)[:count].reshape(dims)


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class SafetensorsReader:
    """An open ``weights.safetensors``: parsed header plus ``preadv`` access to tensor data.

    The file descriptor is kept until :meth:`close` (use the reader as a context manager),
    so the data stay those of the file that was opened even if the path is later replaced.
    Every problem with the file raises :class:`BundleError` naming it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        try:
            fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise BundleError(f"{self._path}: cannot open weights file: {exc}") from exc
        self._fd = fd
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise BundleError(f"{self._path}: not a regular file")
            self._identity = FileIdentity.from_stat(st)
            self._parse(st.st_size)
        except BaseException:
            os.close(fd)
            self._fd = -1
            raise

    # -- header ------------------------------------------------------------------------------

    def _fail(self, message: str) -> BundleError:
        return BundleError(f"{self._path}: {message}")

    def _parse(self, file_size: int) -> None:
        if file_size < _LENGTH.size:
            raise self._fail(f"file is {file_size} bytes, too short for a safetensors header")
        prefix = bytearray(_LENGTH.size)
        self._pread_exact(memoryview(prefix), 0, "header length")
        header_len = int(_LENGTH.unpack(prefix)[0])
        if header_len > MAX_HEADER_BYTES:
            raise self._fail(
                f"header length {header_len} exceeds the limit of {MAX_HEADER_BYTES} bytes"
            )
        if _LENGTH.size + header_len > file_size:
            raise self._fail(
                f"header length {header_len} runs past the end of the file ({file_size} bytes)"
            )
        raw = bytearray(header_len)
        self._pread_exact(memoryview(raw), _LENGTH.size, "header")
        try:
            header = json.loads(raw.decode("utf-8"), object_pairs_hook=_reject_duplicates)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise self._fail(f"header is not valid JSON: {exc}") from exc
        if not isinstance(header, dict):
            raise self._fail(f"header must be a JSON object, got {type(header).__name__}")

        data_start = _LENGTH.size + header_len
        self._data_start = data_start
        self._metadata = self._parse_metadata(header.pop(_METADATA_KEY, None))
        tensors = {
            name: self._parse_entry(name, entry, data_start) for name, entry in header.items()
        }
        self._check_tiling(tensors.values(), file_size - data_start)
        self._tensors: dict[str, TensorInfo] = dict(
            sorted(tensors.items(), key=lambda kv: kv[1].data_offsets)
        )
        self._argument_order: tuple[str, ...] = self._parse_argument_order()
        self._weight_nbytes: int = sum(self._tensors[n].nbytes for n in self._argument_order)

    def _parse_metadata(self, metadata: object) -> dict[str, str]:
        if metadata is None:
            return {}
        if not isinstance(metadata, dict):
            raise self._fail(f"{_METADATA_KEY} must be a JSON object of strings")
        for key, value in metadata.items():
            if not isinstance(value, str):
                raise self._fail(
                    f"{_METADATA_KEY}.{key} must be a string, got {type(value).__name__}"
                )
        return dict(metadata)

    def _parse_entry(self, name: str, entry: object, data_start: int) -> TensorInfo:
        where = f"tensor {name!r}"
        if not isinstance(entry, dict):
            raise self._fail(f"{where}: entry must be a JSON object")
        missing = [k for k in ("dtype", "shape", "data_offsets") if k not in entry]
        if missing:
            raise self._fail(f"{where}: missing {', '.join(missing)}")
        token = entry["dtype"]
        if not isinstance(token, str):
            raise self._fail(f"{where}: dtype must be a string")
        try:
            dtype = DType.from_safetensors(token)
        except ValueError as exc:
            raise self._fail(f"{where}: {exc}") from None
        shape = entry["shape"]
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise self._fail(f"{where}: shape must be a list of non-negative ints, got {shape}")
        offsets = entry["data_offsets"]
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(_is_int(o) and o >= 0 for o in offsets)
        ):
            raise self._fail(f"{where}: data_offsets must be two non-negative ints, got {offsets}")
        begin, end = offsets
        if begin > end:
            raise self._fail(f"{where}: data_offsets [{begin}, {end}] are out of order")
        expected = math.prod(shape) * dtype.itemsize
        if end - begin != expected:
            raise self._fail(
                f"{where}: data_offsets [{begin}, {end}] span {end - begin} bytes but "
                f"{token}{shape} needs {expected}"
            )
        return TensorInfo(name, dtype, tuple(shape), (begin, end), data_start + begin)

    def _check_tiling(self, tensors: Iterable[TensorInfo], data_len: int) -> None:
        # The format requires the tensors to tile the data section exactly: no overlap, no
        # hole, nothing after the last tensor and nothing past the end of the file.
        cursor = 0
        for info in sorted(tensors, key=lambda t: t.data_offsets):
            begin, end = info.data_offsets
            if end > data_len:
                raise self._fail(
                    f"tensor {info.name!r}: data_offsets [{begin}, {end}] run past the end "
                    f"of the file (data section is {data_len} bytes)"
                )
            if begin < cursor:
                raise self._fail(
                    f"tensor {info.name!r}: data_offsets [{begin}, {end}] overlap the "
                    f"previous tensor (which ends at {cursor})"
                )
            if begin > cursor:
                raise self._fail(
                    f"tensor {info.name!r}: data_offsets [{begin}, {end}] leave a hole "
                    f"after byte {cursor} of the data section"
                )
            cursor = end
        if cursor != data_len:
            raise self._fail(
                f"{data_len - cursor} bytes after the last tensor are not covered by the header"
            )

    def _parse_argument_order(self) -> tuple[str, ...]:
        encoded = self._metadata.get(_ARGUMENT_ORDER_KEY)
        if encoded is None:
            if self._tensors:
                raise self._fail(
                    f"{_METADATA_KEY}.{_ARGUMENT_ORDER_KEY} is missing but the file holds "
                    f"{len(self._tensors)} tensors"
                )
            return ()
        try:
            order = json.loads(encoded)
        except ValueError as exc:
            raise self._fail(
                f"{_METADATA_KEY}.{_ARGUMENT_ORDER_KEY} is not valid JSON: {exc}"
            ) from exc
        if not isinstance(order, list) or not all(isinstance(n, str) for n in order):
            raise self._fail(
                f"{_METADATA_KEY}.{_ARGUMENT_ORDER_KEY} must be a JSON list of tensor names"
            )
        seen: set[str] = set()
        for name in order:
            if name in seen:
                raise self._fail(f"{_METADATA_KEY}.{_ARGUMENT_ORDER_KEY} lists {name!r} twice")
            if name not in self._tensors:
                raise self._fail(
                    f"{_METADATA_KEY}.{_ARGUMENT_ORDER_KEY} lists {name!r}, "
                    "which is not a tensor of the file"
                )
            seen.add(name)
        unlisted = [n for n in self._tensors if n not in seen]
        if unlisted:
            _log.warning(
                "%s: ignoring %d tensor(s) not in argument_order: %s",
                self._path,
                len(unlisted),
                ", ".join(unlisted),
            )
        return tuple(order)

    # -- header facts -----------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The path the file was opened at."""
        return self._path

    @property
    def identity(self) -> FileIdentity:
        """``fstat`` identity of the opened file (input to the shared-region digest)."""
        return self._identity

    @property
    def metadata(self) -> Mapping[str, str]:
        """The ``__metadata__`` string map (empty when absent)."""
        return self._metadata

    @property
    def tensors(self) -> Mapping[str, TensorInfo]:
        """Every tensor of the file, listed or not, in data order."""
        return self._tensors

    @property
    def argument_order(self) -> tuple[str, ...]:
        """The weights in entry-signature order (``__metadata__["argument_order"]``)."""
        return self._argument_order

    @property
    def weight_nbytes(self) -> int:
        """Footprint of the listed tensors: sum of prod(shape) * itemsize, from the header only."""
        return self._weight_nbytes

    @property
    def data_start(self) -> int:
        """Absolute file offset of the data section (8 + header length)."""
        return self._data_start

    def specs(self, *, reverse_axes: bool = False) -> list[WeightSpec]:
        """The listed weights in ``argument_order``; ``reverse_axes`` gives 2.0 shapes reversed."""
        out = []
        for name in self._argument_order:
            info = self._tensors[name]
            shape = info.shape[::-1] if reverse_axes else info.shape
            out.append(WeightSpec(name, info.dtype, shape))
        return out

    # -- data -------------------------------------------------------------------------------

    def read_into(self, name: str, out: npt.NDArray[Any], *, reverse_axes: bool = False) -> None:
        """Fill ``out`` with tensor ``name``; ``reverse_axes`` stores it axis-reversed (2.0).

        ``out`` must be writeable, C-contiguous, of the tensor's NumPy dtype and of its shape
        (reversed with ``reverse_axes``), e.g. from :func:`aligned_empty`. ``KeyError`` for an
        unknown name, ``ValueError`` for a wrong ``out``, :class:`BundleError` when the file
        is shorter than its header promised.
        """
        info = self._tensors.get(name)
        if info is None:
            raise KeyError(f"{self._path}: no tensor named {name!r}")
        shape = info.shape[::-1] if reverse_axes else info.shape
        want = info.dtype.numpy
        if out.dtype != want or out.shape != shape:
            raise ValueError(
                f"tensor {name!r} needs a {want}{list(shape)} array, "
                f"got {out.dtype}{list(out.shape)}"
            )
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError(f"tensor {name!r}: out must be C-contiguous and writeable")
        if info.nbytes == 0:
            return
        if not reverse_axes or len(shape) < 2:
            self._pread_exact(_bytes_of(out), info.file_offset, f"tensor {name!r}")
            return
        # Read whole rows of the stored (Julia-shaped) tensor into a bounded buffer and
        # scatter each slab into the trailing axis of the reversed output.
        rows = info.shape[0]
        row_bytes = info.nbytes // rows
        per_chunk = max(1, _REVERSE_CHUNK_BYTES // row_bytes)
        buffer = aligned_empty((min(per_chunk, rows), *info.shape[1:]), out.dtype)
        for first in range(0, rows, per_chunk):
            count = min(per_chunk, rows - first)
            part = buffer[:count]
            self._pread_exact(
                _bytes_of(part), info.file_offset + first * row_bytes, f"tensor {name!r}"
            )
            np.copyto(out[..., first : first + count], part.transpose())

    def read(self, name: str, *, reverse_axes: bool = False) -> npt.NDArray[Any]:
        """A fresh 64-byte-aligned array holding tensor ``name`` (see :meth:`read_into`)."""
        info = self._tensors.get(name)
        if info is None:
            raise KeyError(f"{self._path}: no tensor named {name!r}")
        shape = info.shape[::-1] if reverse_axes else info.shape
        out = aligned_empty(shape, info.dtype.numpy)
        self.read_into(name, out, reverse_axes=reverse_axes)
        return out

    def fill(self, arrays: Sequence[npt.NDArray[Any]], *, reverse_axes: bool = False) -> None:
        """Fill one array per listed weight, in ``argument_order`` (a weight-store ``fill``)."""
        if len(arrays) != len(self._argument_order):
            raise ValueError(
                f"{self._path}: {len(self._argument_order)} weights, got {len(arrays)} arrays"
            )
        for name, out in zip(self._argument_order, arrays, strict=True):
            self.read_into(name, out, reverse_axes=reverse_axes)

    def _pread_exact(self, view: memoryview, offset: int, what: str) -> None:
        with self._lock:
            fd = self._fd
            if fd < 0:
                raise ValueError(f"{self._path}: reader is closed")
            done, total = 0, len(view)
            while done < total:
                try:
                    got = os.preadv(fd, [view[done : done + _MAX_IO_BYTES]], offset + done)
                except OSError as exc:
                    raise self._fail(f"reading {what} at offset {offset + done}: {exc}") from exc
                if got == 0:
                    raise self._fail(
                        f"short read of {what}: got {done} of {total} bytes at offset {offset} "
                        "(was the file truncated?)"
                    )
                done += got

    # -- lifetime ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._fd < 0

    def close(self) -> None:
        """Close the file descriptor; idempotent. Header facts stay readable."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> SafetensorsReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"SafetensorsReader({str(self._path)!r}, tensors={len(self._tensors)}, "
            f"weights={len(self._argument_order)}, weight_nbytes={self._weight_nbytes})"
        )


def _bytes_of(array: npt.NDArray[Any]) -> memoryview:
    # Extension dtypes (bfloat16, fp8) do not export a buffer format; a byte view always does.
    return array.reshape(-1).view(np.uint8).data
