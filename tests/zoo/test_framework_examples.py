"""The shipped framework examples, ``resnet18_flax`` and ``resnet50_torch``: exported by their
scripts, validated through their hooks, served by a worker, and the served top-5 of a uint8
image compared with the framework's own (eager) top-5."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.zoo._support import require

require("torch", "torchvision", "torchax", "flax")

from reactantserver.export import validate  # noqa: E402
from tests.worker_e2e._harness import WorkerProcess  # noqa: E402
from tests.zoo._support import serve  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

EXAMPLES = ("resnet18_flax", "resnet50_torch")
MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255.0
STD = np.array([0.229, 0.224, 0.225], np.float32) * 255.0


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both examples exported by their own scripts."""
    models = tmp_path_factory.mktemp("examples")
    for name in EXAMPLES:
        importlib.import_module(f"examples.{name}.export").export(models, progress=False)
    return models


@pytest.fixture(scope="module")
def worker(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One worker serving both."""
    yield from serve(repo, tmp_path_factory.mktemp("logs") / "worker.log")


def _images(batch: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(batch).integers(0, 256, (batch, 224, 224, 3), dtype=np.uint8)


def _eager_logits(name: str, images: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    pixels = (images.astype(np.float32) - MEAN) / STD
    if name == "resnet18_flax":
        from examples.resnet18_flax.network import resnet18

        return np.asarray(resnet18()(pixels), np.float32)
    import torch

    from examples.resnet50_torch.network import build

    with torch.no_grad():
        nchw = torch.from_numpy(np.ascontiguousarray(pixels.transpose(0, 3, 1, 2)))
        return np.asarray(build()(nchw).numpy())


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_example_validates_through_its_hooks(repo: Path, name: str) -> None:
    report = validate(repo / name)
    assert report.ok, report.to_text()
    assert [m.batch_size for m in report.modules] == [1, 8]


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("batch", [1, 3])
def test_the_served_top5_is_the_framework_top5(
    worker: WorkerProcess, name: str, batch: int
) -> None:
    images = _images(batch)
    given = grpcclient.InferInput("image", list(images.shape), "UINT8")
    given.set_data_from_numpy(images)
    with grpcclient.InferenceServerClient(worker.url) as client:
        result = client.infer(name, [given], client_timeout=300)
    indices, scores = result.as_numpy("indices"), result.as_numpy("scores")
    assert indices.shape == scores.shape == (batch, 5)
    logits = _eager_logits(name, images)
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=1, keepdims=True)
    served = np.take_along_axis(probabilities, indices, axis=1)
    # The served classes carry the eager probabilities they claim, in order, and no class
    # left out beats the fifth (ties within the tolerance may swap places).
    np.testing.assert_allclose(scores, served, rtol=1e-3, atol=1e-6)
    fifth = np.sort(probabilities, axis=1)[:, -5]
    assert np.all(scores[:, -1] >= fifth * (1 - 1e-3)), (scores, fifth)
