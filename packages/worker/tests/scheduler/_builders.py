"""Small builders shared by the scheduler tests: specs, models, queued requests."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from reactantserver.core.dtypes import DType
from reactantserver.core.manifest import VariableAxis
from reactantserver.core.types import Dim, TensorSpec
from reactantserver.worker.scheduler.model import ProgramKey, ScheduledModel
from reactantserver.worker.scheduler.queue import Completion, FutureCompletion, ModelQueue, Pending

F32 = DType.from_kserve("FP32")

_SEQ = itertools.count()


def spec(name: str, *dims: Dim, dtype: str = "FP32") -> TensorSpec:
    """A declared tensor with a KServe datatype."""
    return TensorSpec(name, DType.from_kserve(dtype), tuple(dims))


def programs(
    sizes: Sequence[int], variants: Iterable[int | None] = (None,)
) -> dict[ProgramKey, Any]:
    """Placeholder programs for every (variant, size) pair."""
    return {(v, s): object() for v in variants for s in sizes}


def scheduled(
    name: str = "m",
    *,
    sizes: Sequence[int] = (1, 2),
    inputs: Sequence[TensorSpec] = (),
    output_axes: Sequence[int | None] = (0,),
    coalescable: bool = True,
    generation: int = 1,
    variants: Iterable[int | None] = (None,),
    variable_axes: Sequence[VariableAxis] = (),
    variant_keys: Mapping[tuple[int, ...], int] | None = None,
    lone_rows: int | None = None,
    max_batch_size: int | None = None,
) -> ScheduledModel:
    """A model generation with placeholder executables."""
    return ScheduledModel(
        name=name,
        generation=generation,
        inputs=tuple(inputs),
        output_axes=tuple(output_axes),
        programs=programs(sizes, variants),
        coalescable=coalescable,
        variable_axes=tuple(variable_axes),
        variant_keys=dict(variant_keys or {}),
        lone_rows=lone_rows,
        max_batch_size=max_batch_size,
    )


def pending(
    model: ScheduledModel,
    *,
    rows: int = 1,
    variant: int | None = None,
    priority: int = 1,
    committed: bool = False,
    enqueue_ns: int = 0,
    deadline_ns: int | None = None,
    completion: Completion | None = None,
) -> Pending:
    """A queued request; ``seq`` follows creation order."""
    return Pending(
        model=model,
        inputs=[np.zeros((rows, 2), np.float32)],
        rows=rows,
        variant=variant,
        priority=priority,
        committed=committed,
        enqueue_ns=enqueue_ns,
        deadline_ns=deadline_ns,
        completion=completion or FutureCompletion(),
        seq=next(_SEQ),
    )


def queue_of(*requests: Pending) -> ModelQueue:
    """A queue holding ``requests`` pushed in the given order."""
    queue = ModelQueue()
    for request in requests:
        queue.push(request)
    return queue
