"""Inference through the gateway with the stock client: the same answers as from a worker."""

from __future__ import annotations

from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient


def test_infer_mlp_through_the_gateway(client: Any) -> None:
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("mlp", [inp])
    assert result.as_numpy("logits").shape[0] == 3
