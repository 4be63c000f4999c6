"""MockBackend: the pure-NumPy Backend used by the runtime's unit tests."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from reactantserver.core.dtypes import DType
from reactantserver.core.errors import BundleError
from reactantserver.worker.runtime.backend import (
    Backend,
    CompileSpec,
    MemoryStats,
    Signature,
    TensorType,
)
from reactantserver.worker.testing import MockBackend, MockOutOfMemoryError

SIG = Signature((TensorType(DType.F32, (4,)),), (TensorType(DType.F32, (4,)),))


def _double(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    result: np.ndarray[Any, Any] = 2 * x
    return result


def test_is_a_backend() -> None:
    backend: Backend = MockBackend()
    assert backend.platform == "cpu"
    assert backend.memory_stats() is None


def test_compile_execute_round_trip() -> None:
    backend = MockBackend()
    backend.register(b"double", _double, SIG)
    exe = backend.compile(b"double", CompileSpec())
    x = np.arange(4, dtype=np.float32)
    buf = backend.to_device(x)
    x[:] = -1  # the device copy is independent of the host array
    (out,) = backend.execute(exe, [buf])
    np.testing.assert_array_equal(backend.to_host(out), [0, 2, 4, 6])
    assert backend.signature(b"double") == SIG
    assert (backend.transfers, backend.transfer_bytes, backend.executions) == (1, 16, 1)


def test_unregistered_module_and_missing_signature() -> None:
    backend = MockBackend()
    with pytest.raises(BundleError, match="not registered"):
        backend.compile(b"nope", CompileSpec())
    backend.register(b"nosig", _double)
    with pytest.raises(BundleError, match="signature"):
        backend.signature(b"nosig")


def test_serialize_round_trip() -> None:
    backend = MockBackend()
    backend.register(b"double", _double, SIG)
    blob = backend.serialize(backend.compile(b"double", CompileSpec()))
    again = backend.deserialize(blob, CompileSpec())
    (out,) = backend.execute(again, [backend.to_device(np.ones(4, np.float32))])
    np.testing.assert_array_equal(backend.to_host(out), 2)
    with pytest.raises(ValueError, match="not a serialized"):
        backend.deserialize(b"garbage", CompileSpec())


def test_free_is_eager_idempotent_and_counted() -> None:
    backend = MockBackend(bytes_limit=1000)
    buf = backend.to_device(np.zeros(10, np.float64))
    assert backend.memory_stats() == MemoryStats(
        bytes_in_use=80, bytes_limit=1000, peak_bytes_in_use=80
    )
    assert backend.live_buffers == 1
    backend.free(buf)
    backend.free(buf)
    assert buf.is_deleted()
    assert backend.frees == 1
    assert backend.live_buffers == 0
    stats = backend.memory_stats()
    assert stats is not None
    assert (stats.bytes_in_use, stats.peak_bytes_in_use) == (0, 80)
    with pytest.raises(RuntimeError, match="deleted"):
        backend.to_host(buf)
    backend.reset_peak()
    assert backend.peak_bytes_in_use == 0


def test_scratch_counts_towards_the_peak_and_can_run_out() -> None:
    backend = MockBackend(bytes_limit=100)
    backend.register(b"double", _double, SIG, scratch_bytes=50)
    exe = backend.compile(b"double", CompileSpec())
    x = backend.to_device(np.zeros(4, np.float32))  # 16 bytes
    (out,) = backend.execute(exe, [x])
    assert backend.peak_bytes_in_use == 16 + 50 + 16
    assert backend.bytes_in_use == 32  # scratch is released after the run
    hog = backend.to_device(np.zeros(10, np.float32))  # 40 bytes: 72 in use, 28 free
    with pytest.raises(MockOutOfMemoryError, match="RESOURCE_EXHAUSTED"):
        backend.execute(exe, [x])
    assert backend.bytes_in_use == 72  # a failed run leaks nothing
    backend.free(hog)
    backend.free(out)
    backend.execute(exe, [x])
    with pytest.raises(MockOutOfMemoryError):
        backend.to_device(np.zeros(100, np.uint8))


def test_injected_failures() -> None:
    backend = MockBackend()
    backend.register(b"double", _double, SIG)
    exe = backend.compile(b"double", CompileSpec())
    x = backend.to_device(np.zeros(4, np.float32))
    backend.fail_next_execution(times=2)
    for _ in range(2):
        with pytest.raises(MockOutOfMemoryError, match="Out of memory"):
            backend.execute(exe, [x])
    backend.fail_next_execution(ValueError("boom"))
    with pytest.raises(ValueError, match="boom"):
        backend.execute(exe, [x])
    backend.execute(exe, [x])
    assert backend.executions == 1


def test_deleted_arguments_and_freed_executables_fail() -> None:
    backend = MockBackend()
    backend.register(b"pair", lambda a, b: (a + b, a - b))
    exe = backend.compile(b"pair", CompileSpec())
    a = backend.to_device(np.ones(2, np.int32))
    b = backend.to_device(np.ones(2, np.int32))
    total, diff = backend.execute(exe, [a, b])
    np.testing.assert_array_equal(backend.to_host(total), [2, 2])
    np.testing.assert_array_equal(backend.to_host(diff), [0, 0])
    backend.free(b)
    with pytest.raises(RuntimeError, match="argument 1"):
        backend.execute(exe, [a, b])
    backend.free_executable(exe)
    backend.free_executable(exe)
    assert backend.freed_executables == 1
    with pytest.raises(RuntimeError, match="freed"):
        backend.execute(exe, [a, a])


def test_runtime_modules_import_without_jax() -> None:
    # The test seam and the weight runtime talk to the Backend protocol only.
    code = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("jax", "jaxlib"):
            raise ImportError("blocked " + name)

sys.meta_path.insert(0, Block())
import reactantserver.worker.testing
import reactantserver.worker.runtime.budget
import reactantserver.worker.runtime.probe
import reactantserver.worker.runtime.residency
import reactantserver.worker.runtime.weight_cache
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
