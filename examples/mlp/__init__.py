"""A tiny MLP classifier: ``x`` f32[n, 16] -> dense 32 + ReLU -> dense 4 -> ``logits``."""
