"""Closed-loop one-row clients for the kit network (stock ``tritonclient.grpc``, threads).

The same windows as every other benchmark (``bench._grpc_load``): each client sends one image
per request to the model ``route`` names and decodes the logits, back to back; a request
counts when its answer lands inside the window::

    load = run_rows(url, lambda: "resnet", arch=FULL, concurrency=16, warmup_s=1,
                    duration_s=4, server_cpu=server.cpu_seconds)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench._grpc_load import (
    _CHANNEL_ARGS,
    CpuSampler,
    Load,
    Route,
    Window,
    closed_loop,
    on_threads,
    run_window,
)
from bench.gpu._resnet import Arch

__all__ = ["run_rows"]


def _client(url: str, route: Route, arch: Arch, window: Window) -> Any:
    import tritonclient.grpc as grpcclient

    def client(i: int) -> None:
        image = np.random.default_rng(i).standard_normal(arch.row_shape()).astype(np.float32)
        tensor = grpcclient.InferInput("image", list(image.shape), "FP32")
        tensor.set_data_from_numpy(image)
        triton = grpcclient.InferenceServerClient(url, channel_args=_CHANNEL_ARGS)

        def check(got: Any) -> None:
            if got is None or tuple(got.shape) != (1, arch.classes):
                raise RuntimeError(f"logits are {got!r}, expected shape (1, {arch.classes})")

        try:
            closed_loop(
                window, i, lambda: triton.infer(route(), [tensor]).as_numpy("logits"), check
            )
        finally:
            triton.close()

    return client


def run_rows(
    url: str,
    route: Route,
    *,
    arch: Arch,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    server_cpu: CpuSampler,
) -> Load:
    """``concurrency`` closed-loop one-image clients for one window."""
    return run_window(
        lambda window: on_threads(concurrency, _client(url, route, arch, window)),
        model="resnet",
        concurrency=concurrency,
        client="threads",
        warmup_s=warmup_s,
        duration_s=duration_s,
        server_cpu=server_cpu,
    )
