"""The model zoo: each entry builds a framework model with seeded random weights, exports it,
and gives its eager reference.

Every family comes in f32 and bf16 (parity bounds below). A bf16 entry computes in bf16 with
bf16 weights but keeps the client's tensors in f32: the input is cast to bf16 and the output
back to f32 inside the exported function, as a deployment would do. ``REACTANT_ZOO_FULL=1``
uses the full input sizes (224x224 images, U-Net 256x256, 128 tokens); CI runs the small ones
(64x64, ViT-B/16 at 32x32, 32 tokens), which compile and run the same graphs in a fraction of
the time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import attrs
import numpy as np

__all__ = ["BATCH_SIZES", "FULL", "SEED", "ZooModel", "flax_zoo", "torch_zoo"]

SEED = 0
BATCH_SIZES = (1, 8, 32)
FULL = os.environ.get("REACTANT_ZOO_FULL") == "1"
"""Full input sizes (the benchmark's), else the small CI sizes."""
F32_TOLERANCE = 1e-4
"""f32 parity: max |served - eager| <= F32_TOLERANCE * max |eager|, per output and batch size.

Relative to the output's scale because random weights give logits anywhere from 1e-1 to 1e3.
"""
BF16_FLOOR = 5e-2
BF16_FACTOR = 3.0
"""bf16 parity: the served bf16 output is compared with the framework's *f32* eager output and
may be off by max(BF16_FLOOR, BF16_FACTOR x the framework's own bf16 error) x max |eager|,
where the framework's own bf16 error is max |eager bf16 - eager f32| / max |eager f32| on the
same input. Random CNNs whose BatchNorm statistics make every layer unit-scale amplify bf16
rounding layer by layer: PyTorch's own bf16 ResNet-50 is ~30% off its f32 output, MobileNetV3
and EfficientNet-B0 ~10%, so a fixed bound would measure the random weights, not the export.
Where bf16 is well-behaved (ViT, U-Net, ConvNeXt, the Flax models: ~1%) the floor applies."""

Dtype = Literal["f32", "bf16"]


@attrs.frozen
class ZooModel:
    """One exported zoo bundle: ``family`` at ``dtype``, named ``<family>_<dtype>``."""

    family: str
    framework: Literal["torch", "flax"]
    dtype: Dtype
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    export: Callable[[Path], Path]
    """Writes the bundle into the model directory it is given; returns its path."""
    eager: Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]
    """The framework's own eager output (f32 NumPy) for one input batch, at ``dtype``."""
    eager_f32: Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]
    """The same model's eager output in f32 (``eager`` itself for an f32 entry)."""

    @property
    def name(self) -> str:
        """The bundle (model) name."""
        return f"{self.family}_{self.dtype}"

    def tolerance(self, x: np.ndarray[Any, Any]) -> float:
        """The parity bound for input ``x`` against :attr:`eager_f32`, relative to the
        output's largest magnitude."""
        if self.dtype == "f32":
            return F32_TOLERANCE
        want = self.eager_f32(x)
        own = float(np.abs(self.eager(x) - want).max() / np.abs(want).max())
        return max(BF16_FLOOR, BF16_FACTOR * own)


def _size(small: int, full: int = 224) -> int:
    return full if FULL else small


def _torch_models() -> dict[str, tuple[Callable[[], Any], str, str]]:
    """family -> (factory, input spec, output spec)."""
    import timm
    import torch
    import torchvision

    from examples.detector.network import calibrate_batchnorm
    from tests.zoo._unet import UNet

    def seeded(factory: Callable[[], Any], size: int) -> Callable[[], Any]:
        def build() -> Any:
            torch.manual_seed(SEED)
            model = factory()
            # Random weights with the initial BatchNorm statistics shrink the activations
            # to ~1e-10 (MobileNetV3, EfficientNet), and ViT's head starts at zero: give
            # every model outputs on the scale a trained one has, so parity means something.
            calibrate_batchnorm(model, torch.rand(4, 3, size, size) * 2 - 1)
            head = getattr(getattr(model, "heads", None), "head", None)
            if head is not None:
                torch.nn.init.normal_(head.weight, std=0.02)
            return model.eval()

        return build

    def vision(name: str, size: int, **kwargs: Any) -> Callable[[], Any]:
        return seeded(lambda: getattr(torchvision.models, name)(weights=None, **kwargs), size)

    def image(size: int) -> str:
        return f"image=f32[n,c=3,h={size},w={size}]"

    small, vit, unet = _size(64), _size(32), _size(64, 256)
    logits = "logits=f32[n,k=1000]"
    return {
        "resnet50": (vision("resnet50", small), image(small), logits),
        "mobilenet_v3": (vision("mobilenet_v3_large", small), image(small), logits),
        "efficientnet_b0": (vision("efficientnet_b0", small), image(small), logits),
        "vit_b_16": (vision("vit_b_16", vit, image_size=vit), image(vit), logits),
        "unet": (seeded(UNet, unet), image(unet), f"logits=f32[n,k=4,h={unet},w={unet}]"),
        "timm_convnext_atto": (
            seeded(lambda: timm.create_model("convnext_atto", pretrained=False), small),
            image(small),
            logits,
        ),
    }


def _torch_entry(family: str, dtype: Dtype) -> ZooModel:
    import torch

    from reactantserver.export import export_torch

    factory, spec, output = _torch_models()[family]

    class Bf16(torch.nn.Module):  # type: ignore[misc]
        """The model in bf16 behind an f32 input and output."""

        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model.to(torch.bfloat16)

        def forward(self, x: Any) -> Any:
            return self.model(x.to(torch.bfloat16)).float()

    def build() -> Any:
        return Bf16(factory()).eval() if dtype == "bf16" else factory()

    def export(models: Path) -> Path:
        return export_torch(
            build,
            [spec],
            [output],
            batch_sizes=BATCH_SIZES,
            out=models / f"{family}_{dtype}",
            force=True,
            progress=False,
        )

    def runner(make: Callable[[], Any]) -> Callable[[np.ndarray[Any, Any]], np.ndarray[Any, Any]]:
        built: list[Any] = []

        def eager(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
            if not built:
                built.append(make())
            with torch.no_grad():
                out = built[0](torch.from_numpy(np.ascontiguousarray(x)))
            return np.asarray(out.float().numpy())

        return eager

    eager = runner(build)
    eager_f32 = runner(factory) if dtype == "bf16" else eager
    return ZooModel(family, "torch", dtype, (spec,), (output,), export, eager, eager_f32)


def torch_zoo() -> list[ZooModel]:
    """The PyTorch entries (torchvision, timm and the U-Net), f32 and bf16."""
    return [_torch_entry(family, dtype) for family in _torch_models() for dtype in ("f32", "bf16")]


def _flax_entry(family: str, dtype: Dtype) -> ZooModel:
    import jax
    import jax.numpy as jnp

    from examples.resnet18_flax.network import resnet18
    from reactantserver.export import export_flax, export_jax, flax_function
    from tests.zoo._encoder import encoder

    if family == "resnet18_flax":
        size = _size(64)
        model: Any = resnet18(SEED)
        spec, output = f"image=f32[n,h={size},w={size},c=3]", "logits=f32[n,k=1000]"
    else:
        length = _size(32, 128)
        model = encoder(SEED, length)
        spec, output = f"tokens=i32[n,l={length}]", "logits=f32[n,k=10]"
    out_name = f"{family}_{dtype}"
    fn, params = flax_function(model)

    def as_bf16(value: Any) -> Any:
        floating = jnp.issubdtype(value.dtype, jnp.floating)
        return value.astype(jnp.bfloat16) if floating else value

    params16 = jax.tree.map(as_bf16, params)

    def forward16(values: Any, x: Any) -> Any:
        return fn(values, as_bf16(x)).astype(jnp.float32)

    def export(models: Path) -> Path:
        if dtype == "f32":
            return export_flax(
                model,
                [spec],
                [output],
                batch_sizes=BATCH_SIZES,
                out=models / out_name,
                force=True,
                progress=False,
            )
        return export_jax(
            forward16,
            params16,
            [spec],
            [output],
            batch_sizes=BATCH_SIZES,
            out=models / out_name,
            force=True,
            progress=False,
        )

    def eager_f32(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        # NNX modules run op by op outside jit: the framework's eager mode.
        return np.asarray(model(jnp.asarray(x)), np.float32)

    def eager16(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.asarray(forward16(params16, jnp.asarray(x)), np.float32)

    eager = eager_f32 if dtype == "f32" else eager16
    return ZooModel(family, "flax", dtype, (spec,), (output,), export, eager, eager_f32)


def flax_zoo() -> list[ZooModel]:
    """The Flax NNX entries (ResNet-18 and a transformer encoder), f32 and bf16."""
    return [
        _flax_entry(family, dtype)
        for family in ("resnet18_flax", "encoder_flax")
        for dtype in ("f32", "bf16")
    ]
