"""Bundles of the worker end-to-end suite: the shipped examples and three test models.

``hooky`` is ``mlp`` with a test ``model.py`` whose behaviour the first input element selects,
``broken`` is ``mlp`` with a manifest that disagrees with its module (it must fail to load), and
``spin`` loops a requested number of times on the dispatch thread, which lets a test hold the
device deterministically. NumPy references check the served numbers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("mlp", "cnn", "classifier_hooks", "two_io")
"""The shipped examples served by the session worker (``pipeline`` is a meta model: 07)."""
TOLERANCE = 1e-5
"""Relative and absolute: compiled batch sizes may round differently, nothing more."""

HOOKY = "hooky"
"""A copy of ``mlp`` with a test ``model.py``: the first element of ``x`` selects a behaviour."""
BROKEN = "broken"
"""A copy of ``mlp`` whose manifest disagrees with its module: it must fail to load."""
HOOK_REJECT = -1000.0
HOOK_CRASH = -2000.0
HOOK_BAD_OUTPUT = -3000.0
HOOK_SLEEP = 7000.0
"""``x[0, 0] == HOOK_SLEEP``: the preprocess hook sleeps ``x[0, 1]`` seconds first."""
HOOK_GATE = 8000.0
"""``x[0, 0] == HOOK_GATE``: the preprocess hook waits until the file ``gate-<x[0, 1]>`` exists
in ``$HOOKY_GATE_DIR`` (at most :data:`HOOK_GATE_MAX_S`): holds a request in flight for exactly
as long as a test wants, whatever the machine's speed."""
HOOK_GATE_MAX_S = 60.0

HOOKY_MODEL_PY = f'''"""Test hooks of the worker end-to-end suite (tests/worker_e2e/_bundles.py)."""

import os
import time
from pathlib import Path

import numpy as np

from reactantserver.core.hooks import InvalidArgumentError, NamedTensor, register_model


def preprocess(inputs):
    (x,) = inputs
    marker = float(x.data[0, 0])
    if marker == {HOOK_REJECT!r}:
        raise InvalidArgumentError("hooky rejects marker {HOOK_REJECT}")
    if marker == {HOOK_CRASH!r}:
        raise RuntimeError("hooky crashed on marker {HOOK_CRASH}")
    if marker == {HOOK_BAD_OUTPUT!r}:
        return [NamedTensor("x", np.ascontiguousarray(x.data[:, :8]))]
    if marker == {HOOK_SLEEP!r}:
        time.sleep(float(x.data[0, 1]))
    if marker == {HOOK_GATE!r}:
        gate = Path(os.environ["HOOKY_GATE_DIR"]) / f"gate-{{int(x.data[0, 1])}}"
        give_up = time.monotonic() + {HOOK_GATE_MAX_S!r}
        while not gate.exists() and time.monotonic() < give_up:
            time.sleep(0.005)
    return [NamedTensor("x", np.asarray(x.data))]


register_model("{HOOKY}", preprocess=preprocess)
'''


SPIN = "spin"
"""Busy-loops ``x[0, 0]`` iterations on the dispatch thread: holds the device deterministically."""
SPIN_ITERATIONS = 10_000_000
"""About a second on one CPU core (float32-exact); tests need "far longer than a request"."""
SPIN_EXPORT = f"""
import jax
import jax.numpy as jnp
import numpy as np
from reactantserver.export import export_jax


def spin(params, x):
    def body(i, h):
        return jnp.tanh(h @ params["w"])

    h = jax.lax.fori_loop(0, x[0, 0].astype(jnp.int32), body, x[:, 1:])
    return jnp.concatenate([x[:, :1], h], axis=1)


w = (np.random.default_rng(0).standard_normal((15, 15)) * 0.1).astype(np.float32)
export_jax(
    spin, {{"w": w}}, ["x=f32[n,f=16]"], ["y=f32[n,f=16]"], batch_sizes=(1, 8),
    out=sys.argv[1] + "/{SPIN}", force=True, progress=False,
)
"""


def export_examples(repo: Path, names: Sequence[str] = EXAMPLES) -> None:
    """Export the named examples and :data:`SPIN` into ``repo`` with one interpreter."""
    script = "import importlib, sys\n" + "".join(
        f"importlib.import_module('examples.{name}.export').export(sys.argv[1], progress=False)\n"
        for name in names
    )
    done = subprocess.run(
        [sys.executable, "-c", script + SPIN_EXPORT, str(repo)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, f"export failed:\n{done.stdout}\n{done.stderr}"


def add_hooky(repo: Path) -> Path:
    """``repo/hooky``: the ``mlp`` bundle plus :data:`HOOKY_MODEL_PY` as its ``model.py``."""
    target = repo / HOOKY
    shutil.copytree(repo / "mlp", target)
    _rename_manifest(target)
    (target / "model.py").write_text(HOOKY_MODEL_PY)
    return target


def add_broken(repo: Path) -> Path:
    """``repo/broken``: ``mlp`` with 17 input features declared for a 16-feature module."""
    target = repo / BROKEN
    shutil.copytree(repo / "mlp", target)
    manifest = _rename_manifest(target)
    manifest["executable_inputs"][0]["dims"] = {"f": 17}
    (target / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return target


def _rename_manifest(bundle: Path) -> dict[str, Any]:
    path = bundle / "manifest.yaml"
    manifest: dict[str, Any] = yaml.safe_load(path.read_text())
    manifest["name"] = bundle.name
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return manifest


def load_weights(bundle: Path) -> dict[str, np.ndarray[Any, Any]]:
    """The bundle's weights by safetensors name."""
    return dict(load_file(str(bundle / "weights.safetensors")))


def mlp_reference(weights: Mapping[str, np.ndarray[Any, Any]], x: np.ndarray[Any, Any]) -> Any:
    """``examples.mlp.network.forward`` in NumPy."""
    h = np.maximum(x @ weights["hidden/w"] + weights["hidden/b"], 0.0)
    return h @ weights["out/w"] + weights["out/b"]


def assert_close(actual: Any, desired: Any) -> None:
    """Server output against a NumPy reference or another server output (f32 noise only)."""
    np.testing.assert_allclose(actual, desired, rtol=TOLERANCE, atol=TOLERANCE)


def two_io_reference(
    weights: Mapping[str, np.ndarray[Any, Any]], a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]
) -> tuple[Any, Any]:
    """``examples.two_io.network.forward`` in NumPy: ``(sum, dot)``."""
    return a + weights["scale"] * b, (a * b) @ weights["proj"]
