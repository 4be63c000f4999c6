"""torchvision's ResNet-50 (random weights from a fixed seed): uint8 HWC image in, top-5 out."""

REQUIRES = ("torch", "torchvision", "torchax")
"""Import names the export needs: the ``torch`` extra and torchvision (``make serve TORCH=1``)."""
