"""What the worker needs from an accelerator runtime: the ``Backend`` protocol and its types.

jax-free on purpose: the scheduler, the weight cache and their tests talk to this protocol;
the jax implementation lives in :mod:`~reactantserver.worker.runtime.jax_backend` (the only
module that touches jax internals).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias

import attrs
import numpy as np

from reactantserver.core.dtypes import DType
from reactantserver.core.manifest import MLIR_BYTECODE_MAGIC

__all__ = [
    "MLIR_BYTECODE_MAGIC",
    "Backend",
    "CompileSpec",
    "CpuArena",
    "DeviceBuffer",
    "Executable",
    "HostBuffer",
    "MemoryStats",
    "Signature",
    "TensorType",
    "is_bytecode",
]

#: Opaque handles owned by a backend.
Executable: TypeAlias = Any
DeviceBuffer: TypeAlias = Any
#: A host array in page-locked memory, made by :meth:`Backend.page_lock` (opaque).
HostBuffer: TypeAlias = Any


def is_bytecode(module: bytes) -> bool:
    """Whether ``module`` is MLIR bytecode rather than MLIR text."""
    return module[:4] == MLIR_BYTECODE_MAGIC


@attrs.frozen
class TensorType:
    """One argument or result of an entry function; ``-1`` marks a dynamic extent."""

    dtype: DType
    shape: tuple[int, ...]

    @property
    def static(self) -> bool:
        """Whether every extent is known."""
        return all(d >= 0 for d in self.shape)

    def __str__(self) -> str:
        dims = "x".join("?" if d < 0 else str(d) for d in self.shape)
        return f"{dims}x{self.dtype.token}" if dims else self.dtype.token


@attrs.frozen
class Signature:
    """The entry function's argument and result types, in order."""

    inputs: tuple[TensorType, ...]
    results: tuple[TensorType, ...]

    @property
    def static(self) -> bool:
        """Whether every argument and result has a fully static shape."""
        return all(t.static for t in self.inputs + self.results)


@attrs.frozen
class CompileSpec:
    """Options that change what a compile produces (and so key the executable cache)."""

    numerics: str = "auto"
    autotune: bool = True

    def cache_material(self) -> bytes:
        """Canonical bytes of these options, for cache keys."""
        return json.dumps(attrs.asdict(self), sort_keys=True).encode()

    def digest(self) -> str:
        """Short hex digest of :meth:`cache_material`."""
        return hashlib.sha256(self.cache_material()).hexdigest()[:16]


@attrs.frozen
class CpuArena:
    """Honest weight loads on the CPU backend (benchmarks and tests; off by default).

    On the CPU a "device" buffer of a NumPy array is the array itself, so a load is free and
    the weight cache cannot be measured. With an arena, a model's weights are copied into
    blocks of one slab of ``capacity_bytes`` the backend reserves, as a device allocator does
    (a copy that finds no free block fails as a device out-of-memory does), an eviction
    frees them, :meth:`Backend.memory_stats` reports the arena as the device's allocator,
    and a load of ``n`` bytes takes at least
    ``n / bandwidth_bytes_per_s`` seconds when a bandwidth is set (a PCIe-like link).
    Request inputs still go to the device without a copy.
    """

    capacity_bytes: int
    bandwidth_bytes_per_s: float = 0.0

    def __attrs_post_init__(self) -> None:
        if self.capacity_bytes <= 0:
            raise ValueError(f"arena capacity must be > 0 bytes, got {self.capacity_bytes}")
        if self.bandwidth_bytes_per_s < 0:
            raise ValueError(f"arena bandwidth must be >= 0, got {self.bandwidth_bytes_per_s}")

    def describe(self) -> str:
        """One phrase for start-up lines and benchmark reports."""
        link = (
            f"loads capped at {self.bandwidth_bytes_per_s / 1e9:g} GB/s"
            if self.bandwidth_bytes_per_s
            else "loads at memory-copy speed"
        )
        return f"CPU arena of {self.capacity_bytes} bytes, {link}"


@attrs.frozen
class MemoryStats:
    """Device allocator statistics (bytes); fields absent on a device read as 0."""

    bytes_in_use: int = 0
    bytes_limit: int = 0
    peak_bytes_in_use: int = 0
    bytes_reserved: int = 0

    @property
    def bytes_free(self) -> int:
        """``bytes_limit - bytes_in_use``, floored at 0."""
        return max(0, self.bytes_limit - self.bytes_in_use)


class Backend(Protocol):
    """A single accelerator: compile, move buffers, execute. Thread-safe per PJRT.

    ``async_transfers``: whether ``to_device(..., wait=False)`` returns before the copy is done,
    so a transfer can overlap an execution (GPU; on the CPU a copy is done when it returns).
    ``page_locked_host``: whether :meth:`page_lock` makes page-locked host copies, the source
    of host-to-device DMA at full bandwidth (GPU with a ``pinned_host`` memory space); where
    it is ``False`` nobody calls :meth:`page_lock` and host floors stay pageable NumPy arrays.
    """

    platform: str
    device_kind: str
    version_material: str
    async_transfers: bool
    page_locked_host: bool

    def compile(self, module: bytes, opts: CompileSpec) -> Executable:
        """Compile StableHLO (text or bytecode) for this backend's one device."""
        ...

    def serialize(self, exe: Executable) -> bytes:
        """Bytes that :meth:`deserialize` turns back into an equivalent executable."""
        ...

    def deserialize(self, blob: bytes, opts: CompileSpec) -> Executable:
        """Load an executable written by :meth:`serialize` (same runtime and device)."""
        ...

    def signature(self, module: bytes) -> Signature:
        """The entry (``main``) argument and result types of a StableHLO module."""
        ...

    def page_lock(self, host: np.ndarray[Any, Any]) -> HostBuffer:
        """A copy of ``host`` in page-locked host memory (only where ``page_locked_host``);
        :meth:`free` releases it."""
        ...

    def to_device(
        self, host: np.ndarray[Any, Any] | HostBuffer, *, wait: bool = True
    ) -> DeviceBuffer:
        """Copy a host array (or a :meth:`page_lock` copy) to the device.

        Blocks until the copy is done unless ``wait`` is false; then :meth:`wait` (or an
        execution reading the buffer) orders the copy before any use.
        """
        ...

    def to_device_many(
        self, hosts: Sequence[np.ndarray[Any, Any] | HostBuffer], *, wait: bool = True
    ) -> list[DeviceBuffer]:
        """Copy several host arrays (a model's weights) to the device, queued together.

        Like :meth:`to_device` on each, with one call's overhead where the backend can batch
        (a weight set is many small arrays); on failure nothing stays allocated.
        """
        ...

    def wait(self, buffers: Sequence[DeviceBuffer]) -> None:
        """Block until ``buffers`` (from ``to_device(..., wait=False)``) are on the device."""
        ...

    def execute(
        self, exe: Executable, args: Sequence[DeviceBuffer], *, wait: bool = True
    ) -> list[DeviceBuffer]:
        """Run ``exe`` on device buffers and wait until its results are ready (on the device).

        ``wait=False`` returns once the run is queued (where the backend runs asynchronously),
        so the caller can queue other device work beside it; :meth:`wait` then waits.
        """
        ...

    def to_host(self, buf: DeviceBuffer) -> np.ndarray[Any, Any]:
        """Copy a device buffer to a host array (blocks until the value is ready)."""
        ...

    def free(self, buf: DeviceBuffer | HostBuffer) -> None:
        """Release a device buffer (or a page-locked host copy) now, not at garbage collection."""
        ...

    def free_executable(self, exe: Executable) -> None:
        """Release an executable's device resources (best effort)."""
        ...

    def memory_stats(self) -> MemoryStats | None:
        """Allocator statistics of the device; ``None`` where there are none (CPU)."""
        ...
