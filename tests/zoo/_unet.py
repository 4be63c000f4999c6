"""A small U-Net (Ronneberger et al., 2015) in PyTorch: the zoo's segmentation network.

``image`` f32[n,3,h,w] (h, w divisible by 8) -> per-pixel ``logits`` f32[n,classes,h,w]:
three down steps (two 3x3 conv + BatchNorm + ReLU, max-pool), a bottleneck, and three up
steps (transposed conv, concatenation with the skip, two 3x3 convs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["UNet"]


def _double_conv(cin: int, cout: int) -> Any:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):  # type: ignore[misc]
    """Encoder-decoder with skip connections; ``width`` channels at the top level."""

    def __init__(self, classes: int = 4, width: int = 16) -> None:
        super().__init__()
        widths = [width, width * 2, width * 4]
        self.down = nn.ModuleList()
        cin = 3
        for w in widths:
            self.down.append(_double_conv(cin, w))
            cin = w
        self.bottom = _double_conv(cin, cin * 2)
        self.up = nn.ModuleList()
        self.merge = nn.ModuleList()
        cin *= 2
        for w in reversed(widths):
            self.up.append(nn.ConvTranspose2d(cin, w, 2, stride=2))
            self.merge.append(_double_conv(w * 2, w))
            cin = w
        self.head = nn.Conv2d(cin, classes, 1)

    def forward(self, image: Any) -> Any:
        """Per-pixel class logits for ``image``."""
        skips = []
        x = image
        for step in self.down:
            x = step(x)
            skips.append(x)
            x = torch.nn.functional.max_pool2d(x, 2)
        x = self.bottom(x)
        for up, merge, skip in zip(self.up, self.merge, reversed(skips), strict=True):
            x = merge(torch.cat([up(x), skip], dim=1))
        return self.head(x)
