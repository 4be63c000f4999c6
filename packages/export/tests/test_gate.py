"""The arity/signature gate: unservable functions are refused before anything is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reactantserver.core.dtypes import DType
from reactantserver.export import UnservableError, export_jax
from reactantserver.export._gate import ArgSpec, check_entry, entry_facts

PARAMS = {"w": np.full((4, 2), 0.5, np.float32), "b": np.ones(2, np.float32)}
HEADER = r"UNSERVABLE: compiled entry arguments : {} / expected : {} \(inputs 1 \+ weights {}\)"


def _export(fn: Any, models: Path, params: Any = PARAMS) -> Path:
    return export_jax(
        fn, params, ["x=f32[n,4]"], batch_sizes=(2,), out=models / "m", progress=False
    )


def _nothing_written(models: Path) -> None:
    assert list(models.iterdir()) == []


def test_constant_folded_weight_is_refused(models: Path) -> None:
    frozen_w = PARAMS["w"].copy()

    def fn(params: Any, x: Any) -> Any:
        # Reads a closed-over numpy copy: the weights file would be ignored.
        return x @ frozen_w + params["b"]

    with pytest.raises(UnservableError, match=HEADER.format(2, 3, 2)) as info:
        _export(fn, models)
    assert "weight 'w' is never read" in str(info.value)
    _nothing_written(models)


def test_captured_device_array_is_refused(models: Path) -> None:
    offset = jnp.arange(2, dtype=jnp.float32)

    def fn(params: Any, x: Any) -> Any:
        return x @ params["w"] + params["b"] + offset

    with pytest.raises(UnservableError, match=HEADER.format(4, 3, 2)) as info:
        _export(fn, models)
    assert "captured from the closure (float32[2])" in str(info.value)
    _nothing_written(models)


def test_captured_rng_key_in_a_nested_jit_is_refused(models: Path) -> None:
    key = jax.random.key(42)

    @jax.jit
    def noise(y: Any) -> Any:
        return y + jax.random.normal(key, y.shape)

    def fn(params: Any, x: Any) -> Any:
        return noise(x @ params["w"] + params["b"])

    with pytest.raises(UnservableError, match=HEADER.format(4, 3, 2)) as info:
        _export(fn, models)
    assert "an RNG key or model state" in str(info.value)
    _nothing_written(models)


def test_effects_are_refused(models: Path) -> None:
    def fn(params: Any, x: Any) -> Any:
        jax.debug.print("x = {}", x)
        return x @ params["w"] + params["b"]

    with pytest.raises(
        UnservableError, match=r"UNSERVABLE: model\.b2\.mlir: the function has effects"
    ):
        _export(fn, models)
    _nothing_written(models)


def test_numpy_constants_are_fine(models: Path) -> None:
    mean = np.array([0.5, -0.5], np.float32)

    def fn(params: Any, x: Any) -> Any:
        return x @ params["w"] + params["b"] - mean

    assert (_export(fn, models) / "manifest.yaml").is_file()


def _module(fn: Any, *shapes: tuple[int, ...]) -> bytes:
    avals = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    exported = jax.export.export(jax.jit(fn), platforms=("cpu",))(*avals)
    return bytes(exported.mlir_module_serialized)


def test_entry_parsing_sees_a_surplus_or_missing_argument() -> None:
    # jax.jit without keep_unused drops the unused weight from the entry signature.
    module = _module(lambda x, w, unused: x @ w, (2, 4), (4, 2), (3,))
    facts = entry_facts(module)
    assert len(facts.arguments) == 2
    assert facts.read == (True, True)
    expected = [
        ArgSpec("input", "x", (2, 4), DType.F32),
        ArgSpec("weight", "w", (4, 2), DType.F32),
        ArgSpec("weight", "unused", (3,), DType.F32),
    ]
    with pytest.raises(
        UnservableError,
        match=r"compiled entry arguments : 2 / expected : 3 \(inputs 1 \+ weights 2\)",
    ):
        check_entry(facts, expected, inputs=1, weights=2, where="model.b2.mlir")
    with pytest.raises(UnservableError, match=r"argument 1 \(weight 'w'\) is tensor<4x2xf32>"):
        check_entry(
            facts,
            [expected[0], ArgSpec("weight", "w", (2, 4), DType.F32)],
            inputs=1,
            weights=1,
            where="m",
        )
    check_entry(facts, expected[:2], inputs=1, weights=1, where="m")


def test_dynamic_shapes_are_refused() -> None:
    text = b"""
    func.func public @main(%arg0: tensor<?x4xf32>) -> tensor<?x4xf32> {
      return %arg0 : tensor<?x4xf32>
    }
    """
    facts = entry_facts(text)
    with pytest.raises(UnservableError, match="dynamic shape"):
        check_entry(
            facts,
            [ArgSpec("input", "x", (-1, 4), DType.F32)],
            inputs=1,
            weights=0,
            where="model.mlir",
        )
