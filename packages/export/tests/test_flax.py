"""The Flax path (extra ``flax``): an NNX module -> bundle -> validate, from Python and the CLI.

Skipped where flax is not importable; ``nox -s zoo`` installs it (and fails instead of
skipping there).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

if os.environ.get("REACTANT_ZOO") == "1":
    import flax as _flax  # noqa: F401 - a missing flax is an error under nox -s zoo
nnx: Any = pytest.importorskip("flax.nnx")

from reactantserver.core.manifest import load_manifest  # noqa: E402
from reactantserver.core.weights import SafetensorsReader  # noqa: E402
from reactantserver.export import export_flax, validate  # noqa: E402
from reactantserver.export._cli import main  # noqa: E402


class Net(nnx.Module):  # type: ignore[misc]
    """Dense -> BatchNorm -> ReLU -> Dropout -> dense: parameters, batch statistics and RNG
    state (which must not become weights)."""

    def __init__(self, seed: int = 0) -> None:
        rngs = nnx.Rngs(seed)
        self.dense = nnx.Linear(6, 5, rngs=rngs)
        self.norm = nnx.BatchNorm(5, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.head = nnx.Linear(5, 3, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.head(self.drop(nnx.relu(self.norm(self.dense(x)))))


def build() -> Net:
    """The CLI's factory."""
    net = Net()
    net.norm.mean[...] = np.linspace(-0.5, 0.5, 5, dtype=np.float32)
    net.norm.var[...] = np.linspace(0.5, 1.5, 5, dtype=np.float32)
    return net


@pytest.mark.slow
@pytest.mark.usefixtures("needs_worker")
def test_an_nnx_module_exports_and_validates(models: Path) -> None:
    net = build()
    bundle = export_flax(
        build(), ["x=f32[n,f=6]"], ["logits"], batch_sizes=(1, 4), out=models / "fnet",
        progress=False,
    )  # fmt: skip
    manifest = load_manifest(bundle)
    assert manifest.provenance["source_framework"] == "flax"
    assert "flax_version" in manifest.provenance
    with SafetensorsReader(bundle / "weights.safetensors") as reader:
        order = reader.argument_order
    # Parameters and batch statistics, in sorted path order; no RNG state.
    assert order == (
        "dense/bias", "dense/kernel", "head/bias", "head/kernel",
        "norm/bias", "norm/mean", "norm/scale", "norm/var",
    )  # fmt: skip
    net.eval()

    def reference(params: Any, x: Any) -> Any:
        del params
        return np.asarray(net(np.asarray(x)))

    report = validate(bundle, reference=reference, rtol=1e-4, atol=1e-5)
    assert report.ok, report.to_text()


@pytest.mark.slow
def test_the_cli_exports_a_factory(models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = models / "fcli"
    args = ["flax", f"{__name__}:build", "--input", "x=f32[n,6]", "--batch-sizes", "1,2"]
    assert main([*args, "--out", str(out), "--no-progress"]) == 0
    assert f"exported {out}" in capsys.readouterr().out
    assert load_manifest(out).compiled_batch_sizes == (1, 2)


def test_not_a_module_is_refused(tmp_path: Path) -> None:
    from reactantserver.export import ExportError

    with pytest.raises(ExportError, match=r"not a flax\.nnx\.Module"):
        export_flax(object, ["x=f32[n,6]"], batch_sizes=(1,), out=str(tmp_path / "x"))
