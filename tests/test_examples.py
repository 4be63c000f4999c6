"""The shipped examples export, parse as spec-01 bundles, and pass ``validate``; the hooks and
the meta pipeline run end to end through the worker backend."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from reactantserver.core.errors import InvalidArgumentError
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.manifest import load_manifest, resolve_layout
from reactantserver.core.types import Batch, Fixed, Variable
from reactantserver.export import BundleSession, load_registration, validate
from reactantserver.worker.runtime.jax_backend import JaxBackend

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("mlp", "cnn", "classifier_hooks", "pipeline", "two_io")
# bundle -> (module holding the JAX function, function, parameter factory)
REFERENCES = {
    "mlp": ("examples.mlp.network", "forward", "init_params"),
    "cnn": ("examples.cnn.network", "forward", "init_params"),
    "classifier_hooks": ("examples.classifier_hooks.network", "forward", "init_params"),
    "pipeline_embed": ("examples.pipeline.network", "embed", "init_embed_params"),
    "pipeline_score": ("examples.pipeline.network", "score", "init_score_params"),
    "two_io": ("examples.two_io.network", "forward", "init_params"),
}


def _example(module: str) -> ModuleType:
    return importlib.import_module(module)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every example exported once into one model directory (as ``make serve`` does)."""
    models = tmp_path_factory.mktemp("models")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT))
        for name in EXAMPLES:
            _example(f"examples.{name}.export").export(models, progress=False)
        yield models


@pytest.fixture(scope="module")
def backend() -> JaxBackend:
    return JaxBackend("cpu")


def test_every_example_ships_an_export_script_and_a_readme() -> None:
    for name in EXAMPLES:
        assert (ROOT / "examples" / name / "export.py").is_file()
        assert (ROOT / "examples" / name / "__init__.py").is_file()
        readme = (ROOT / "examples" / name / "README.md").read_text()
        assert f"python -m examples.{name}.export --out" in readme
    assert (ROOT / "examples" / "__init__.py").is_file()


def test_the_bundles_are_spec_01(exported: Path) -> None:
    names = sorted(p.name for p in exported.iterdir())
    assert names == sorted([*REFERENCES, "pipeline"])
    for name in names:
        manifest = load_manifest(exported / name)
        layout = resolve_layout(exported / name, manifest)
        assert manifest.format_version == "3.0"
        assert layout.warnings == ()
    mlp = load_manifest(exported / "mlp")
    assert mlp.compiled_batch_sizes == (1, 8, 32)
    assert mlp.executable_inputs[0].shape == (Batch(), Fixed(16))
    assert mlp.executable_outputs[0].shape == (Batch(), Fixed(4))
    cnn = load_manifest(exported / "cnn")
    assert cnn.compiled_batch_sizes == (1, 4, 8, 32)
    assert cnn.letters.executable_inputs == ("nchw",)
    assert cnn.executable_outputs[0].shape == (Batch(), Fixed(10))
    hooks = load_manifest(exported / "classifier_hooks")
    assert [(s.name, s.dtype.token) for s in hooks.client_inputs] == [("image", "u8")]
    assert [s.name for s in hooks.client_outputs] == ["indices", "scores"]
    assert hooks.wire_batch_axis == 1
    two = load_manifest(exported / "two_io")
    assert [s.name for s in two.executable_inputs] == ["a", "b"]
    assert [s.name for s in two.executable_outputs] == ["sum", "dot"]
    meta = load_manifest(exported / "pipeline")
    assert meta.is_meta
    assert meta.meta_calls == ("pipeline_embed", "pipeline_score")
    assert meta.client_inputs[0].shape == (Variable(), Fixed(16))
    assert [s.dtype.token for s in meta.client_outputs] == ["f32", "i64"]


@pytest.mark.parametrize("bundle", sorted(REFERENCES))
def test_every_jax_example_passes_validate_against_its_reference(
    exported: Path, bundle: str
) -> None:
    module, fn, factory = REFERENCES[bundle]
    network = _example(module)
    report = validate(
        exported / bundle,
        reference=getattr(network, fn),
        params=getattr(network, factory)(seed=0),
    )
    assert report.ok, report.to_text()
    assert report.modules
    assert all(m.ran for m in report.modules)


def test_the_meta_example_validates_as_a_meta(exported: Path) -> None:
    report = validate(exported / "pipeline")
    assert report.ok, report.to_text()
    assert "running it needs the server" in report.to_text()


class _LocalCall:
    """A stand-in for the server's ``call``: sub-models run through the worker backend."""

    def __init__(self, sessions: dict[str, BundleSession]) -> None:
        self.sessions = sessions
        self.calls: list[tuple[str, int]] = []
        self.scratched = 0

    def __call__(
        self,
        name: str,
        inputs: list[NamedTensor],
        *,
        requested_outputs: Sequence[str] | None = None,
    ) -> list[NamedTensor]:
        self.calls.append((name, inputs[0].shape[0]))
        return self.sessions[name].infer(inputs)

    def scratch(self, shape: Any, dtype: Any = None) -> Any:
        self.scratched += 1
        return np.empty(shape, dtype)


@pytest.mark.parametrize("count", [1, 5, 32])
def test_the_pipeline_runs_end_to_end(exported: Path, backend: JaxBackend, count: int) -> None:
    network = _example("examples.pipeline.network")
    run = load_registration(exported / "pipeline", "pipeline", "meta").run
    assert run is not None
    sessions = {
        name: BundleSession(exported / name, backend)
        for name in ("pipeline_embed", "pipeline_score")
    }
    call = _LocalCall(sessions)
    items = np.random.default_rng(count).uniform(-1, 1, (count, 16)).astype(np.float32)
    scores, indices = run([NamedTensor("items", items)], call)

    emb = np.asarray(network.embed(network.init_embed_params(), items))
    norms = np.linalg.norm(emb, axis=1)
    keep = np.flatnonzero(norms > np.median(norms))
    if keep.size == 0:
        keep = np.array([np.argmax(norms)])
    expected = np.asarray(network.score(network.init_score_params(), emb[keep]))[:, 0]
    assert indices.name == "indices"
    assert indices.data.dtype == np.int64
    np.testing.assert_array_equal(indices.data, keep)
    assert scores.data.dtype == np.float32
    np.testing.assert_allclose(scores.data, expected, rtol=1e-4, atol=1e-5)
    assert call.calls == [("pipeline_embed", count), ("pipeline_score", keep.size)]
    assert call.scratched == 1
    for session in sessions.values():
        session.close()


def test_the_pipeline_rejects_too_many_items(exported: Path) -> None:
    run = load_registration(exported / "pipeline", "pipeline", "meta").run
    assert run is not None
    with pytest.raises(InvalidArgumentError, match="1 to 32 rows, got 33"):
        run([NamedTensor("items", np.zeros((33, 16), np.float32))], _LocalCall({}))


def test_the_hooks_example_serves_top_3(exported: Path, backend: JaxBackend) -> None:
    network = _example("examples.classifier_hooks.network")
    images = np.random.default_rng(3).integers(0, 256, (5, 28, 28, 3)).astype(np.uint8)
    with BundleSession(exported / "classifier_hooks", backend) as session:
        indices, scores = session.infer([NamedTensor("image", images)])
    pixels = (images.astype(np.float32) * (2.0 / 255.0) - 1.0).transpose(0, 3, 1, 2)
    logits = np.asarray(network.forward(network.init_params(), pixels))
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    expected = np.argsort(-probabilities, axis=1, kind="stable")[:, :3]
    assert indices.shape == scores.shape == (5, 3)
    np.testing.assert_array_equal(indices.data, expected)
    np.testing.assert_allclose(
        scores.data, np.take_along_axis(probabilities, expected, axis=1), rtol=1e-4, atol=1e-6
    )
    assert np.all(np.diff(scores.data, axis=1) <= 0)


def _export_script(name: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"examples.{name}.export", "--out", str(out), "--no-progress"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


@pytest.mark.slow
def test_export_scripts_run_as_make_serve_runs_them(tmp_path: Path) -> None:
    done = _export_script("two_io", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"exported {tmp_path / 'two_io'}"
    first = (tmp_path / "two_io").stat().st_ino
    again = _export_script("two_io", tmp_path)  # re-running replaces the bundle atomically
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "two_io").stat().st_ino != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["two_io"]
