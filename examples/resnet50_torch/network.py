"""torchvision's ResNet-50, NCHW: ``image`` f32[n,3,224,224] -> ``logits`` f32[n,1000].

``build`` makes it with random weights from a seed (``weights=None``: nothing is downloaded);
a trained ``state_dict`` replaces them (docs/guides/pytorch.md).
"""

from __future__ import annotations

from typing import Any

import torch
import torchvision

__all__ = ["SEED", "build"]

SEED = 0
"""Default seed of the weights."""


def build(seed: int = SEED) -> Any:
    """ResNet-50 in eval mode with weights from ``seed``."""
    torch.manual_seed(seed)
    return torchvision.models.resnet50(weights=None).eval()
