"""Fixtures for worker tests: real bundles built with jax on the CPU.

The worker's own tests must run with only the worker installed (``nox -s worker``), so this
builds bundles directly with ``jax.export`` rather than through ``reactantserver-export``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import jax
import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file


@attrs.frozen
class Tensor:
    """A tensor of a test bundle: row-major letters, ``n`` for the batch axis."""

    name: str
    dtype: str
    letters: str
    dims: Mapping[str, int] = attrs.field(factory=dict)

    def shape(self, batch: int) -> tuple[int, ...]:
        return tuple(batch if c == "n" else self.dims[c] for c in self.letters)

    def entry(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": self.letters,
            "dims": dict(self.dims),
        }


class BundleMaker(Protocol):
    def __call__(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        weights: Sequence[tuple[str, np.ndarray[Any, Any]]],
        batch_sizes: Sequence[int],
        manifest_edit: Callable[[dict[str, Any]], None] | None = None,
    ) -> Path: ...


_NUMPY = {"f32": np.float32, "i32": np.int32, "i64": np.int64, "f64": np.float64}

#: Names the platform the ``gpu``-marked tests run on (``cuda``; ``cpu`` for the kit's dry run).
PLATFORM_VARIABLE = "REACTANT_TEST_PLATFORM"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu``-marked tests unless ``REACTANT_TEST_PLATFORM`` says where to run them."""
    if os.environ.get(PLATFORM_VARIABLE, "").strip():
        return
    skip = pytest.mark.skip(
        reason=f"needs a GPU: bench/gpu/run.sh runs these ({PLATFORM_VARIABLE}=cuda)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_platform() -> str:
    """The platform of the ``gpu``-marked tests: ``cuda`` on the GPU machine."""
    platform = os.environ.get(PLATFORM_VARIABLE, "").strip()
    if platform not in ("cuda", "cpu"):
        pytest.fail(f"{PLATFORM_VARIABLE} must be cuda or cpu, got {platform!r}")
    return platform


def export_module(
    fn: Callable[..., Any],
    inputs: Sequence[Tensor],
    weights: Sequence[tuple[str, np.ndarray[Any, Any]]],
    batch: int,
    *,
    platform: str = "cpu",
) -> bytes:
    """StableHLO portable artifact of ``fn(*inputs, *weights)`` at one batch size."""
    args = [jax.ShapeDtypeStruct(t.shape(batch), _NUMPY[t.dtype]) for t in inputs]
    args += [jax.ShapeDtypeStruct(w.shape, w.dtype) for _, w in weights]
    exported = jax.export.export(jax.jit(fn, keep_unused=True), platforms=(platform,))(*args)
    return bytes(exported.mlir_module_serialized)


@pytest.fixture
def make_bundle(tmp_path: Path) -> BundleMaker:
    root = tmp_path / "models"
    root.mkdir()

    def make(
        name: str,
        fn: Callable[..., Any],
        *,
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        weights: Sequence[tuple[str, np.ndarray[Any, Any]]],
        batch_sizes: Sequence[int],
        manifest_edit: Callable[[dict[str, Any]], None] | None = None,
    ) -> Path:
        bundle = root / name
        bundle.mkdir()
        for b in batch_sizes:
            (bundle / f"model.b{b}.mlir").write_bytes(export_module(fn, inputs, weights, b))
        save_file(
            {n: np.ascontiguousarray(w) for n, w in weights},
            str(bundle / "weights.safetensors"),
            metadata={"argument_order": json.dumps([n for n, _ in weights])},
        )
        manifest: dict[str, Any] = {
            "format_version": "3.0",
            "executable_inputs": [t.entry() for t in inputs],
            "executable_outputs": [t.entry() for t in outputs],
            "batching": {"compiled_batch_sizes": list(batch_sizes)},
        }
        if manifest_edit is not None:
            manifest_edit(manifest)
        (bundle / "manifest.yaml").write_text(yaml.safe_dump(manifest))
        return bundle

    return make
