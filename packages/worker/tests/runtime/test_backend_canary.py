"""Canary for jax private-API drift: every entry point of the one backend module, on the CPU.

If a jaxlib upgrade moves ``compile_and_load``, executable (de)serialisation, the MLIR
bindings or buffer deletion, these tests fail first and say where.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reactantserver.core.dtypes import DType
from reactantserver.core.errors import BundleError
from reactantserver.worker.runtime.backend import CompileSpec, TensorType, is_bytecode
from reactantserver.worker.runtime.jax_backend import (
    PINNED_HOST,
    JaxBackend,
    jax_versions,
    page_locking,
)


def _dense(w: jax.Array, b: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w + b)


@pytest.fixture(scope="module")
def backend() -> JaxBackend:
    return JaxBackend("cpu")


@pytest.fixture(scope="module")
def exported() -> Any:
    shapes = (
        jax.ShapeDtypeStruct((2, 4), jnp.float32),
        jax.ShapeDtypeStruct((4, 3), jnp.float32),
        jax.ShapeDtypeStruct((3,), jnp.float32),
    )

    def entry(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
        return _dense(w, b, x)

    return jax.export.export(jax.jit(entry, keep_unused=True), platforms=("cpu",))(*shapes)


def _inputs() -> tuple[np.ndarray[Any, Any], ...]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4), dtype=np.float32)
    w = rng.standard_normal((4, 3), dtype=np.float32)
    b = rng.standard_normal((3,), dtype=np.float32)
    return x, w, b


def _expected() -> np.ndarray[Any, Any]:
    x, w, b = _inputs()
    expected: np.ndarray[Any, Any] = np.tanh(x @ w + b)
    return expected


@pytest.mark.parametrize("form", ["bytecode", "text"])
def test_compile_execute_round_trip(backend: JaxBackend, exported: Any, form: str) -> None:
    module = exported.mlir_module_serialized if form == "bytecode" else exported.mlir_module()
    module = module if isinstance(module, bytes) else module.encode()
    assert is_bytecode(module) == (form == "bytecode")
    exe = backend.compile(module, CompileSpec())
    args = [backend.to_device(a) for a in _inputs()]
    (out,) = backend.execute(exe, args)
    np.testing.assert_allclose(backend.to_host(out), _expected(), rtol=1e-5, atol=1e-6)
    for buf in [*args, out]:
        backend.free(buf)
        assert buf.is_deleted()
        backend.free(buf)  # idempotent
    backend.free_executable(exe)


def test_signature_of_portable_artifact(backend: JaxBackend, exported: Any) -> None:
    sig = backend.signature(exported.mlir_module_serialized)
    assert sig.inputs == (
        TensorType(DType.F32, (2, 4)),
        TensorType(DType.F32, (4, 3)),
        TensorType(DType.F32, (3,)),
    )
    assert sig.results == (TensorType(DType.F32, (2, 3)),)
    assert sig.static


def test_signature_element_types_of_text_module(backend: JaxBackend) -> None:
    text = b"""
    module @types {
      func.func public @main(%a: tensor<2xi64>, %b: tensor<2x3xi1>, %c: tensor<ui8>,
                             %d: tensor<4xbf16>, %e: tensor<?xf32>) -> (tensor<2xi64>) {
        return %a : tensor<2xi64>
      }
    }
    """
    sig = backend.signature(text)
    assert [t.dtype for t in sig.inputs] == [DType.I64, DType.BOOL, DType.U8, DType.BF16, DType.F32]
    assert sig.inputs[2].shape == ()
    assert sig.inputs[4].shape == (-1,)
    assert not sig.static


def test_signature_rejects_garbage(backend: JaxBackend) -> None:
    with pytest.raises(BundleError, match="cannot parse"):
        backend.signature(b"this is not mlir")
    with pytest.raises(BundleError, match="main"):
        backend.signature(b"module @m { func.func public @other() -> () { return } }")


def test_executable_serialisation(backend: JaxBackend, exported: Any) -> None:
    exe = backend.compile(exported.mlir_module_serialized, CompileSpec())
    blob = backend.serialize(exe)
    assert isinstance(blob, bytes)
    assert blob
    again = backend.deserialize(blob, CompileSpec())
    args = [backend.to_device(a) for a in _inputs()]
    (out,) = backend.execute(again, args)
    np.testing.assert_allclose(backend.to_host(out), _expected(), rtol=1e-5, atol=1e-6)


def test_identity_and_memory(backend: JaxBackend) -> None:
    assert backend.platform == "cpu"
    assert backend.device_kind == "cpu"
    assert jax_versions()["jaxlib"] in backend.version_material
    assert backend.memory_stats() is None  # the CPU client keeps no allocator statistics


def test_bad_platform_and_ordinal() -> None:
    with pytest.raises(ValueError, match="platform"):
        JaxBackend("tpu-9000")
    with pytest.raises(ValueError, match="device_ordinal"):
        JaxBackend("cpu", device_ordinal=99)


@pytest.mark.parametrize(
    ("platform", "kinds", "wanted", "expected"),
    [
        ("cuda", ("device", "pinned_host", "unpinned_host"), None, True),
        ("cuda", ("device", "pinned_host"), True, True),
        ("cuda", ("device", "pinned_host"), False, False),
        ("cuda", ("device",), None, False),  # a plugin without the memory space: fallback
        ("cuda", ("device",), True, False),
        ("cuda", (), None, False),
        ("cpu", ("device", "pinned_host", "unpinned_host"), None, False),  # aliasing is cheaper
        ("cpu", ("device", "pinned_host"), True, True),
        ("cpu", ("device",), True, False),
    ],
)
def test_page_locking_decision(
    platform: str, kinds: tuple[str, ...], wanted: bool | None, expected: bool
) -> None:
    assert page_locking(platform, kinds, wanted) is expected


def test_cpu_defaults_pageable_and_synchronous(backend: JaxBackend) -> None:
    # The memory-space listing page-locking relies on: if jax renames it, this fails first.
    assert "device" in backend.memory_kinds
    assert backend.page_locked_host is False
    assert backend.async_transfers is False
    with pytest.raises(RuntimeError, match="no page-locked host memory"):
        backend.page_lock(np.zeros(3, np.float32))


def test_page_locked_copy_round_trip(exported: Any) -> None:
    """The page-locked path, forced on the CPU client (it lists a ``pinned_host`` space)."""
    backend = JaxBackend("cpu", page_locked=True)
    if PINNED_HOST not in backend.memory_kinds:
        pytest.skip(f"this jax CPU client has no {PINNED_HOST} memory space")
    assert backend.page_locked_host
    exe = backend.compile(exported.mlir_module_serialized, CompileSpec())
    x, w, b = _inputs()
    locked = [backend.page_lock(w), backend.page_lock(b)]
    assert [h.sharding.memory_kind for h in locked] == [PINNED_HOST, PINNED_HOST]
    weights = [backend.to_device(h, wait=False) for h in locked]
    backend.wait(weights)
    batched = backend.to_device_many([x, *locked])  # NumPy and page-locked, one call
    np.testing.assert_array_equal(backend.to_host(batched[2]), b)
    for buf in batched:
        backend.free(buf)
    assert {buf.sharding.memory_kind for buf in weights} == {"device"}
    outputs = backend.execute(exe, [backend.to_device(x), *weights], wait=False)
    backend.wait(outputs)
    np.testing.assert_allclose(backend.to_host(outputs[0]), _expected(), rtol=1e-5, atol=1e-6)
    for buf in [*locked, *weights, *outputs]:
        backend.free(buf)
        assert buf.is_deleted()


def test_batched_copy_entry_point_exists() -> None:
    """The C++ call that copies a model's page-locked arrays at once (else a slow fallback)."""

    from reactantserver.worker.runtime import jax_backend

    assert jax_backend._BATCHED_COPY is not None
    assert jax_backend._ALWAYS_COPY is not None
