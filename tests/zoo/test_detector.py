"""The detector meta model: torchvision's Faster R-CNN (MobileNetV3-Large FPN, 320) exported as
two compiled stages and served behind NumPy glue, against the eager torchvision model on the
same seeded weights.

Tolerance: the same detections in the same order (labels equal), boxes within 0.01 px (of a
320 px image) and scores within 1e-4 of the eager ones.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.zoo._support import require

require("torch", "torchvision", "torchax")

import torch  # noqa: E402

from examples.detector.export import export  # noqa: E402
from examples.detector.network import SIZE, build  # noqa: E402
from reactantserver.core.hooks import collect_registrations  # noqa: E402
from reactantserver.core.manifest import load_manifest  # noqa: E402
from reactantserver.export import validate  # noqa: E402
from tests.worker_e2e._harness import WorkerProcess  # noqa: E402
from tests.zoo._support import serve  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BOX_ATOL = 1e-2
SCORE_ATOL = 1e-4
META_PY = Path(__file__).resolve().parents[2] / "examples" / "detector" / "meta.py"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two stages and the meta model."""
    models = tmp_path_factory.mktemp("detector")
    export(models, progress=False)
    return models


@pytest.fixture(scope="module")
def worker(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """One worker serving the detector."""
    yield from serve(repo, tmp_path_factory.mktemp("logs") / "worker.log")


@pytest.fixture(scope="module")
def glue() -> ModuleType:
    """The meta's ``model.py``, imported as the worker imports it."""
    spec = importlib.util.spec_from_file_location("detector_glue", META_PY)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with collect_registrations():
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def detector() -> Any:
    """The eager torchvision model on the same seeded weights."""
    return build()


def _image(seed: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).random((3, SIZE, SIZE), dtype=np.float32)


def test_the_glue_anchors_are_torchvisions(glue: ModuleType, detector: Any) -> None:
    from torchvision.models.detection.image_list import ImageList

    images = ImageList(torch.zeros(1, 3, SIZE, SIZE), [(SIZE, SIZE)])
    grids = [torch.zeros(1, 256, g, g) for g in glue.GRIDS]
    want = detector.rpn.anchor_generator(images, grids)[0].numpy()
    np.testing.assert_array_equal(glue.ANCHORS, want)


def test_the_glue_roi_align_is_torchvisions(glue: ModuleType) -> None:
    from torchvision.ops import roi_align

    rng = np.random.default_rng(3)
    features = rng.standard_normal((256, 10, 10)).astype(np.float32)
    corners = rng.uniform(-20, 330, (40, 2, 2)).astype(np.float32)
    boxes = np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=1)
    got = np.empty((40, 256, 7, 7), np.float32)
    glue.roi_align(features, boxes, got)
    want = roi_align(
        torch.from_numpy(features[None]),
        [torch.from_numpy(boxes)],
        output_size=7,
        spatial_scale=1 / 32,
        sampling_ratio=2,
    ).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_bundles(repo: Path) -> None:
    meta = load_manifest(repo / "detector")
    assert meta.is_meta
    assert meta.meta_calls == ("detector_backbone", "detector_head")
    assert load_manifest(repo / "detector_head").compiled_batch_sizes == (150,)
    for stage in ("detector_backbone", "detector_head"):
        report = validate(repo / stage)
        assert report.ok, report.to_text()


@pytest.mark.parametrize("seed", [1, 2])
def test_served_detections_match_eager_torchvision(
    worker: WorkerProcess, detector: Any, seed: int
) -> None:
    image = _image(seed)
    given = grpcclient.InferInput("image", list(image.shape), "FP32")
    given.set_data_from_numpy(image)
    with grpcclient.InferenceServerClient(worker.url) as client:
        result = client.infer("detector", [given], client_timeout=300)
    boxes, scores = result.as_numpy("boxes"), result.as_numpy("scores")
    labels = result.as_numpy("labels")
    with torch.no_grad():
        (want,) = detector([torch.from_numpy(image)])
    assert len(scores) > 10, "the seeded detector should find objects"
    np.testing.assert_array_equal(labels, want["labels"].numpy())
    np.testing.assert_allclose(scores, want["scores"].numpy(), rtol=0, atol=SCORE_ATOL)
    np.testing.assert_allclose(boxes, want["boxes"].numpy(), rtol=0, atol=BOX_ATOL)
    print(
        f"detector seed {seed}: {len(scores)} detections, max |box| error "
        f"{np.abs(boxes - want['boxes'].numpy()).max():.2e} px, max |score| error "
        f"{np.abs(scores - want['scores'].numpy()).max():.2e}"
    )
