"""The detector's two compiled stages, cut out of torchvision's Faster R-CNN.

``build`` makes ``fasterrcnn_mobilenet_v3_large_320_fpn`` with random weights from a seed
(nothing is downloaded). Freshly initialised heads score every class and every anchor almost
alike (softmax ~1/91), which leaves the top-k and NMS to break ties; ``build`` therefore draws
the RPN's and the box predictor's last layers with a larger spread, so that the detections
depend on the image, as a trained model's do. A trained checkpoint replaces all of it.

- :class:`Backbone` (stage 1, ``detector_backbone``): ``image`` f32[n,3,320,320] in [0, 1] ->
  the FPN level the box head pools from, ``features`` f32[n,256,10,10], and the RPN's raw
  outputs over all 3375 anchors, ``objectness`` f32[n,3375] and ``deltas`` f32[n,3375,4].
- :class:`BoxHead` (stage 2, ``detector_head``): pooled regions ``rois`` f32[n,256,7,7] ->
  ``class_logits`` f32[n,91] and ``box_regression`` f32[n,364].

Everything between them (anchors, proposal decoding, top-k, NMS, RoIAlign) and after them
(per-class decoding, thresholds, NMS) is data-dependent and runs in the meta model's glue.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

__all__ = [
    "CLASSES",
    "SEED",
    "SIZE",
    "Backbone",
    "BoxHead",
    "backbone",
    "box_head",
    "build",
    "calibrate_batchnorm",
]

SEED = 0
SIZE = 320
"""Images are SIZE x SIZE: the 320 model's transform leaves them as they are."""
CLASSES = 91


def build(seed: int = SEED) -> Any:
    """The whole torchvision detector in eval mode (the eager reference), seeded."""
    torch.manual_seed(seed)
    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None)
    calibrate_batchnorm(model.backbone, torch.rand(4, 3, SIZE, SIZE))
    with torch.no_grad():
        for layer, std in (
            (model.rpn.head.cls_logits, 5e-4),
            (model.rpn.head.bbox_pred, 4e-5),
            (model.roi_heads.box_predictor.cls_score, 8e-4),
            (model.roi_heads.box_predictor.bbox_pred, 1.5e-4),
        ):
            nn.init.normal_(layer.weight, std=std)
            nn.init.normal_(layer.bias, std=std)
    return model.eval()


def calibrate_batchnorm(network: Any, images: Any) -> None:
    """Set every BatchNorm's running statistics to those of ``images``; leaves eval mode on.

    With its initial statistics (mean 0, variance 1) a random MobileNetV3 shrinks its
    activations layer by layer, to ~1e-8 at the FPN; the box head would then see the same
    near-zero regions whatever the image. One pass over random images in train mode gives
    the layers the scale a trained network has (only the BatchNorm layers are in train mode).
    """
    network.eval()  # dropout and stochastic depth stay off: the statistics eval mode will see
    for layer in network.modules():
        if isinstance(layer, nn.modules.batchnorm._BatchNorm):
            layer.reset_running_stats()
            layer.momentum = None  # a cumulative average: this one batch
            layer.train()
    with torch.no_grad():
        network(images)
    network.eval()


class Backbone(nn.Module):  # type: ignore[misc]
    """Stage 1: normalisation, MobileNetV3 + FPN, and the RPN head, flattened as torchvision's
    RPN flattens them (per level: location-major, then anchor)."""

    def __init__(self, detector: Any) -> None:
        super().__init__()
        transform = detector.transform
        self.register_buffer("mean", torch.tensor(transform.image_mean).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(transform.image_std).view(1, 3, 1, 1))
        self.body = detector.backbone
        self.rpn_head = detector.rpn.head

    def forward(self, image: Any) -> tuple[Any, Any, Any]:
        """``(features, objectness, deltas)`` for ``image`` f32[n,3,320,320] in [0, 1]."""
        levels = self.body((image - self.mean) / self.std)
        logits, regressions = self.rpn_head(list(levels.values()))
        n = image.shape[0]
        objectness = torch.cat([lvl.permute(0, 2, 3, 1).reshape(n, -1) for lvl in logits], 1)
        deltas = torch.cat(
            [
                r.view(n, -1, 4, r.shape[2], r.shape[3]).permute(0, 3, 4, 1, 2).reshape(n, -1, 4)
                for r in regressions
            ],
            1,
        )
        return levels["0"], objectness, deltas


class BoxHead(nn.Module):  # type: ignore[misc]
    """Stage 2: the two-layer MLP and the predictor on pooled regions."""

    def __init__(self, detector: Any) -> None:
        super().__init__()
        self.head = detector.roi_heads.box_head
        self.predictor = detector.roi_heads.box_predictor

    def forward(self, rois: Any) -> Any:
        """``(class_logits, box_regression)`` for ``rois`` f32[n,256,7,7]."""
        return self.predictor(self.head(rois))


def backbone(seed: int = SEED) -> Backbone:
    """Stage 1 of the seeded detector."""
    stage = Backbone(build(seed))
    stage.eval()
    return stage


def box_head(seed: int = SEED) -> BoxHead:
    """Stage 2 of the seeded detector."""
    stage = BoxHead(build(seed))
    stage.eval()
    return stage
