"""``model.py`` of the ``classifier_hooks`` bundle: the server runs these around the module.

preprocess: client ``image`` u8[n,28,28,3] (NHWC, 0..255) -> ``pixels`` f32[n,3,28,28]
(scaled to [-1, 1], transposed to NCHW). postprocess: ``logits`` f32[n,10] -> the top 3
classes as ``indices`` i64[n,3] and softmax ``scores`` f32[n,3], best first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from reactantserver.core.hooks import NamedTensor, register_model

TOP_K = 3


def preprocess(inputs: list[NamedTensor]) -> list[NamedTensor]:
    """uint8 NHWC image -> normalised float NCHW pixels."""
    (image,) = inputs
    pixels = image.data.astype(np.float32) * (2.0 / 255.0) - 1.0
    return [NamedTensor("pixels", np.ascontiguousarray(pixels.transpose(0, 3, 1, 2)))]


def _softmax(logits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return np.asarray(shifted / shifted.sum(axis=1, keepdims=True))


def postprocess(outputs: list[NamedTensor]) -> list[NamedTensor]:
    """logits -> top-k class indices and their probabilities."""
    (logits,) = outputs
    probabilities = _softmax(logits.data.astype(np.float32))
    # A stable sort of the negated scores keeps ties in class order.
    indices = np.argsort(-probabilities, axis=1, kind="stable")[:, :TOP_K]
    scores = np.take_along_axis(probabilities, indices, axis=1)
    return [
        NamedTensor("indices", indices.astype(np.int64)),
        NamedTensor("scores", scores.astype(np.float32)),
    ]


register_model("classifier_hooks", preprocess=preprocess, postprocess=postprocess)
