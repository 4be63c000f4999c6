"""Batched IO drivers: the :class:`InferenceIO` protocol and how a batch is cut into chunks.

An ``InferenceIO`` describes N items; the client cuts them into chunks that fit a pool slot
(or a run of slots), lets ``encode_chunk`` write each chunk's inputs into the slot, sends one
request per chunk, and hands each response to ``decode_chunk``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
import numpy as np
import numpy.typing as npt

from reactantserver.client._staging import StagingPool, StagingSlot
from reactantserver.client._tensors import InferInput
from reactantserver.core.protocol import grpc_service_pb2 as pb

__all__ = [
    "ChunkPlan",
    "InferenceIO",
    "OutputSpec",
    "chunk_plan",
    "chunks",
    "output_specs",
    "zeros_for",
]


def _dims(shape: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


def _dtype(dtype: npt.DTypeLike) -> np.dtype[Any]:
    return np.dtype(dtype)


@attrs.frozen
class OutputSpec:
    """A declared output: name, dtype and the shape of one item's part (batch axis left out)."""

    name: str
    dtype: np.dtype[Any] = attrs.field(converter=_dtype)
    per_item_shape: tuple[int, ...] = attrs.field(converter=_dims)

    @property
    def per_item_bytes(self) -> int:
        """Bytes of one item's part."""
        return math.prod(self.per_item_shape) * int(self.dtype.itemsize)


@runtime_checkable
class InferenceIO(Protocol):
    """N items to infer in chunks; ``output_specs`` is optional (default: none declared)."""

    def __len__(self) -> int:
        """Number of items."""
        ...

    def item_input_bytes(self) -> int:
        """Input bytes of one item (all inputs together)."""
        ...

    def encode_chunk(self, items: range, slot: StagingSlot) -> Sequence[InferInput]:
        """Write the inputs of ``items`` (usually into ``slot``); the request's inputs."""
        ...

    def decode_chunk(self, items: range, response: pb.ModelInferResponse) -> None:
        """Take the results of ``items`` out of ``response``."""
        ...


def output_specs(io: InferenceIO) -> tuple[OutputSpec, ...]:
    """The outputs ``io`` declares (``()`` when it has no ``output_specs``)."""
    declared = getattr(io, "output_specs", None)
    return () if declared is None else tuple(declared())


@attrs.frozen
class ChunkPlan:
    """How a batch is cut: bytes per item, slots per chunk, items per chunk."""

    per_item: int
    span: int
    chunk: int


def chunk_plan(
    item_input_bytes: int,
    outputs: Sequence[OutputSpec],
    pool: StagingPool,
    max_batch_size: int,
) -> ChunkPlan:
    """The geometry of the batched IO drivers.

    ``per_item`` counts the declared outputs too when the pool is SHM (they are written into
    the slot after the inputs); ``span = ceil(per_item / slot_bytes)`` must fit the pool, and
    ``chunk = min(max_batch_size, span * slot_bytes // per_item)``.
    """
    if item_input_bytes < 0:
        raise ValueError(f"item_input_bytes must be >= 0, got {item_input_bytes}")
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    per_item = item_input_bytes
    if pool.shm:
        per_item += sum(spec.per_item_bytes for spec in outputs)
    per_item = max(per_item, 1)
    span = math.ceil(per_item / pool.slot_nbytes)
    if span > pool.n_slots:
        raise ValueError(
            f"one item needs {per_item} bytes ({span} slots of {pool.slot_nbytes}); "
            f"the pool has only {pool.n_slots} slots"
        )
    chunk = min(max_batch_size, span * pool.slot_nbytes // per_item)
    return ChunkPlan(per_item, span, chunk)


def chunks(n_items: int, chunk: int) -> Iterator[range]:
    """Consecutive ranges of at most ``chunk`` items covering ``range(n_items)``."""
    for start in range(0, n_items, chunk):
        yield range(start, min(start + chunk, n_items))


def zeros_for(spec: OutputSpec, n_items: int) -> npt.NDArray[Any]:
    """A zero array shaped like ``n_items`` items of ``spec`` (for dry runs)."""
    return np.zeros((n_items, *spec.per_item_shape), spec.dtype)
