"""Boundary types shared by worker, gateway and client.

Transport code turns wire messages into these (:mod:`reactantserver.core.codec`); nothing
below the transport sees a protobuf message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import attrs

from reactantserver.core.dtypes import DType
from reactantserver.core.hooks import NamedTensor

__all__ = [
    "Batch",
    "Dim",
    "Fixed",
    "InferRequest",
    "InferResponse",
    "OutputRequest",
    "ParameterValue",
    "ShmRef",
    "TensorSpec",
    "Variable",
]

ParameterValue: TypeAlias = bool | int | float | str


@attrs.frozen
class ShmRef:
    """A byte range of a registered system shared-memory region."""

    region: str
    offset: int
    byte_size: int


@attrs.frozen
class OutputRequest:
    """One requested output; ``shm`` set when the client wants it written into a region."""

    name: str
    shm: ShmRef | None = None


@attrs.define
class InferRequest:
    """A decoded inference request.

    ``deadline_ns`` is absolute ``time.monotonic_ns()`` (``None`` = no deadline);
    ``priority`` 0 = unset; ``parameters`` holds the request parameters not consumed by
    decoding; ``leases`` are released (called) when the request finishes, e.g. to end the
    shared-memory mappings its inputs view.
    """

    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: list[NamedTensor] = attrs.Factory(list)
    outputs: list[OutputRequest] = attrs.Factory(list)
    deadline_ns: int | None = None
    priority: int = 0
    parameters: dict[str, ParameterValue] = attrs.Factory(dict)
    leases: list[Callable[[], None]] = attrs.Factory(list)

    def release(self) -> None:
        """Release every lease once (idempotent)."""
        leases, self.leases = self.leases, []
        for lease in leases:
            lease()


@attrs.frozen
class InferResponse:
    """The result of one request: its outputs, in the order they go on the wire."""

    model_name: str
    model_version: str = "1"
    id: str = ""
    outputs: list[NamedTensor] = attrs.Factory(list)


@attrs.frozen
class Fixed:
    """An axis of a fixed extent."""

    size: int


@attrs.frozen
class Batch:
    """The batch axis (letter ``n``): coalescing concatenates along it."""


@attrs.frozen
class Variable:
    """An axis whose extent is chosen per variant (``dims`` value ``-1``)."""


Dim: TypeAlias = Fixed | Batch | Variable


@attrs.frozen
class TensorSpec:
    """A declared tensor: name, element type and row-major axes."""

    name: str
    dtype: DType
    shape: tuple[Dim, ...]

    @property
    def batch_axis(self) -> int | None:
        """0-based row-major position of the batch axis, or ``None``."""
        for i, dim in enumerate(self.shape):
            if isinstance(dim, Batch):
                return i
        return None

    @property
    def wire_shape(self) -> list[int]:
        """The shape as ModelMetadata reports it: ``-1`` for batch and variable axes."""
        return [dim.size if isinstance(dim, Fixed) else -1 for dim in self.shape]
