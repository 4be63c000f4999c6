"""An object detector as a meta model: torchvision's Faster R-CNN (MobileNetV3-Large FPN, 320)
split into two compiled stages joined by Python glue."""

REQUIRES = ("torch", "torchvision", "torchax")
"""Import names the export needs: the ``torch`` extra and torchvision (``make serve TORCH=1``)."""
