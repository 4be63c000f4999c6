"""``model.py`` of the meta bundle ``detector``: Faster R-CNN's data-dependent steps in NumPy.

``image`` f32[3,320,320] (RGB in [0, 1]) -> ``detector_backbone`` -> proposals (anchors,
decoding, top-k per level, clipping, NMS per level, the best 150) -> RoIAlign of each proposal
into a ``call.scratch`` buffer -> ``detector_head`` on those regions -> per-class boxes,
score threshold, NMS per class, the best 100 -> ``boxes`` f32[m,4] (x1, y1, x2, y2 in pixels),
``scores`` f32[m], ``labels`` i64[m]. Every step follows torchvision's eval-mode
``FasterRCNN`` with the settings of ``fasterrcnn_mobilenet_v3_large_320_fpn``, so the output
matches the eager model's (docs/guides/detector.md).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from reactantserver.core.hooks import (
    InvalidArgumentError,
    MetaCall,
    NamedTensor,
    register_meta_model,
)

Array = np.ndarray[Any, Any]

SIZE = 320
ANCHOR_SIZES = (32.0, 64.0, 128.0, 256.0, 512.0)
ASPECT_RATIOS = (0.5, 1.0, 2.0)
GRIDS = (10, 10, 5)
"""The RPN's feature levels ('0', '1', 'pool') are 10x10, 10x10 and 5x5 for a 320 image."""
PRE_NMS_TOP_N = 150
POST_NMS_TOP_N = 150
RPN_NMS = 0.7
RPN_SCORE = 0.05
RPN_MIN_SIZE = 1e-3
POOL = 7
SAMPLING = 2
SPATIAL_SCALE = 1.0 / 32.0
"""Both 10x10 levels sit at stride 32, so torchvision's level mapper sends every region to '0'."""
BOX_WEIGHTS = (10.0, 10.0, 5.0, 5.0)
BOX_SCORE = 0.05
BOX_NMS = 0.5
BOX_MIN_SIZE = 1e-2
DETECTIONS = 100
CHANNELS = 256
CLIP = math.log(1000.0 / 16)


def anchors() -> Array:
    """Every anchor, f32[3375,4]: per level, location-major (row, then column), then the 15
    (ratio, size) pairs ratio-major, as torchvision's ``AnchorGenerator`` lays them out."""
    scales = np.array(ANCHOR_SIZES, np.float32)
    h_ratios = np.sqrt(np.array(ASPECT_RATIOS, np.float32))
    ws = ((1 / h_ratios)[:, None] * scales[None, :]).reshape(-1)
    hs = (h_ratios[:, None] * scales[None, :]).reshape(-1)
    base = np.round(np.stack([-ws, -hs, ws, hs], axis=1) / 2)
    out = []
    for grid in GRIDS:
        stride = SIZE // grid
        ys, xs = np.meshgrid(np.arange(grid) * stride, np.arange(grid) * stride, indexing="ij")
        shifts = np.stack([xs, ys, xs, ys], axis=-1).reshape(-1, 1, 4).astype(np.float32)
        out.append((shifts + base[None]).reshape(-1, 4))
    return np.concatenate(out).astype(np.float32)


ANCHORS = anchors()
LEVEL_SIZES = [g * g * len(ANCHOR_SIZES) * len(ASPECT_RATIOS) for g in GRIDS]


def decode(deltas: Array, boxes: Array, weights: tuple[float, ...]) -> Array:
    """torchvision's ``BoxCoder.decode``: deltas f32[k,c*4] against boxes f32[k,4] -> f32[k,c,4]."""
    widths = boxes[:, 2] - boxes[:, 0]
    heights = boxes[:, 3] - boxes[:, 1]
    ctr_x = boxes[:, 0] + 0.5 * widths
    ctr_y = boxes[:, 1] + 0.5 * heights
    wx, wy, ww, wh = weights
    dx = deltas[:, 0::4] / wx
    dy = deltas[:, 1::4] / wy
    dw = np.minimum(deltas[:, 2::4] / ww, CLIP)
    dh = np.minimum(deltas[:, 3::4] / wh, CLIP)
    px = dx * widths[:, None] + ctr_x[:, None]
    py = dy * heights[:, None] + ctr_y[:, None]
    pw = np.exp(dw) * widths[:, None]
    ph = np.exp(dh) * heights[:, None]
    out = np.stack([px - 0.5 * pw, py - 0.5 * ph, px + 0.5 * pw, py + 0.5 * ph], axis=2)
    return out.astype(np.float32)


def clip(boxes: Array) -> Array:
    """Boxes clamped to the image."""
    return np.clip(boxes, 0.0, float(SIZE))


def big_enough(boxes: Array, min_size: float) -> Array:
    """Indices of the boxes at least ``min_size`` wide and high."""
    return np.flatnonzero(
        ((boxes[:, 2] - boxes[:, 0]) >= min_size) & ((boxes[:, 3] - boxes[:, 1]) >= min_size)
    )


def nms(boxes: Array, scores: Array, threshold: float) -> Array:
    """Greedy non-maximum suppression: indices kept, by decreasing score."""
    order = np.argsort(-scores, kind="stable")
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep = []
    while order.size:
        best, rest = order[0], order[1:]
        keep.append(best)
        xx1 = np.maximum(boxes[best, 0], boxes[rest, 0])
        yy1 = np.maximum(boxes[best, 1], boxes[rest, 1])
        xx2 = np.minimum(boxes[best, 2], boxes[rest, 2])
        yy2 = np.minimum(boxes[best, 3], boxes[rest, 3])
        inter = np.clip(xx2 - xx1, 0, None) * np.clip(yy2 - yy1, 0, None)
        iou = inter / (areas[best] + areas[rest] - inter)
        order = rest[~(iou > threshold)]
    return np.array(keep, np.int64)


def batched_nms(boxes: Array, scores: Array, groups: Array, threshold: float) -> Array:
    """NMS within each group: indices kept, by decreasing score."""
    keep = [
        np.flatnonzero(groups == g)[nms(boxes[groups == g], scores[groups == g], threshold)]
        for g in np.unique(groups)
    ]
    kept = np.concatenate(keep) if keep else np.zeros(0, np.int64)
    return kept[np.argsort(-scores[kept], kind="stable")]


def proposals(objectness: Array, deltas: Array) -> Array:
    """The RPN's filtered proposals for one image, f32[k,4] (k <= 150), best first."""
    picked, levels = [], []
    start = 0
    for number, count in enumerate(LEVEL_SIZES):
        scores = objectness[start : start + count]
        top = np.argsort(-scores, kind="stable")[: min(PRE_NMS_TOP_N, count)]
        picked.append(top + start)
        levels.append(np.full(top.size, number))
        start += count
    index = np.concatenate(picked)
    boxes = clip(decode(deltas[index], ANCHORS[index], (1.0, 1.0, 1.0, 1.0))[:, 0])
    scores = 1.0 / (1.0 + np.exp(-objectness[index].astype(np.float64)))
    level = np.concatenate(levels)
    keep = big_enough(boxes, RPN_MIN_SIZE)
    keep = keep[scores[keep] >= RPN_SCORE]
    kept = keep[batched_nms(boxes[keep], scores[keep], level[keep], RPN_NMS)]
    return np.ascontiguousarray(boxes[kept[:POST_NMS_TOP_N]])


def _axis_weights(start: Array, length: Array, extent: int) -> Array:
    """RoIAlign's bilinear weights along one axis, f32[k, POOL, extent], averaged over the
    SAMPLING points of each bin (torchvision's ``roi_align``, ``aligned=False``)."""
    bin_size = np.maximum(length, 1.0) / POOL
    steps = np.arange(POOL)[None, :, None] + (np.arange(SAMPLING)[None, None, :] + 0.5) / SAMPLING
    pos = start[:, None, None] + steps * bin_size[:, None, None]
    valid = (pos >= -1.0) & (pos <= extent)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    at_edge = low >= extent - 1
    low = np.where(at_edge, extent - 1, low)
    high = np.where(at_edge, extent - 1, low + 1)
    frac = np.where(at_edge, 0.0, pos - low)
    weights = np.zeros((start.shape[0], POOL, extent), np.float32)
    k, p, _ = np.indices(pos.shape)
    np.add.at(weights, (k, p, low), np.where(valid, 1.0 - frac, 0.0) / SAMPLING)
    np.add.at(weights, (k, p, high), np.where(valid, frac, 0.0) / SAMPLING)
    return weights


def roi_align(features: Array, boxes: Array, out: Array) -> None:
    """RoIAlign of ``boxes`` f32[k,4] on ``features`` f32[256,h,w] into ``out`` f32[k,256,7,7].

    Bilinear sampling is separable, so each region is two small weight matrices (rows and
    columns) and the pooling one contraction."""
    scaled = boxes * SPATIAL_SCALE
    wy = _axis_weights(scaled[:, 1], scaled[:, 3] - scaled[:, 1], features.shape[1])
    wx = _axis_weights(scaled[:, 0], scaled[:, 2] - scaled[:, 0], features.shape[2])
    np.einsum("kph,chw,kqw->kcpq", wy, features, wx, out=out, optimize=True)


def detections(logits: Array, regression: Array, boxes: Array) -> tuple[Array, Array, Array]:
    """torchvision's ``postprocess_detections`` for one image: boxes, scores, labels."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=1, keepdims=True)
    per_class = clip(decode(regression, boxes, BOX_WEIGHTS))[:, 1:].reshape(-1, 4)
    scores = probabilities[:, 1:].reshape(-1)
    labels = np.tile(np.arange(1, logits.shape[1]), boxes.shape[0])
    keep = np.flatnonzero(scores > BOX_SCORE)
    keep = keep[big_enough(per_class[keep], BOX_MIN_SIZE)]
    kept = keep[batched_nms(per_class[keep], scores[keep], labels[keep], BOX_NMS)][:DETECTIONS]
    return per_class[kept], scores[kept].astype(np.float32), labels[kept].astype(np.int64)


def run(inputs: list[NamedTensor], call: MetaCall) -> list[NamedTensor]:
    """Detect objects in one image."""
    (image,) = inputs
    if image.shape != (3, SIZE, SIZE):
        raise InvalidArgumentError(f"image must be f32[3,{SIZE},{SIZE}], got {image.shape}")
    features, objectness, deltas = call(
        "detector_backbone", [NamedTensor("image", image.data[None])]
    )
    regions = proposals(objectness.data[0], deltas.data[0])
    if regions.shape[0] == 0:
        empty = np.zeros(0, np.float32)
        return [
            NamedTensor("boxes", np.zeros((0, 4), np.float32)),
            NamedTensor("scores", empty),
            NamedTensor("labels", np.zeros(0, np.int64)),
        ]
    # The pooled regions are the large intermediate (up to 150 x 256 x 7 x 7 floats, 7.5 MB):
    # a buffer from the worker's scratch pool, handed to the head by reference.
    pooled = call.scratch((regions.shape[0], CHANNELS, POOL, POOL), np.float32)
    roi_align(features.data[0], regions, pooled)
    logits, regression = call("detector_head", [NamedTensor("rois", pooled)])
    boxes, scores, labels = detections(logits.data, regression.data, regions)
    return [
        NamedTensor("boxes", np.ascontiguousarray(boxes, np.float32)),
        NamedTensor("scores", scores),
        NamedTensor("labels", labels),
    ]


register_meta_model("detector", run=run)
