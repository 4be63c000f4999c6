"""A classifier whose hooks live in ``model.py``: uint8 NHWC image in, top-3 classes out."""
