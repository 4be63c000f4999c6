"""A small CNN image classifier on NCHW ``image`` f32[n, 1, 28, 28] -> ``logits`` f32[n, 10]."""
