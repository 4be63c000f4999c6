"""Loading real bundles: every batch size compiled once, signatures checked, weights read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from packages.worker.tests.conftest import BundleMaker, Tensor
from reactantserver.core.errors import BundleError
from reactantserver.worker.runtime.executable_cache import ExecutableCache
from reactantserver.worker.runtime.jax_backend import JaxBackend
from reactantserver.worker.runtime.loader import load_bundle

X = Tensor("x", "f32", "nk", {"k": 6})
Y = Tensor("y", "f32", "nm", {"m": 3})


def _dense(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.maximum(x @ w + b, 0.0)


def _weights() -> list[tuple[str, np.ndarray[Any, Any]]]:
    rng = np.random.default_rng(7)
    return [
        ("dense/w", rng.standard_normal((6, 3)).astype(np.float32)),
        ("dense/b", rng.standard_normal((3,)).astype(np.float32)),
    ]


def _rewrite_weights(bundle: Path, weights: dict[str, np.ndarray[Any, Any]]) -> None:
    save_file(
        weights,
        str(bundle / "weights.safetensors"),
        metadata={"argument_order": json.dumps(list(weights))},
    )


@pytest.fixture(scope="module")
def backend() -> JaxBackend:
    return JaxBackend("cpu")


def _run(
    backend: JaxBackend, model: Any, batch: int, x: np.ndarray[Any, Any]
) -> np.ndarray[Any, Any]:
    args = [backend.to_device(x)] + [backend.to_device(w) for w in model.read_weights()]
    (out,) = backend.execute(model.module(None, batch).executable, args)
    return backend.to_host(out)


def test_every_batch_size_compiles_and_runs(
    make_bundle: BundleMaker, backend: JaxBackend, tmp_path: Path
) -> None:
    bundle = make_bundle(
        "dense", _dense, inputs=[X], outputs=[Y], weights=_weights(), batch_sizes=[1, 4]
    )
    cache = ExecutableCache(tmp_path / "cache", backend)
    model = load_bundle(bundle, backend, cache)
    assert sorted(model.modules) == [(None, 1), (None, 4)]
    assert model.weight_nbytes == (18 + 3) * 4
    assert [s.name for s in model.weight_specs] == ["dense/w", "dense/b"]
    w, b = (a for _, a in _weights())
    for batch in (1, 4):
        x = np.arange(batch * 6, dtype=np.float32).reshape(batch, 6) / 10
        np.testing.assert_allclose(
            _run(backend, model, batch, x), np.maximum(x @ w + b, 0), rtol=1e-5
        )
    assert cache.counters.compiles == 2
    model.close()


def test_second_load_hits_the_cache(
    make_bundle: BundleMaker, backend: JaxBackend, tmp_path: Path
) -> None:
    bundle = make_bundle(
        "dense", _dense, inputs=[X], outputs=[Y], weights=_weights(), batch_sizes=[1, 4]
    )
    load_bundle(bundle, backend, ExecutableCache(tmp_path / "cache", backend)).close()
    again = ExecutableCache(tmp_path / "cache", backend)

    class NoParse(JaxBackend):
        def signature(self, module: bytes) -> Any:
            raise AssertionError("a cache hit must not parse MLIR")

    model = load_bundle(bundle, NoParse("cpu"), again)
    assert (again.counters.hits, again.counters.compiles) == (2, 0)
    x = np.ones((4, 6), dtype=np.float32)
    w, b = (a for _, a in _weights())
    np.testing.assert_allclose(_run(backend, model, 4, x), np.maximum(x @ w + b, 0), rtol=1e-5)


def test_wrong_dims_name_expected_and_actual(
    make_bundle: BundleMaker, backend: JaxBackend, tmp_path: Path
) -> None:
    def lie(m: dict[str, Any]) -> None:
        m["executable_inputs"][0]["dims"]["k"] = 7

    bundle = make_bundle(
        "liar",
        _dense,
        inputs=[X],
        outputs=[Y],
        weights=_weights(),
        batch_sizes=[2],
        manifest_edit=lie,
    )
    with pytest.raises(
        BundleError, match=r"model\.b2\.mlir: argument 0 \(input 'x'\) is 2x6xf32, expected 2x7xf32"
    ):
        load_bundle(bundle, backend, ExecutableCache(None, backend))


def test_argument_count_mismatch(make_bundle: BundleMaker, backend: JaxBackend) -> None:
    bundle = make_bundle(
        "short", _dense, inputs=[X], outputs=[Y], weights=_weights(), batch_sizes=[2]
    )
    # One more weight in the file than the entry takes.
    extra = [*_weights(), ("extra", np.zeros(2, np.float32))]
    _rewrite_weights(bundle, dict(extra))
    with pytest.raises(
        BundleError,
        match=r"entry has 3 arguments, manifest \+ weights declare 4 \(inputs 1 \+ weights 3\)",
    ):
        load_bundle(bundle, backend, ExecutableCache(None, backend))


def test_weight_shape_mismatch(make_bundle: BundleMaker, backend: JaxBackend) -> None:
    bundle = make_bundle(
        "swap", _dense, inputs=[X], outputs=[Y], weights=_weights(), batch_sizes=[2]
    )
    w, b = (a for _, a in _weights())
    _rewrite_weights(bundle, {"dense/w": w.T.copy(), "dense/b": b})
    with pytest.raises(
        BundleError, match=r"argument 1 \(weight 'dense/w'\) is 6x3xf32, expected 3x6xf32"
    ):
        load_bundle(bundle, backend, ExecutableCache(None, backend))


def test_output_mismatch(make_bundle: BundleMaker, backend: JaxBackend) -> None:
    def lie(m: dict[str, Any]) -> None:
        m["executable_outputs"][0]["dtype"] = "i32"

    bundle = make_bundle(
        "outlie",
        _dense,
        inputs=[X],
        outputs=[Y],
        weights=_weights(),
        batch_sizes=[2],
        manifest_edit=lie,
    )
    with pytest.raises(BundleError, match=r"result 0 \(output 'y'\) is 2x3xf32, expected 2x3xi32"):
        load_bundle(bundle, backend, ExecutableCache(None, backend))


def test_format_2_bundle_weights_are_axis_reversed(
    make_bundle: BundleMaker, backend: JaxBackend
) -> None:
    """A ReactantServer.jl bundle stores Julia-shaped weights; the entry takes them reversed."""

    def to_v2(m: dict[str, Any]) -> None:
        m["format_version"] = "2.0"
        for entry in m["executable_inputs"] + m["executable_outputs"]:
            entry["shape"] = entry["shape"][::-1]  # 2.0 writes column-major letters

    bundle = make_bundle(
        "jl",
        _dense,
        inputs=[X],
        outputs=[Y],
        weights=_weights(),
        batch_sizes=[2],
        manifest_edit=to_v2,
    )
    w, b = (a for _, a in _weights())
    _rewrite_weights(bundle, {"dense/w": w.T.copy(), "dense/b": b})
    model = load_bundle(bundle, backend, ExecutableCache(None, backend))
    assert model.manifest.source_format == "2.0"
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_allclose(_run(backend, model, 2, x), np.maximum(x @ w + b, 0), rtol=1e-5)
    assert (
        yaml.safe_load((bundle / "manifest.yaml").read_text())["executable_inputs"][0]["shape"]
        == "kn"
    )
