"""Thin Pythonic client for ReactantServer and any KServe V2 / Triton gRPC server.

::

    import numpy as np
    from reactantserver.client import InferInput, InferOutput, KServeModel, infer_sync

    with KServeModel("grpc://127.0.0.1:8001", "mlp") as model:
        response = infer_sync(model, [InferInput("x", np.ones((2, 4), np.float32))])
        y = InferOutput(response, "y")

No jax: it needs only ``reactantserver-core`` and ``grpcio``, and shares a process with
``tritonclient`` without descriptor clashes.
"""

from __future__ import annotations

from importlib.metadata import version as _version

from reactantserver.client._infer import infer_async, infer_sync
from reactantserver.client._io import ChunkPlan, InferenceIO, OutputSpec, chunk_plan
from reactantserver.client._lifecycle import register_region, shutdown, unregister_region
from reactantserver.client._model import KServeModel
from reactantserver.client._region import ShmRegion, create_region
from reactantserver.client._retry import RetryPolicy
from reactantserver.client._spec import ModelIOSpec, TensorInfo
from reactantserver.client._staging import StagingPool, StagingSlot
from reactantserver.client._tensors import InferInput, InferOutput, RequestedOutput
from reactantserver.client._url import Target, parse_url
from reactantserver.client._validate import manifest_io_spec, validate_io

__version__ = _version("reactantserver-client")

__all__ = [
    "ChunkPlan",
    "InferInput",
    "InferOutput",
    "InferenceIO",
    "KServeModel",
    "ModelIOSpec",
    "OutputSpec",
    "RequestedOutput",
    "RetryPolicy",
    "ShmRegion",
    "StagingPool",
    "StagingSlot",
    "Target",
    "TensorInfo",
    "__version__",
    "chunk_plan",
    "create_region",
    "infer_async",
    "infer_sync",
    "manifest_io_spec",
    "parse_url",
    "register_region",
    "shutdown",
    "unregister_region",
    "validate_io",
]
