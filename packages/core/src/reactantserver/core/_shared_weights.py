"""Node-shared host weights: one POSIX SHM region per model, coordinated with ``flock``.

Implements ``SharedWeightStore``. Every worker of a node that loads the
same model (same digest) maps the same ``/dev/shm/rsw-<model>-<digest>`` object read-only;
exactly one of them fills it. The lock file next to it carries the holder count in the
kernel: each attached worker keeps ``LOCK_SH`` on it, so whoever can take ``LOCK_EX`` is the
last one and removes both files.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import math
import mmap
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import attrs
import numpy as np
import numpy.typing as npt

from reactantserver.core._safetensors import ALIGNMENT, FileIdentity, WeightSpec

__all__ = [
    "DEFAULT_ATTACH_TIMEOUT_S",
    "DEFAULT_SHM_DIR",
    "POLL_INTERVAL_S",
    "REGION_HEADER_BYTES",
    "REGION_MAGIC",
    "FillFn",
    "SharedWeightStore",
    "WeightHandle",
    "region_layout",
    "region_name",
    "weights_digest",
]

_log = logging.getLogger("reactantserver.core.weights")

REGION_MAGIC = 0x52535701
"""First u32 of every shared weight region (``"RSW"`` + layout version 1)."""
REGION_HEADER_BYTES = 64
"""Bytes before the first tensor: magic u32, ready u32, digest u64, zero padding."""
DEFAULT_SHM_DIR = "/dev/shm"
"""Where regions live; every worker of a node must see the same one (same IPC namespace)."""
DEFAULT_ATTACH_TIMEOUT_S = 60.0
"""How long a worker waits for another worker to finish filling a region."""
POLL_INTERVAL_S = 0.005
"""Sleep between attempts while another worker fills the region."""

_DIGEST_FORMAT = "rsw-1"
_HEADER = struct.Struct("<IIQ")
_READY = struct.Struct("<I")
_READY_OFFSET = 4
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_MAX_MODEL_CHARS = 128

FillFn: TypeAlias = Callable[[list[npt.NDArray[Any]]], None]
"""Writes the weights into the arrays it is given (one per spec, in spec order)."""


@attrs.define(eq=False)
class WeightHandle:
    """A model's materialised host weights, as handed out by a weight store.

    ``arrays`` are read-only, 64-byte aligned and in spec order. Give the handle back with
    the store's ``release`` after dropping every reference to the arrays.
    """

    key: str
    digest: int
    arrays: list[npt.NDArray[Any]]
    nbytes: int
    region: Path | None = None
    """The shared-memory object backing the arrays (``None`` for private weights)."""
    released: bool = False


def weights_digest(model: str, specs: Sequence[WeightSpec], identity: FileIdentity) -> int:
    """The 64-bit key of a model's shared region: layout plus weights-file identity.

    First 8 bytes of BLAKE2b over canonical JSON of ``["rsw-1", model, [[name, dtype token,
    shape], ...], [st_dev, st_ino, st_size, st_mtime_ns]]``; workers that agree on all of it
    share a region, and a weights-only update (new inode or mtime) gets a new one.
    """
    document = [
        _DIGEST_FORMAT,
        model,
        [[s.name, s.dtype.token, list(s.shape)] for s in specs],
        [identity.dev, identity.ino, identity.size, identity.mtime_ns],
    ]
    canonical = json.dumps(document, separators=(",", ":"), ensure_ascii=True)
    return int.from_bytes(hashlib.blake2b(canonical.encode("ascii")).digest()[:8], "big")


def _sanitize(model: str) -> str:
    return _UNSAFE.sub("_", model)[:_MAX_MODEL_CHARS] or "_"


def region_name(model: str, digest: int) -> str:
    """The SHM object name ``rsw-<sanitized model>-<16 hex digest>`` (no directory)."""
    if not 0 <= digest < 1 << 64:
        raise ValueError(f"digest must be an unsigned 64-bit int, got {digest}")
    return f"rsw-{_sanitize(model)}-{digest:016x}"


def region_layout(specs: Sequence[WeightSpec]) -> tuple[list[int], int]:
    """Byte offset of each tensor in a shared region, and the region size.

    Tensors follow the 64-byte header in spec order, each at a 64-byte-aligned offset.
    """
    offsets = []
    cursor = REGION_HEADER_BYTES
    for spec in specs:
        if spec.dtype.itemsize == 0:
            raise ValueError(f"weight {spec.name!r}: {spec.dtype.token} cannot be a weight")
        cursor = _align_up(cursor, ALIGNMENT)
        offsets.append(cursor)
        cursor += spec.nbytes
    return offsets, _align_up(cursor, ALIGNMENT)


def _align_up(value: int, align: int) -> int:
    return -(-value // align) * align


def _views(
    buffer: mmap.mmap, specs: Sequence[WeightSpec], offsets: Sequence[int]
) -> list[npt.NDArray[Any]]:
    # np.frombuffer keeps a buffer export on the mapping, so mmap.close() refuses to unmap
    # memory an array still points into (np.ndarray(buffer=...) does not).
    return [
        np.frombuffer(
            buffer, dtype=spec.dtype.numpy, count=math.prod(spec.shape), offset=offset
        ).reshape(spec.shape)
        for spec, offset in zip(specs, offsets, strict=True)
    ]


def _try_flock(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _same_file(path: Path, dev: int, ino: int) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


def _is_current(fd: int, path: Path) -> bool:
    # A lock file unlinked by the last holder may still be open here; a lock on it protects
    # nothing, so the caller starts over with whatever the path names now.
    st = os.fstat(fd)
    return _same_file(path, st.st_dev, st.st_ino)


def _close_mapping(mapping: mmap.mmap) -> None:
    try:
        mapping.close()
    except BufferError:
        # Someone still holds an array on it; the mapping goes away with the last of them.
        _log.debug("shared weight mapping still referenced; it is unmapped when collected")


@attrs.frozen
class _Region:
    """Where one model generation's region lives and how it is laid out."""

    object_path: Path
    lock_path: Path
    digest: int
    specs: Sequence[WeightSpec]
    offsets: Sequence[int]
    size: int


@attrs.define(eq=False)
class _Attachment:
    region: _Region
    lock_fd: int
    mapping: mmap.mmap
    object_dev: int
    object_ino: int


class SharedWeightStore:
    """Host weights shared by all workers of a node through POSIX SHM.

    ``mode`` is the permission of every region and lock file this store creates (``umask``
    does not apply). ``shm_dir`` exists for tests; workers share ``/dev/shm``.
    ``attach_timeout_s`` bounds the wait for another worker's fill (``TimeoutError``).
    """

    def __init__(
        self,
        mode: int,
        *,
        shm_dir: str | os.PathLike[str] = DEFAULT_SHM_DIR,
        attach_timeout_s: float = DEFAULT_ATTACH_TIMEOUT_S,
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        if not 0 <= mode <= 0o777:
            raise ValueError(f"mode must be between 0o000 and 0o777, got {mode:#o}")
        if attach_timeout_s < 0 or poll_interval_s <= 0:
            raise ValueError("attach_timeout_s must be >= 0 and poll_interval_s > 0")
        self._mode = mode
        self._dir = Path(shm_dir)
        self._attach_timeout_s = attach_timeout_s
        self._poll_interval_s = poll_interval_s
        self._lock = threading.Lock()
        self._live: dict[WeightHandle, _Attachment] = {}

    @property
    def mode(self) -> int:
        """Permission bits of the regions and lock files this store creates."""
        return self._mode

    @property
    def shm_dir(self) -> Path:
        """Directory holding the regions (``/dev/shm`` outside tests)."""
        return self._dir

    def materialize(
        self, key: str, digest: int, specs: Sequence[WeightSpec], fill: FillFn
    ) -> WeightHandle:
        """Attach to the model's region, creating and filling it if no worker has yet.

        ``fill`` runs only in the worker that creates the region; everyone gets read-only
        arrays aliasing the one region. Raises ``TimeoutError`` when another worker holds the
        region unready past ``attach_timeout_s``, and whatever ``fill`` raises.
        """
        name = region_name(key, digest)
        offsets, size = region_layout(specs)
        region = _Region(
            self._dir / name, self._dir / f"{name}.lock", digest, tuple(specs), offsets, size
        )
        deadline = time.monotonic() + self._attach_timeout_s
        while True:
            attachment = self._attempt(region, fill)
            if attachment is not None:
                break
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{region.object_path}: not ready after {self._attach_timeout_s:g} s "
                    "(another worker holds it while filling)"
                )
            time.sleep(self._poll_interval_s)
        handle = WeightHandle(
            key=key,
            digest=digest,
            arrays=_views(attachment.mapping, region.specs, region.offsets),
            nbytes=sum(s.nbytes for s in specs),
            region=region.object_path,
        )
        with self._lock:
            self._live[handle] = attachment
        self._sweep(key, digest)
        return handle

    def release(self, handle: WeightHandle) -> None:
        """Detach; the last holder on the node unlinks the region and its lock file.

        Drop every reference to ``handle.arrays`` first so the mapping can close.
        ``ValueError`` for a handle that is not live in this store.
        """
        with self._lock:
            attachment = self._live.pop(handle, None)
        if attachment is None:
            raise ValueError(f"weight handle for {handle.key!r} is not live in this store")
        handle.arrays = []
        handle.released = True
        _close_mapping(attachment.mapping)
        try:
            # No other holder means no other LOCK_SH: the exclusive lock is free to take.
            if _try_flock(attachment.lock_fd, fcntl.LOCK_EX):
                self._remove_if_ours(attachment)
        finally:
            os.close(attachment.lock_fd)

    def rename(self, old_key: str, new_key: str) -> None:
        """Rekey live handles of a renamed model; the region itself is left as it is."""
        with self._lock:
            for handle in self._live:
                if handle.key == old_key:
                    handle.key = new_key

    # -- protocol steps -----------------------------------------------------------------------

    def _attempt(self, region: _Region, fill: FillFn) -> _Attachment | None:
        """One pass of attach-or-create; ``None`` means someone else is busy, retry later."""
        try:
            lock_fd = self._open_lock(region.lock_path)
        except FileNotFoundError:
            return None
        try:
            if not _try_flock(lock_fd, fcntl.LOCK_SH) or not _is_current(lock_fd, region.lock_path):
                return None
            attached = _attach_ready(region)
            if attached is None:
                fcntl.flock(lock_fd, fcntl.LOCK_UN)
                if not _try_flock(lock_fd, fcntl.LOCK_EX) or not _is_current(
                    lock_fd, region.lock_path
                ):
                    return None
                # Another worker may have finished between our LOCK_UN and LOCK_EX.
                attached = _attach_ready(region) or self._create(region, fill)
                fcntl.flock(lock_fd, fcntl.LOCK_SH)
            mapping, dev, ino = attached
            attachment = _Attachment(region, lock_fd, mapping, dev, ino)
            lock_fd = -1
            return attachment
        finally:
            if lock_fd >= 0:
                os.close(lock_fd)

    def _open_lock(self, lock_path: Path) -> int:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, self._mode)
        except FileExistsError:
            return os.open(lock_path, os.O_RDONLY | os.O_CLOEXEC)
        os.fchmod(fd, self._mode)
        return fd

    def _create(self, region: _Region, fill: FillFn) -> tuple[mmap.mmap, int, int]:
        """Fill a fresh region under ``LOCK_EX`` and publish READY last.

        The caller holds the exclusive lock and downgrades it afterwards. On failure both
        files are removed so the next worker starts clean.
        """
        path = region.object_path
        _unlink_quietly(path)  # a leftover of a creator that died before READY
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, self._mode)
        try:
            try:
                os.fchmod(fd, self._mode)
                # Reserve the pages now: a full /dev/shm then fails here with ENOSPC
                # instead of killing the process with SIGBUS in the middle of fill.
                os.posix_fallocate(fd, 0, region.size)
                writable = mmap.mmap(fd, region.size, flags=mmap.MAP_SHARED)
                try:
                    _HEADER.pack_into(writable, 0, REGION_MAGIC, 0, region.digest)
                    fill(_views(writable, region.specs, region.offsets))
                    writable.flush()
                    _READY.pack_into(writable, _READY_OFFSET, 1)
                    writable.flush()
                finally:
                    _close_mapping(writable)
            except BaseException as exc:
                _unlink_quietly(path)
                _unlink_quietly(region.lock_path)
                if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                    raise OSError(
                        errno.ENOSPC, f"{path}: no room for {region.size} bytes in {self._dir}"
                    ) from exc
                raise
            st = os.fstat(fd)
            # Mapped from our own descriptor, so a region unlinked while the lock is being
            # downgraded (flock conversion is not atomic) still maps what we filled.
            mapping = mmap.mmap(fd, region.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        return mapping, st.st_dev, st.st_ino

    @staticmethod
    def _remove_if_ours(attachment: _Attachment) -> None:
        region = attachment.region
        if _same_file(region.object_path, attachment.object_dev, attachment.object_ino):
            _unlink_quietly(region.object_path)
        if _is_current(attachment.lock_fd, region.lock_path):
            _unlink_quietly(region.lock_path)

    def _sweep(self, key: str, digest: int) -> None:
        """Remove holder-free regions of the same model left under another digest."""
        prefix = f"rsw-{_sanitize(key)}-"
        pattern = re.compile(rf"{re.escape(prefix)}([0-9a-f]{{16}})(?:\.lock)?")
        try:
            names = os.listdir(self._dir)
        except OSError as exc:
            _log.warning("cannot list %s for stale weight regions: %s", self._dir, exc)
            return
        stale = {
            m.group(1)
            for m in map(pattern.fullmatch, names)
            if m is not None and int(m.group(1), 16) != digest
        }
        for hex_digest in sorted(stale):
            try:
                self._remove_if_free(self._dir / f"{prefix}{hex_digest}")
            except OSError as exc:
                _log.warning("cannot sweep stale weight region %s%s: %s", prefix, hex_digest, exc)

    def _remove_if_free(self, object_path: Path) -> None:
        lock_path = object_path.with_name(f"{object_path.name}.lock")
        try:
            lock_fd = self._open_lock(lock_path)
        except FileNotFoundError:
            return
        try:
            if _try_flock(lock_fd, fcntl.LOCK_EX) and _is_current(lock_fd, lock_path):
                _unlink_quietly(object_path)
                _unlink_quietly(lock_path)
                _log.info("removed stale shared weight region %s", object_path)
        finally:
            os.close(lock_fd)


def _attach_ready(region: _Region) -> tuple[mmap.mmap, int, int] | None:
    """Map the region read-only if it is complete: right size, magic, READY and digest."""
    try:
        fd = os.open(region.object_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_size != region.size:
            return None
        mapping = mmap.mmap(fd, region.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    if _HEADER.unpack_from(mapping, 0) != (REGION_MAGIC, 1, region.digest):
        mapping.close()
        return None
    return mapping, st.st_dev, st.st_ino


def _unlink_quietly(path: Path) -> None:
    path.unlink(missing_ok=True)
