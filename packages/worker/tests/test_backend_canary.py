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
from reactantserver.worker._backend import JaxBackend, jax_versions
from reactantserver.worker.runtime.backend import CompileSpec, TensorType, is_bytecode


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
