"""The jax/jaxlib backend: the ONE module of ReactantServer that touches jax internals.

It drives the PJRT client directly (``compile_and_load`` of StableHLO text or portable
artifacts, executable (de)serialisation, explicit buffer release) and reads entry signatures
with the MLIR bindings bundled with jaxlib. Everything else in the worker talks to the
:class:`~reactantserver.worker.runtime.backend.Backend` protocol. The canary test
(``tests/test_backend_canary.py``) exercises every entry point, so a jaxlib upgrade that moves
one of them fails loudly there first::

    backend = JaxBackend("cpu")
    exe = backend.compile(module_bytes, CompileSpec())
    out = backend.execute(exe, [backend.to_device(x), *weights])
"""

from __future__ import annotations

import functools
import importlib
import threading
import time
from collections.abc import Collection, Sequence
from importlib.metadata import version as _dist_version
from typing import Any

import jax
import numpy as np
from jax._src import core as _jax_core
from jax._src.interpreters import mlir as _jax_mlir
from jax.extend import backend as _jax_backend
from jaxlib import xla_client as _xc
from jaxlib.mlir import ir as _ir
from jaxlib.mlir.dialects import stablehlo as _stablehlo

from reactantserver.core.dtypes import DType
from reactantserver.core.errors import BundleError
from reactantserver.worker.runtime._cpu_arena import ArenaBook, Block
from reactantserver.worker.runtime.backend import (
    CompileSpec,
    CpuArena,
    DeviceBuffer,
    Executable,
    HostBuffer,
    MemoryStats,
    Signature,
    TensorType,
    is_bytecode,
)

__all__ = ["PINNED_HOST", "PLATFORM_ALIASES", "JaxBackend", "jax_versions", "page_locking"]

# jaxlib's extension module (no type stubs): ``collect_garbage`` runs its deferred decrefs.
_JAXLIB: Any = importlib.import_module("jaxlib._jax")

#: Configuration names of a platform -> the name jax registers the PJRT client under.
PLATFORM_ALIASES = {"cpu": "cpu", "cuda": "cuda", "gpu": "cuda"}
#: The memory kind (PJRT memory space) of page-locked host memory a device can DMA from.
PINNED_HOST = "pinned_host"

# One C++ call copying many arrays between memory spaces (what ``jax.device_put`` of a list
# ends in, without ~50 us of Python per array); ``None`` if jaxlib moved it (the canary says).
_BATCHED_COPY: Any = getattr(_xc, "batched_copy_array_to_devices_with_sharding", None)
_ALWAYS_COPY: Any = getattr(getattr(_xc, "ArrayCopySemantics", None), "ALWAYS_COPY", None)

# MLIR contexts are not safe to share across threads; each thread keeps its own.
_contexts = threading.local()


def jax_versions() -> dict[str, str]:
    """Versions of jax and jaxlib, for provenance and cache keys."""
    return {"jax": jax.__version__, "jaxlib": _dist_version("jaxlib")}


def _ir_context() -> _ir.Context:
    ctx = getattr(_contexts, "ctx", None)
    if ctx is None:
        ctx = _jax_mlir.make_ir_context()
        _contexts.ctx = ctx
    return ctx


def _tensor_type(mlir_type: _ir.Type, where: str) -> TensorType:
    try:
        ranked = _ir.RankedTensorType(mlir_type)
    except ValueError:
        raise BundleError(f"{where}: {mlir_type} is not a ranked tensor") from None
    try:
        dtype = DType.from_mlir(str(ranked.element_type))
    except ValueError as exc:
        raise BundleError(f"{where}: {exc}") from None
    shape = tuple(
        -1 if ranked.is_dynamic_dim(i) else int(ranked.get_dim_size(i)) for i in range(ranked.rank)
    )
    return TensorType(dtype, shape)


@functools.lru_cache(maxsize=1024)
def _abstract(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
    # What ``jax.device_put`` derives from a numpy array (dtype canonicalised as jax is
    # configured), cached: requests repeat a handful of shapes.
    return _jax_core.shaped_abstractify(np.empty(shape, dtype))


def page_locking(platform: str, memory_kinds: Collection[str], wanted: bool | None) -> bool:
    """Whether host floors go to page-locked memory (``wanted``: ``None`` decides by platform).

    Only where the device has a ``pinned_host`` memory space (the fallback elsewhere: pageable
    NumPy floors). By default not on the CPU backend, whose "device" is host memory: a NumPy
    array goes to it without a copy, and a page-locked floor would only add one.
    """
    if wanted is False or PINNED_HOST not in memory_kinds:
        return False
    return wanted is True or platform != "cpu"


def _memory_kinds(device: Any) -> tuple[str, ...]:
    try:
        return tuple(str(memory.kind) for memory in device.addressable_memories())
    except (AttributeError, RuntimeError):  # a PJRT plugin without memory spaces
        return ()


class JaxBackend:
    """One device of a jax PJRT client (``platform`` ``cpu`` or ``cuda``).

    ``page_locked``: keep host floors in page-locked memory (``None``: where it pays, see
    :func:`page_locking`; ``True`` forces it wherever the device has the memory space).
    ``cpu_arena``: on the CPU, make weight loads real copies into an arena of that size (see
    :class:`~reactantserver.worker.runtime.backend.CpuArena`); refused on other platforms.
    """

    def __init__(
        self,
        platform: str = "cpu",
        device_ordinal: int = 0,
        *,
        page_locked: bool | None = None,
        cpu_arena: CpuArena | None = None,
    ) -> None:
        name = PLATFORM_ALIASES.get(platform)
        if name is None:
            raise ValueError(f"unknown backend platform {platform!r}")
        if cpu_arena is not None and name != "cpu":
            raise ValueError("cpu_arena is a CPU-backend option")
        self._arena = None if cpu_arena is None else ArenaBook(cpu_arena)
        if name == "cpu":
            # Run CPU programs on the calling (dispatch) thread, which waits for every result
            # anyway: async dispatch hands each run to an XLA pool thread and back, which
            # costs more CPU than a small model's compute. Read once, when jax creates its
            # CPU client; without effect if something in this process created it already.
            jax.config.update("jax_cpu_enable_async_dispatch", False)
        self._client = _jax_backend.get_backend(name)
        devices = self._client.local_devices()
        if not 0 <= device_ordinal < len(devices):
            raise ValueError(
                f"device_ordinal {device_ordinal} out of range: {len(devices)} {name} device(s)"
            )
        self._device = devices[device_ordinal]
        self._devices = _xc.DeviceList((self._device,))
        self._sharding = jax.sharding.SingleDeviceSharding(self._device)
        self.memory_kinds: tuple[str, ...] = _memory_kinds(self._device)
        self.page_locked_host: bool = page_locking(name, self.memory_kinds, page_locked)
        self._pinned: Any = None
        if self.page_locked_host:
            self._pinned = jax.sharding.SingleDeviceSharding(self._device, memory_kind=PINNED_HOST)
        # PJRT copies to a GPU on its own stream and returns at once; the CPU client's copy
        # (or alias) is done when it returns.
        self.async_transfers: bool = name != "cpu"
        self.platform: str = name
        self.device_kind: str = str(self._device.device_kind)
        self.version_material: str = "|".join(
            [f"jaxlib={_dist_version('jaxlib')}", name, str(self._client.platform_version)]
        )

    # -- compilation ---------------------------------------------------------------------

    def _compile_options(self, opts: CompileSpec) -> Any:
        options = _xc.CompileOptions()
        if not opts.autotune and self.platform == "cuda":
            options.executable_build_options.debug_options.xla_gpu_autotune_level = 0
        return options

    def compile(self, module: bytes, opts: CompileSpec) -> Executable:
        """Compile StableHLO text or a portable artifact for the selected device."""
        computation: bytes | str = module if is_bytecode(module) else module.decode()
        return self._client.compile_and_load(
            computation, self._devices, self._compile_options(opts)
        )

    def serialize(self, exe: Executable) -> bytes:
        """Serialise a compiled executable (for the on-disk executable cache)."""
        return bytes(self._client.serialize_executable(exe))

    def deserialize(self, blob: bytes, opts: CompileSpec) -> Executable:
        """Load an executable serialised by :meth:`serialize` on this runtime and device."""
        return self._client.deserialize_executable(blob, self._devices, self._compile_options(opts))

    def signature(self, module: bytes) -> Signature:
        """Argument and result types of the public ``main`` function of a StableHLO module."""
        ctx = _ir_context()
        with ctx:
            try:
                if is_bytecode(module):
                    parsed = _stablehlo.deserialize_portable_artifact(ctx, module)
                else:
                    parsed = _ir.Module.parse(module.decode())
            except Exception as exc:
                raise BundleError(f"cannot parse StableHLO module: {exc}") from exc
            for op in parsed.body.operations:
                attributes = op.attributes
                if "sym_name" not in attributes or "function_type" not in attributes:
                    continue
                if _ir.StringAttr(attributes["sym_name"]).value != "main":
                    continue
                ftype = _ir.FunctionType(_ir.TypeAttr(attributes["function_type"]).value)
                inputs = tuple(
                    _tensor_type(t, f"main argument {i}") for i, t in enumerate(ftype.inputs)
                )
                results = tuple(
                    _tensor_type(t, f"main result {i}") for i, t in enumerate(ftype.results)
                )
                return Signature(inputs, results)
        raise BundleError("StableHLO module has no 'main' function")

    # -- buffers and execution -----------------------------------------------------------

    def page_lock(self, host: np.ndarray[Any, Any]) -> HostBuffer:
        """A copy of ``host`` in the device's ``pinned_host`` memory space (page-locked).

        A transfer from it is one DMA; from pageable memory the driver first copies through a
        staging buffer of its own. Only where :attr:`page_locked_host`.
        """
        if self._pinned is None:
            raise RuntimeError(f"no page-locked host memory on this {self.platform} backend")
        buf = jax.device_put(host, self._pinned)
        buf.block_until_ready()
        return buf

    def to_device(
        self, host: np.ndarray[Any, Any] | HostBuffer, *, wait: bool = True
    ) -> DeviceBuffer:
        """Copy ``host`` (a NumPy array or a :meth:`page_lock` copy) to the device.

        For NumPy, the call ``jax.device_put`` ends in for one array on one device, without
        its ~20 us of Python dispatch per call (pytrees, sharding and copy-semantics checks).
        ``wait=False`` returns once the copy is queued (PJRT keeps ``host`` alive until then).
        """
        if isinstance(host, np.ndarray):
            buf = _xc.batched_device_put(
                _abstract(host.shape, host.dtype), self._sharding, [host], [self._device]
            )
        else:  # a page-locked host array: a copy between memory spaces of one device
            buf = jax.device_put(host, self._sharding)
        if wait:
            buf.block_until_ready()
        return buf

    def to_device_many(
        self, hosts: Sequence[np.ndarray[Any, Any] | HostBuffer], *, wait: bool = True
    ) -> list[DeviceBuffer]:
        """Copy a model's host arrays to the device: NumPy ones each as :meth:`to_device`
        does, page-locked ones in one batched copy; wait for all at the end (``wait``).

        With a CPU arena every array is copied into the arena instead (see :meth:`_arena_copy`).
        """
        if self._arena is not None:
            return self._arena_copy(self._arena, hosts)
        out: list[DeviceBuffer | None] = [None] * len(hosts)
        locked = [i for i, h in enumerate(hosts) if not isinstance(h, np.ndarray)]
        try:
            for i, host in enumerate(hosts):
                if isinstance(host, np.ndarray):
                    out[i] = self.to_device(host, wait=False)
            if locked:
                for i, buf in zip(
                    locked, self._copy_locked([hosts[i] for i in locked]), strict=True
                ):
                    out[i] = buf
            buffers = [buf for buf in out if buf is not None]
            if wait:
                self.wait(buffers)
        except BaseException:
            for buf in out:
                if buf is not None:
                    self.free(buf)
            raise
        return buffers

    def _arena_copy(
        self, arena: ArenaBook, hosts: Sequence[np.ndarray[Any, Any] | HostBuffer]
    ) -> list[DeviceBuffer]:
        """Copies of ``hosts`` into blocks of the arena, wrapped as device buffers without a
        second copy; at least ``bytes / bandwidth`` seconds in all when the arena has one."""
        start = time.perf_counter()
        arrays = [np.asarray(host) for host in hosts]
        blocks: list[Block] = []
        try:
            for a in arrays:  # every block first: a load that does not fit charges nothing
                blocks.append(arena.allocate(a.nbytes))
        except BaseException:
            for block in blocks:
                arena.free(block)
            raise
        out: list[DeviceBuffer] = []
        for a, block in zip(arrays, blocks, strict=True):
            view = arena.view(block, a.shape, a.dtype)
            np.copyto(view, a)  # the load (NumPy releases the GIL for it)
            # ZERO_COPY over an aligned block: the buffer is the block, not a copy of it.
            buf = _xc.batched_device_put(
                _abstract(a.shape, a.dtype), self._sharding, [view], [self._device]
            )
            arena.hold(buf, block)  # charged block by block: an eviction returns its own
            out.append(buf)
        if arena.spec.bandwidth_bytes_per_s > 0:
            # A DMA the dispatch thread waits for: sleeping releases the GIL, as a wait would.
            left = sum(a.nbytes for a in arrays) / arena.spec.bandwidth_bytes_per_s
            left -= time.perf_counter() - start
            if left > 0:
                time.sleep(left)
        return out

    def _copy_locked(self, hosts: Sequence[HostBuffer]) -> list[DeviceBuffer]:
        if _BATCHED_COPY is None:
            return list(jax.device_put(list(hosts), self._sharding))
        n = len(hosts)
        copied: list[DeviceBuffer] = _BATCHED_COPY(
            list(hosts), [self._devices] * n, [self._sharding] * n, [_ALWAYS_COPY] * n
        )
        return copied

    def wait(self, buffers: Sequence[DeviceBuffer]) -> None:
        """Block until every buffer's copy (``to_device(..., wait=False)``) is done."""
        for buf in buffers:
            buf.block_until_ready()

    def execute(
        self, exe: Executable, args: Sequence[DeviceBuffer], *, wait: bool = True
    ) -> list[DeviceBuffer]:
        """Run ``exe`` and wait for its results; PJRT releases the GIL while the device works.

        Waiting here keeps the scheduler's split of execution vs output-transfer time honest.
        ``wait=False`` returns once the run is queued (GPU; the CPU runs it in the call).
        """
        results: list[DeviceBuffer] = exe.execute(list(args))
        if wait:
            for result in results:
                result.block_until_ready()
        return results

    def to_host(self, buf: DeviceBuffer) -> np.ndarray[Any, Any]:
        """A host copy of a device buffer (blocks until the value is ready)."""
        return np.array(buf, copy=True)

    def free(self, buf: DeviceBuffer | HostBuffer) -> None:
        """Delete a device buffer or a page-locked host copy now (idempotent).

        jaxlib defers dropping Python references released off the GIL (such as the host
        array a zero-copy transfer aliased) until its next call; collect them now, or an idle
        worker keeps the last input alive, and with it a client's unregistered shared memory.
        """
        if not buf.is_deleted():
            buf.delete()
            _JAXLIB.collect_garbage()
        if self._arena is not None:
            self._arena.release(buf)

    def free_executable(self, exe: Executable) -> None:
        """Drop an executable; jaxlib frees it with its last reference (no explicit call)."""
        del exe

    def memory_stats(self) -> MemoryStats | None:
        """Allocator statistics of the device, or ``None`` (the CPU client keeps none).

        With a CPU arena: the arena's (weights in use, its capacity as the limit)."""
        if self._arena is not None:
            return MemoryStats(
                bytes_in_use=self._arena.in_use,
                bytes_limit=self._arena.spec.capacity_bytes,
                peak_bytes_in_use=self._arena.peak,
            )
        stats = self._device.memory_stats()
        if not stats:
            return None
        return MemoryStats(
            bytes_in_use=int(stats.get("bytes_in_use", 0)),
            bytes_limit=int(stats.get("bytes_limit", 0)),
            peak_bytes_in_use=int(stats.get("peak_bytes_in_use", 0)),
            bytes_reserved=int(stats.get("bytes_reserved", stats.get("pool_bytes", 0))),
        )
