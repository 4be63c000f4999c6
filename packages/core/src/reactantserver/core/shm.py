"""Server-side registry of client system shared-memory regions (Triton extension).

A client creates a POSIX shared-memory object, registers a byte range of it under a name, and
then references ``(name, offset, byte_size)`` in requests instead of sending the bytes::

    registry = SharedMemoryRegistry()
    registry.register("in0", "/input_simple", offset=0, byte_size=64)
    with registry.read("in0", 0, 64) as lease:
        array = np.frombuffer(lease.view, np.float32)  # zero-copy, read-only
    registry.unregister("in0")  # never unlinks the client's object

Keys resolve to a single name under ``/dev/shm`` (no traversal). The registry opens and maps
objects with ``os.open`` + ``mmap`` itself: ``multiprocessing.shared_memory`` would register the
client's object with its resource tracker, which unlinks it when this process exits.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import threading
from types import TracebackType
from typing import Any

import attrs
import numpy as np

from reactantserver.core.errors import InvalidArgumentError, RegionNotRegisteredError

__all__ = ["SHM_DIR", "Lease", "RegionStatus", "SharedMemoryRegistry", "resolve_key"]

#: Where POSIX shared-memory objects live on Linux (``shm_open`` names map to files here).
SHM_DIR = "/dev/shm"

# Offsets and sizes travel as uint64 on the wire but are int64 everywhere downstream (and in
# Triton), so anything at or past 2**63 is rejected rather than silently wrapped.
_INT64_LIMIT = 1 << 63

_OPEN_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW


@attrs.frozen
class RegionStatus:
    """One registered region as ``SystemSharedMemoryStatus`` reports it."""

    name: str
    key: str
    offset: int
    byte_size: int


def resolve_key(key: str) -> str:
    """The ``/dev/shm`` path a client key names; ``InvalidArgumentError`` for anything else.

    One leading ``/`` is stripped (``/input_simple`` as tritonclient writes it); the rest must be
    a single path component so that a key can never reach outside ``/dev/shm``.
    """
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError("shared memory key must be a non-empty string")
    rest = key[1:] if key.startswith("/") else key
    if not rest or "/" in rest or "\0" in rest or rest in (".", ".."):
        raise InvalidArgumentError(
            f"invalid shared memory key {key!r}: expected a single name under {SHM_DIR}"
        )
    return os.path.join(SHM_DIR, rest)


def _as_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidArgumentError(f"{what} must be an integer, got {value!r}")
    return int(value)


def _check_range(offset: int, nbytes: int, limit: int, what: str) -> None:
    """Reject ``[offset, offset + nbytes)`` unless it lies inside ``[0, limit)``."""
    if offset < 0:
        raise InvalidArgumentError(f"{what}: offset {offset} is negative")
    if nbytes < 0:
        raise InvalidArgumentError(f"{what}: byte size {nbytes} is negative")
    if offset >= _INT64_LIMIT or nbytes >= _INT64_LIMIT or offset + nbytes >= _INT64_LIMIT:
        raise InvalidArgumentError(f"{what}: offset {offset} + byte size {nbytes} overflows int64")
    if offset + nbytes > limit:
        raise InvalidArgumentError(
            f"{what}: range [{offset}, {offset + nbytes}) exceeds the {limit} bytes available"
        )


class _Mapping:
    """The mapping behind one registration, counted by its open leases.

    ``fd`` stays open with it so that :meth:`check_size` can see the client shrink the object:
    touching mapped pages past the end of the object raises ``SIGBUS``, which kills the process.
    """

    def __init__(
        self,
        status: RegionStatus,
        mm: mmap.mmap,
        delta: int,
        lock: threading.Lock,
        retired: set[_Mapping],
        *,
        fd: int = -1,
    ):
        self.status = status
        self.mm = mm
        self.fd = fd
        # The mapping starts at the page boundary below the registered offset.
        self.delta = delta
        self.lock = lock
        # The registry's set of unregistered-but-leased mappings, which this one leaves on close.
        self.retired_set = retired
        self.leases = 0
        self.retired = False
        self.closed = False

    def check_size(self, offset: int, nbytes: int, what: str) -> None:
        """Reject a range the object no longer holds (the client truncated it since)."""
        if self.fd < 0:
            return
        size = os.fstat(self.fd).st_size
        end = self.status.offset + offset + nbytes
        if end > size:
            raise InvalidArgumentError(
                f"{what}: the shared memory object shrank to {size} bytes; "
                f"range [{self.status.offset + offset}, {end}) is gone"
            )

    def acquire(self) -> None:
        """Count one more user (caller holds ``lock``)."""
        self.leases += 1

    def drop(self) -> None:
        """Count one user less and close once retired and unused."""
        with self.lock:
            self.leases -= 1
            self._maybe_close()

    def retire(self) -> None:
        """Mark unregistered (caller holds ``lock``); close now if nothing uses it."""
        self.retired = True
        self._maybe_close()

    def _maybe_close(self) -> None:
        if not self.retired or self.leases > 0 or self.closed:
            return
        self.closed = True
        self.retired_set.discard(self)
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        # BufferError: a caller kept an array derived from a lease past its release. The mmap
        # object stays referenced by that array and unmaps when it is collected, which is safe;
        # unmapping now would leave the array pointing at freed memory.
        with contextlib.suppress(BufferError):
            self.mm.close()


class Lease:
    """A read-only window onto registered bytes that keeps the region's mapping open.

    ``view`` is a read-only ``memoryview`` (format ``B``). Call :meth:`release` (or use the
    lease as a context manager) when done; release is idempotent. ``InferRequest.leases``
    takes ``lease.release``.
    """

    def __init__(self, mapping: _Mapping, view: memoryview):
        self._mapping: _Mapping | None = mapping
        self._view = view

    @property
    def view(self) -> memoryview:
        """The leased bytes; valid until :meth:`release`."""
        if self._mapping is None:
            raise ValueError("lease already released")
        return self._view

    @property
    def released(self) -> bool:
        """Whether :meth:`release` has been called."""
        return self._mapping is None

    def release(self) -> None:
        """End the lease; the mapping closes when its region is gone and no lease remains."""
        mapping, self._mapping = self._mapping, None
        if mapping is None:
            return
        # BufferError: arrays built on the view are still alive; see _Mapping._maybe_close.
        with contextlib.suppress(BufferError):
            self._view.release()
        mapping.drop()

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class SharedMemoryRegistry:
    """Registered system shared-memory regions by name; thread-safe.

    Each registration maps just the page-aligned span of its range. Unregistering removes the
    name at once; the mapping itself is closed when the last :class:`Lease` on it ends. The
    client's object is never unlinked.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._regions: dict[str, _Mapping] = {}
        # Unregistered mappings still held by leases; each removes itself when it closes.
        self._retired: set[_Mapping] = set()

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes at ``offset`` of the object ``key`` under ``name``.

        Re-registering a name replaces the old entry (its leases stay valid). Bad arguments,
        a missing object, or a range outside the object raise ``InvalidArgumentError``; on
        failure an existing entry of that name is left in place.
        """
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("shared memory region name must be a non-empty string")
        what = f"shared memory region {name!r}"
        offset = _as_int(offset, f"{what}: offset")
        byte_size = _as_int(byte_size, f"{what}: byte_size")
        if byte_size <= 0:
            raise InvalidArgumentError(f"{what}: byte_size must be positive, got {byte_size}")
        _check_range(offset, byte_size, _INT64_LIMIT, what)
        path = resolve_key(key)
        mm, delta, fd = _map_range(path, offset, byte_size, f"{what} (key {key!r})")
        status = RegionStatus(name, key, offset, byte_size)
        mapping = _Mapping(status, mm, delta, self._lock, self._retired, fd=fd)
        with self._lock:
            old = self._regions.get(name)
            self._regions[name] = mapping
            if old is not None:
                self._retire(old)

    def unregister(self, name: str) -> None:
        """Forget ``name`` (``""`` = every region); unknown names are fine."""
        with self._lock:
            if name:
                doomed = [self._regions.pop(name)] if name in self._regions else []
            else:
                doomed = list(self._regions.values())
                self._regions.clear()
            for mapping in doomed:
                self._retire(mapping)

    def close(self) -> None:
        """Unregister every region (the server is shutting down)."""
        self.unregister("")

    def status(self, name: str = "") -> dict[str, RegionStatus]:
        """Registered regions by name: all for ``""``, one, or none for an unknown name."""
        with self._lock:
            if name:
                mapping = self._regions.get(name)
                return {} if mapping is None else {name: mapping.status}
            return {n: m.status for n, m in sorted(self._regions.items())}

    def check(self, name: str, offset: int, nbytes: int) -> RegionStatus:
        """Validate that ``nbytes`` at ``offset`` lie inside region ``name``; its status.

        Raises ``RegionNotRegisteredError`` for an unknown name and ``InvalidArgumentError``
        for a range outside the region.
        """
        what = f"shared memory region {name!r}"
        offset = _as_int(offset, f"{what}: offset")
        nbytes = _as_int(nbytes, f"{what}: byte size")
        with self._lock:
            mapping = self._lookup(name)
        _check_range(offset, nbytes, mapping.status.byte_size, what)
        return mapping.status

    def read(self, name: str, offset: int, nbytes: int) -> Lease:
        """A zero-copy read-only view of ``nbytes`` at ``offset`` within region ``name``.

        ``offset`` is relative to the registered range. Raises ``RegionNotRegisteredError``
        for an unknown name and ``InvalidArgumentError`` for a range outside the region.
        """
        mapping, lo = self._acquire(name, offset, nbytes)
        try:
            view = memoryview(mapping.mm)[lo : lo + nbytes].toreadonly()
        except BaseException:
            mapping.drop()
            raise
        return Lease(mapping, view)

    def write(self, name: str, offset: int, data: Any) -> int:
        """Copy ``data`` (bytes-like or array) to ``offset`` within region ``name``; bytes written.

        Arrays are written in row-major order. Errors as for :meth:`read`.
        """
        src = _as_byte_view(data)
        mapping, lo = self._acquire(name, offset, src.nbytes)
        try:
            mapping.mm[lo : lo + src.nbytes] = src
        finally:
            mapping.drop()
        return src.nbytes

    def is_same_namespace(self, key: str) -> bool:
        """Whether ``key`` names an object this process can open read-only; never raises."""
        try:
            fd = os.open(resolve_key(key), os.O_RDONLY | _OPEN_FLAGS)
        except Exception:
            return False
        os.close(fd)
        return True

    def live_mappings(self) -> int:
        """Mappings still open, including unregistered ones held by leases (leak checks)."""
        with self._lock:
            return len(self._regions) + len(self._retired)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._regions

    def _lookup(self, name: str) -> _Mapping:
        mapping = self._regions.get(name)
        if mapping is None:
            raise RegionNotRegisteredError(f"unregistered shared memory region {name!r}")
        return mapping

    def _acquire(self, name: str, offset: int, nbytes: int) -> tuple[_Mapping, int]:
        """Look up, bounds-check and pin a region; the start of the range in its mapping."""
        what = f"shared memory region {name!r}"
        offset = _as_int(offset, f"{what}: offset")
        nbytes = _as_int(nbytes, f"{what}: byte size")
        with self._lock:
            mapping = self._lookup(name)
            _check_range(offset, nbytes, mapping.status.byte_size, what)
            mapping.check_size(offset, nbytes, what)
            mapping.acquire()
        return mapping, mapping.delta + offset

    def _retire(self, mapping: _Mapping) -> None:
        mapping.retire()
        if not mapping.closed:
            self._retired.add(mapping)


def _map_range(path: str, offset: int, byte_size: int, what: str) -> tuple[mmap.mmap, int, int]:
    """Map the pages covering ``[offset, offset + byte_size)`` of ``path`` read-write.

    Returns the mapping, the range's start within it and the open descriptor (the caller owns
    it; it lets later reads check that the client has not truncated the object).
    """
    try:
        fd = os.open(path, os.O_RDWR | _OPEN_FLAGS)
    except OSError as exc:
        raise InvalidArgumentError(f"{what}: cannot open {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgumentError(f"{what}: {path} is not a shared memory object")
        _check_range(offset, byte_size, st.st_size, what)
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        try:
            mm = mmap.mmap(
                fd,
                offset + byte_size - start,
                flags=mmap.MAP_SHARED,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
                offset=start,
            )
        except OSError as exc:
            raise InvalidArgumentError(f"{what}: cannot map {path}: {exc.strerror}") from None
    except BaseException:
        os.close(fd)
        raise
    return mm, offset - start, fd


def _as_byte_view(data: Any) -> memoryview:
    """A flat ``B``-format view of ``data``'s bytes (arrays in row-major order)."""
    if isinstance(data, np.ndarray):
        if data.dtype.hasobject:
            raise TypeError("cannot write an object array to shared memory; serialize it first")
        flat: Any = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        return memoryview(flat)
    view = memoryview(data)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view
