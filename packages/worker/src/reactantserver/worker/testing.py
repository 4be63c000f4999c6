"""``MockBackend``: the one test seam of the worker, a pure-NumPy :class:`Backend` (no jax).

"Compiling" looks a module's bytes up among the ones registered with a NumPy function;
device buffers are host copies tracked in an arena, so :meth:`MockBackend.memory_stats`
reports ``bytes_in_use`` / ``peak_bytes_in_use`` like a GPU allocator and budget logic can be
tested on the CPU::

    backend = MockBackend(bytes_limit=1 << 20)
    backend.register(b"double", lambda x: [2 * x], scratch_bytes=4096)
    exe = backend.compile(b"double", CompileSpec())
    (out,) = backend.execute(exe, [backend.to_device(np.ones(3, np.float32))])
    backend.fail_next_execution()  # the next execute raises MockOutOfMemoryError

An execution holds ``scratch_bytes`` of the arena while it runs; going over ``bytes_limit``
(with weights, inputs, scratch and outputs) raises :class:`MockOutOfMemoryError`, whose
message reads like XLA's.

For timing-free scheduler tests, a :class:`FakeClock` shared by the backend and the scheduler
makes every execution take exactly the ``duration_s`` its module was registered with::

    clock = FakeClock()
    backend = MockBackend(clock=clock)
    backend.register(b"slow", lambda x: [x], duration_s=0.010)  # each run: clock += 10 ms
    scheduler = Scheduler(backend, clock=clock)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import attrs
import numpy as np
import numpy.typing as npt

from reactantserver.core.errors import BundleError
from reactantserver.worker.runtime.backend import CompileSpec, MemoryStats, Signature

__all__ = [
    "MOCK_DEVICE_KIND",
    "FakeClock",
    "MockBackend",
    "MockBuffer",
    "MockExecutable",
    "MockOutOfMemoryError",
]

#: ``device_kind`` of a :class:`MockBackend` unless told otherwise.
MOCK_DEVICE_KIND = "mock"

_SERIAL_PREFIX = b"mock-executable:"

NDArray: TypeAlias = npt.NDArray[Any]
#: A registered "module": NumPy arrays in, one array or a sequence of arrays out.
MockFn: TypeAlias = Callable[..., NDArray | Sequence[NDArray]]


class MockOutOfMemoryError(RuntimeError):
    """The mock arena is full (the message starts like XLA's ``RESOURCE_EXHAUSTED``)."""


@attrs.define(eq=False)
class MockBuffer:
    """A "device" buffer: a private host copy plus its arena accounting.

    ``host``: a :meth:`MockBackend.page_lock` copy (host memory, outside the arena);
    ``pending``: made by ``to_device(..., wait=False)`` and not yet waited for.
    """

    array: NDArray | None
    nbytes: int
    host: bool = False
    pending: bool = False

    def is_deleted(self) -> bool:
        """Whether :meth:`MockBackend.free` released it (same name as on a jax array)."""
        return self.array is None


@attrs.define(eq=False)
class MockExecutable:
    """A "compiled" module: the registered function, its scratch need and its duration."""

    module: bytes
    fn: MockFn
    scratch_bytes: int
    duration_s: float = 0.0
    freed: bool = False


@attrs.frozen
class _Registration:
    fn: MockFn
    signature: Signature | None
    scratch_bytes: int
    duration_s: float = 0.0


class FakeClock:
    """A manual ``time.monotonic_ns`` stand-in: call it for the time, :meth:`advance` it."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        """The current time in nanoseconds."""
        return self.now_ns

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``."""
        self.now_ns += round(seconds * 1e9)


def _digest(module: bytes) -> bytes:
    return hashlib.sha256(module).hexdigest().encode()


class MockBackend:
    """A :class:`~reactantserver.worker.runtime.backend.Backend` in NumPy, with counters.

    ``bytes_limit=None`` behaves like the CPU client (``memory_stats()`` is ``None``, no limit).
    ``async_transfers`` and ``page_locked_host`` make it claim what a GPU backend can do (the
    copies stay synchronous NumPy copies). Counters: ``transfers``/``transfer_bytes``
    (``to_device``), ``async_transfers_started`` (``wait=False``), ``waits``, ``frees``
    (device buffers actually released), ``page_locks``/``page_unlocks``, ``executions``,
    ``compiles``, ``freed_executables``; ``pinned_transfers`` counts copies from page-locked
    buffers and ``events`` lists ``("transfer"|"execute", detail)`` in order.
    """

    def __init__(
        self,
        *,
        bytes_limit: int | None = None,
        platform: str = "cpu",
        device_kind: str = MOCK_DEVICE_KIND,
        clock: FakeClock | None = None,
        async_transfers: bool = False,
        page_locked_host: bool = False,
    ) -> None:
        self.platform = platform
        self.async_transfers = async_transfers
        self.page_locked_host = page_locked_host
        self.clock = clock
        self.device_kind = device_kind
        self.version_material = f"mock|{platform}"
        self.bytes_limit = bytes_limit
        self.bytes_in_use = 0
        self.peak_bytes_in_use = 0
        self.transfers = 0
        self.transfer_bytes = 0
        self.async_transfers_started = 0
        self.batches = 0
        self.pinned_transfers = 0
        self.waits = 0
        self.page_locks = 0
        self.page_unlocks = 0
        self.events: list[tuple[str, str]] = []
        self.frees = 0
        self.executions = 0
        self.compiles = 0
        self.freed_executables = 0
        self._modules: dict[bytes, _Registration] = {}
        self._by_digest: dict[bytes, bytes] = {}
        self._live: set[MockBuffer] = set()
        self._failures: list[BaseException] = []

    # -- set-up ----------------------------------------------------------------------------

    def register(
        self,
        module: bytes,
        fn: MockFn,
        signature: Signature | None = None,
        *,
        scratch_bytes: int = 0,
        duration_s: float = 0.0,
    ) -> None:
        """Make ``module`` compile to ``fn`` (which gets one host array per argument).

        With a ``clock``, each execution advances it by ``duration_s``.
        """
        self._modules[module] = _Registration(fn, signature, scratch_bytes, duration_s)
        self._by_digest[_digest(module)] = module

    def fail_next_execution(self, error: BaseException | None = None, *, times: int = 1) -> None:
        """Make the next ``times`` executions raise ``error`` (default: an out-of-memory)."""
        for _ in range(times):
            self._failures.append(
                error
                if error is not None
                else MockOutOfMemoryError(
                    "RESOURCE_EXHAUSTED: Out of memory while trying to allocate (injected)"
                )
            )

    def reset_peak(self) -> None:
        """Start peak tracking again from the current use."""
        self.peak_bytes_in_use = self.bytes_in_use

    @property
    def live_buffers(self) -> int:
        """Buffers allocated and not yet freed."""
        return len(self._live)

    # -- Backend ---------------------------------------------------------------------------

    def compile(self, module: bytes, opts: CompileSpec) -> MockExecutable:
        """The executable of a registered module; :class:`BundleError` for any other bytes."""
        reg = self._registration(module)
        self.compiles += 1
        return MockExecutable(module, reg.fn, reg.scratch_bytes, reg.duration_s)

    def serialize(self, exe: MockExecutable) -> bytes:
        """A blob naming the module by digest."""
        return _SERIAL_PREFIX + _digest(exe.module)

    def deserialize(self, blob: bytes, opts: CompileSpec) -> MockExecutable:
        """The executable a blob from :meth:`serialize` names (``ValueError`` if unknown)."""
        module = self._by_digest.get(blob.removeprefix(_SERIAL_PREFIX))
        if not blob.startswith(_SERIAL_PREFIX) or module is None:
            raise ValueError("not a serialized mock executable of a registered module")
        reg = self._modules[module]
        return MockExecutable(module, reg.fn, reg.scratch_bytes, reg.duration_s)

    def signature(self, module: bytes) -> Signature:
        """The signature registered with the module."""
        reg = self._registration(module)
        if reg.signature is None:
            raise BundleError("mock module was registered without a signature")
        return reg.signature

    def page_lock(self, host: NDArray) -> MockBuffer:
        """A "page-locked" host copy (outside the arena); only with ``page_locked_host``."""
        if not self.page_locked_host:
            raise RuntimeError("this mock backend has no page-locked host memory")
        self.page_locks += 1
        return MockBuffer(np.array(host, copy=True), int(host.nbytes), host=True)

    def to_device(self, host: NDArray | MockBuffer, *, wait: bool = True) -> MockBuffer:
        """Copy ``host`` (an array or a :meth:`page_lock` copy) into the arena."""
        if isinstance(host, MockBuffer):
            if not host.host or host.array is None:
                raise RuntimeError("to_device of a device buffer or a released host copy")
            self.pinned_transfers += 1
            host = host.array
        array = np.array(host, copy=True)
        buf = self._allocate(array)
        self.transfers += 1
        self.transfer_bytes += buf.nbytes
        if not wait:
            buf.pending = True
            self.async_transfers_started += 1
        self.events.append(("transfer", f"{buf.nbytes}{'' if wait else ' async'}"))
        return buf

    def to_device_many(
        self, hosts: Sequence[NDArray | MockBuffer], *, wait: bool = True
    ) -> list[MockBuffer]:
        """:meth:`to_device` of each (freed again if one fails); ``batches`` counts calls."""
        self.batches += 1
        out: list[MockBuffer] = []
        try:
            for host in hosts:
                out.append(self.to_device(host, wait=wait))
        except BaseException:
            for buf in out:
                self.free(buf)
            raise
        return out

    def wait(self, buffers: Sequence[MockBuffer]) -> None:
        """Mark the buffers' copies done."""
        self.waits += 1
        for buf in buffers:
            buf.pending = False

    def execute(
        self, exe: MockExecutable, args: Sequence[MockBuffer], *, wait: bool = True
    ) -> list[MockBuffer]:
        """Run the registered function on the buffers' arrays; results are new buffers.

        The run happens in the call whatever ``wait`` says (results are never pending).
        """
        if exe.freed:
            raise RuntimeError("execute on a freed mock executable")
        hosts: list[NDArray] = []
        for i, arg in enumerate(args):
            if arg.array is None:
                raise RuntimeError(f"argument {i} is a deleted buffer")
            hosts.append(arg.array)
        if self._failures:
            raise self._failures.pop(0)
        self.events.append(("execute", exe.module.decode(errors="replace")))
        self._reserve(exe.scratch_bytes)
        try:
            produced = exe.fn(*hosts)
            arrays = [produced] if isinstance(produced, np.ndarray) else list(produced)
            outputs: list[MockBuffer] = []
            try:
                for array in arrays:
                    outputs.append(self._allocate(np.array(array, copy=True)))
            except BaseException:
                for buf in outputs:
                    self.free(buf)
                raise
        finally:
            self.bytes_in_use -= exe.scratch_bytes
        self.executions += 1
        if self.clock is not None:
            self.clock.advance(exe.duration_s)
        return outputs

    def to_host(self, buf: MockBuffer) -> NDArray:
        """A host copy of the buffer."""
        if buf.array is None:
            raise RuntimeError("to_host on a deleted buffer")
        return np.array(buf.array, copy=True)

    def free(self, buf: MockBuffer) -> None:
        """Release the buffer's arena bytes (or a page-locked copy) now (idempotent)."""
        if buf.array is None:
            return
        buf.array = None
        if buf.host:
            self.page_unlocks += 1
            return
        self.bytes_in_use -= buf.nbytes
        self._live.remove(buf)
        self.frees += 1

    def free_executable(self, exe: MockExecutable) -> None:
        """Mark the executable freed; executing it afterwards fails."""
        if not exe.freed:
            exe.freed = True
            self.freed_executables += 1

    def memory_stats(self) -> MemoryStats | None:
        """Arena statistics, or ``None`` when constructed without ``bytes_limit`` (like CPU)."""
        if self.bytes_limit is None:
            return None
        return MemoryStats(
            bytes_in_use=self.bytes_in_use,
            bytes_limit=self.bytes_limit,
            peak_bytes_in_use=self.peak_bytes_in_use,
        )

    # -- arena -----------------------------------------------------------------------------

    def _registration(self, module: bytes) -> _Registration:
        reg = self._modules.get(module)
        if reg is None:
            raise BundleError(f"mock module not registered ({len(module)} bytes)")
        return reg

    def _reserve(self, nbytes: int) -> None:
        if self.bytes_limit is not None and self.bytes_in_use + nbytes > self.bytes_limit:
            raise MockOutOfMemoryError(
                f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate {nbytes} bytes "
                f"({self.bytes_in_use} of {self.bytes_limit} in use)"
            )
        self.bytes_in_use += nbytes
        self.peak_bytes_in_use = max(self.peak_bytes_in_use, self.bytes_in_use)

    def _allocate(self, array: NDArray) -> MockBuffer:
        nbytes = int(array.nbytes)
        self._reserve(nbytes)
        buf = MockBuffer(array, nbytes)
        self._live.add(buf)
        return buf
