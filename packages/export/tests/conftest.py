"""Fixtures for export tests: a tiny real JAX model, exported on the CPU into ``tmp_path``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from reactantserver.export import export_jax


@pytest.fixture
def needs_worker() -> None:
    """Skip where the worker is missing: validate compiles with its backend (the validate
    extra), and ``nox -s export`` installs the export distribution alone."""
    pytest.importorskip("reactantserver.worker.runtime.jax_backend")


def tiny_params(seed: int = 0) -> dict[str, dict[str, np.ndarray[Any, Any]]]:
    """Weights of :func:`tiny_forward`: dense 6 -> 5 (tanh) -> 3."""
    rng = np.random.default_rng(seed)
    return {
        "dense": {
            "w": rng.standard_normal((6, 5)).astype(np.float32),
            "b": rng.standard_normal(5).astype(np.float32),
        },
        "head": {"w": rng.standard_normal((5, 3)).astype(np.float32)},
    }


def tiny_forward(params: dict[str, dict[str, Any]], x: Any) -> Any:
    """logits f32[n, 3] for x f32[n, 6]."""
    return jax.numpy.tanh(x @ params["dense"]["w"] + params["dense"]["b"]) @ params["head"]["w"]


@pytest.fixture
def tiny() -> tuple[Callable[..., Any], dict[str, dict[str, np.ndarray[Any, Any]]]]:
    """``(tiny_forward, tiny_params())``."""
    return tiny_forward, tiny_params()


@pytest.fixture
def models(tmp_path: Path) -> Path:
    """A model directory for the test's bundles."""
    root = tmp_path / "models"
    root.mkdir()
    return root


@pytest.fixture
def tiny_bundle(models: Path) -> Path:
    """``tiny``: x f32[n,6] -> logits f32[n,3] at batch sizes 1, 4."""
    return export_jax(
        tiny_forward,
        tiny_params(),
        ["x=f32[n,f=6]"],
        ["logits"],
        batch_sizes=(1, 4),
        out=models / "tiny",
        progress=False,
    )
