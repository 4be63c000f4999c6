"""A model with two inputs and two outputs: ``a``, ``b`` f32[n, 8] -> ``sum`` f32[n, 8],
``dot`` f32[n, 1]."""
