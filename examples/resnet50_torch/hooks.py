"""``model.py`` of the ``resnet50_torch`` bundle: the server runs these around the module.

preprocess: client ``image`` u8[n,224,224,3] (RGB, HWC, 0..255) -> ``image``
f32[n,3,224,224], normalised with the ImageNet mean and standard deviation and transposed to
NCHW, the layout torchvision models take. postprocess: ``logits`` f32[n,1000] -> the top 5
classes as ``indices`` i64[n,5] and their softmax ``scores`` f32[n,5], best first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from reactantserver.core.hooks import NamedTensor, register_model

TOP_K = 5
MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255.0
STD = np.array([0.229, 0.224, 0.225], np.float32) * 255.0


def preprocess(inputs: list[NamedTensor]) -> list[NamedTensor]:
    """uint8 RGB HWC images -> normalised float NCHW."""
    (image,) = inputs
    pixels = (image.data.astype(np.float32) - MEAN) / STD
    return [NamedTensor("image", np.ascontiguousarray(pixels.transpose(0, 3, 1, 2)))]


def _softmax(logits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return np.asarray(shifted / shifted.sum(axis=1, keepdims=True))


def postprocess(outputs: list[NamedTensor]) -> list[NamedTensor]:
    """logits -> the top-5 class indices and their probabilities."""
    (logits,) = outputs
    probabilities = _softmax(logits.data.astype(np.float32))
    indices = np.argsort(-probabilities, axis=1, kind="stable")[:, :TOP_K]
    scores = np.take_along_axis(probabilities, indices, axis=1)
    return [
        NamedTensor("indices", indices.astype(np.int64)),
        NamedTensor("scores", scores.astype(np.float32)),
    ]


register_model("resnet50_torch", preprocess=preprocess, postprocess=postprocess)
