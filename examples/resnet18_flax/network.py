"""ResNet in Flax NNX (He et al., 2015), NHWC: ``image`` f32[n,h,w,3] -> ``logits`` f32[n,k].

``resnet18`` and ``resnet50`` build the usual depths with random weights from a seed (nothing
is downloaded); ``ResNet`` takes any stage sizes. A trained checkpoint replaces the weights
(docs/guides/flax.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flax import nnx

__all__ = ["CLASSES", "SEED", "ResNet", "forward", "resnet18", "resnet50"]

CLASSES = 1000
SEED = 0
"""Default seed of the weights."""


def _conv(cin: int, cout: int, kernel: int, stride: int, rngs: nnx.Rngs) -> nnx.Conv:
    return nnx.Conv(
        cin,
        cout,
        (kernel, kernel),
        strides=(stride, stride),
        padding=[(kernel // 2, kernel // 2)] * 2,
        use_bias=False,
        rngs=rngs,
    )


class BasicBlock(nnx.Module):  # type: ignore[misc]
    """Two 3x3 convolutions with a shortcut (ResNet-18/34)."""

    expansion = 1

    def __init__(self, cin: int, width: int, stride: int, rngs: nnx.Rngs) -> None:
        self.conv1 = _conv(cin, width, 3, stride, rngs)
        self.bn1 = nnx.BatchNorm(width, rngs=rngs)
        self.conv2 = _conv(width, width, 3, 1, rngs)
        self.bn2 = nnx.BatchNorm(width, rngs=rngs)
        self.down = _shortcut(cin, width, stride, rngs)

    def __call__(self, x: Any) -> Any:
        """The block's output for ``x`` f32[n,h,w,cin]."""
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return nnx.relu(y + (x if self.down is None else self.down(x)))


class Bottleneck(nnx.Module):  # type: ignore[misc]
    """1x1 reduce, 3x3, 1x1 expand (x4), with a shortcut (ResNet-50 and deeper)."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int, rngs: nnx.Rngs) -> None:
        self.conv1 = _conv(cin, width, 1, 1, rngs)
        self.bn1 = nnx.BatchNorm(width, rngs=rngs)
        self.conv2 = _conv(width, width, 3, stride, rngs)
        self.bn2 = nnx.BatchNorm(width, rngs=rngs)
        self.conv3 = _conv(width, width * 4, 1, 1, rngs)
        self.bn3 = nnx.BatchNorm(width * 4, rngs=rngs)
        self.down = _shortcut(cin, width * 4, stride, rngs)

    def __call__(self, x: Any) -> Any:
        """The block's output for ``x`` f32[n,h,w,cin]."""
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = nnx.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return nnx.relu(y + (x if self.down is None else self.down(x)))


class _Shortcut(nnx.Module):  # type: ignore[misc]
    def __init__(self, cin: int, cout: int, stride: int, rngs: nnx.Rngs) -> None:
        self.conv = _conv(cin, cout, 1, stride, rngs)
        self.bn = nnx.BatchNorm(cout, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.bn(self.conv(x))


def _shortcut(cin: int, cout: int, stride: int, rngs: nnx.Rngs) -> _Shortcut | None:
    return _Shortcut(cin, cout, stride, rngs) if stride != 1 or cin != cout else None


class ResNet(nnx.Module):  # type: ignore[misc]
    """A ResNet: 7x7 stem, max-pool, four stages of ``block``, global mean, dense head."""

    def __init__(
        self,
        stage_sizes: Sequence[int],
        block: type[BasicBlock] | type[Bottleneck],
        *,
        classes: int = CLASSES,
        rngs: nnx.Rngs,
    ) -> None:
        self.stem = _conv(3, 64, 7, 2, rngs)
        self.stem_bn = nnx.BatchNorm(64, rngs=rngs)
        blocks: list[Any] = []
        cin = 64
        for stage, count in enumerate(stage_sizes):
            width = 64 * 2**stage
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(block(cin, width, stride, rngs))
                cin = width * block.expansion
        self.blocks = nnx.List(blocks)
        self.head = nnx.Linear(cin, classes, rngs=rngs)

    def __call__(self, image: Any) -> Any:
        """Logits f32[n, classes] for a normalised ``image`` f32[n,h,w,3]."""
        x = nnx.relu(self.stem_bn(self.stem(image)))
        x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(axis=(1, 2)))


def resnet18(seed: int = SEED, classes: int = CLASSES) -> ResNet:
    """ResNet-18 with random weights from ``seed``, in eval mode."""
    model = ResNet((2, 2, 2, 2), BasicBlock, classes=classes, rngs=nnx.Rngs(seed))
    model.eval()
    return model


def resnet50(seed: int = SEED, classes: int = CLASSES) -> ResNet:
    """ResNet-50 with random weights from ``seed``, in eval mode."""
    model = ResNet((3, 4, 6, 3), Bottleneck, classes=classes, rngs=nnx.Rngs(seed))
    model.eval()
    return model


def forward(model: ResNet, image: Any) -> Any:
    """``model(image)``: the eager reference the tests compare the served bundle with."""
    return model(image)
