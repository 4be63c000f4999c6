"""The PyTorch path (extra ``torch``): torch.export + torchax -> bundle -> validate.

Skipped where torch is not importable (``nox -s tests`` keeps torch out); ``nox -s zoo``
installs the extra (torch 2.12.1, torchax 0.0.13) and fails instead of skipping.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

if os.environ.get("REACTANT_ZOO") == "1":
    import torch as _torch  # noqa: F401 - a missing torch is an error under nox -s zoo
    import torchax as _torchax  # noqa: F401
torch: Any = pytest.importorskip("torch")
pytest.importorskip("torchax")

from reactantserver.core.manifest import load_manifest  # noqa: E402
from reactantserver.core.weights import SafetensorsReader  # noqa: E402
from reactantserver.export import export_torch, validate  # noqa: E402


def _network() -> Any:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.ReLU(), torch.nn.Linear(5, 3)
    )
    with torch.no_grad():
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 1.5)
    return net.eval()


@pytest.mark.slow
@pytest.mark.usefixtures("needs_worker")
def test_torch_module_exports_and_validates(models: Path) -> None:
    net = _network()
    bundle = export_torch(
        _network, ["x=f32[n,f=6]"], ["logits"], batch_sizes=(1, 4), out=models / "tnet",
        progress=False,
    )  # fmt: skip
    manifest = load_manifest(bundle)
    assert manifest.provenance["source_framework"] == "pytorch"
    assert "torch_version" in manifest.provenance
    assert "torchax_version" in manifest.provenance
    assert manifest.executable_outputs[0].name == "logits"
    with SafetensorsReader(bundle / "weights.safetensors") as reader:
        order = reader.argument_order
    # State-dict entries in placeholder order: parameters, then buffers.
    assert order[:2] == ("0.weight", "0.bias")
    assert "1.running_mean" in order

    def reference(params: Any, x: Any) -> Any:
        del params
        with torch.no_grad():
            return net(torch.from_numpy(np.asarray(x))).numpy()

    report = validate(bundle, reference=reference, rtol=1e-3, atol=1e-4)
    assert report.ok, report.to_text()
