"""What a model takes and returns, as its metadata describes it."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from reactantserver.core.dtypes import DType
from reactantserver.core.protocol import grpc_service_pb2 as pb

__all__ = ["ModelIOSpec", "TensorInfo"]


@attrs.frozen
class TensorInfo:
    """One input or output: name, KServe datatype, shape (``-1`` = any extent, e.g. batch)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype[Any]:
        """The NumPy dtype of the datatype (``object`` for BYTES)."""
        member = DType.from_kserve(self.datatype)
        return np.dtype(object) if member is DType.BYTES else member.numpy


@attrs.frozen
class ModelIOSpec:
    """A model's name, platform, versions and tensors, in metadata order."""

    name: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    platform: str = ""
    versions: tuple[str, ...] = ()

    @classmethod
    def from_metadata(cls, msg: pb.ModelMetadataResponse) -> ModelIOSpec:
        """The spec a ``ModelMetadataResponse`` carries."""
        return cls(
            name=msg.name,
            inputs=tuple(TensorInfo(t.name, t.datatype, tuple(t.shape)) for t in msg.inputs),
            outputs=tuple(TensorInfo(t.name, t.datatype, tuple(t.shape)) for t in msg.outputs),
            platform=msg.platform,
            versions=tuple(msg.versions),
        )

    def input(self, name: str) -> TensorInfo:
        """The input called ``name`` (``KeyError`` if none)."""
        return _find(self.inputs, name, "input")

    def output(self, name: str) -> TensorInfo:
        """The output called ``name`` (``KeyError`` if none)."""
        return _find(self.outputs, name, "output")


def _find(tensors: tuple[TensorInfo, ...], name: str, kind: str) -> TensorInfo:
    for tensor in tensors:
        if tensor.name == name:
            return tensor
    raise KeyError(f"no {kind} {name!r} (have {[t.name for t in tensors]})")
