"""A Flax NNX ResNet-18 (random weights from a fixed seed): uint8 NHWC image in, top-5 out."""

REQUIRES = ("flax",)
"""Import names the export needs beyond the base install (``make install`` brings flax)."""
