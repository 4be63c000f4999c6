"""``infer_sync`` and ``infer_async``: one request, or a whole batch through an IO driver.

Both run the same flows (``_request``); only the drivers differ. A batch is cut into chunks
(``_io.chunk_plan``); ``infer_sync`` sends them one after another, ``infer_async`` keeps up to
``concurrency`` in flight, each on its own slot of the pool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeGuard, cast

from reactantserver.client._flow import run_async, run_sync
from reactantserver.client._io import ChunkPlan, InferenceIO, chunk_plan, chunks, output_specs
from reactantserver.client._model import KServeModel
from reactantserver.client._request import Call, infer_flow
from reactantserver.client._staging import StagingPool, StagingSlot, natural_align
from reactantserver.client._tensors import InferInput, RequestedOutput
from reactantserver.core.buffer_pool import Slot
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.types import ParameterValue, ShmRef

__all__ = ["infer_async", "infer_sync"]

_NS = 1_000_000_000


def _deadline_ns(model: KServeModel) -> int:
    return time.monotonic_ns() + int(model.deadline * _NS)


def _wanted(outputs: Sequence[str | RequestedOutput] | None) -> list[RequestedOutput]:
    if outputs is None:
        return []
    return [o if isinstance(o, RequestedOutput) else RequestedOutput(o) for o in outputs]


def _is_io(inputs: object) -> TypeGuard[InferenceIO]:
    # A protocol isinstance check costs ~15 us; the common case, a list, skips it.
    return not isinstance(inputs, list | tuple) and isinstance(inputs, InferenceIO)


def _check_inputs(inputs: object) -> Sequence[InferInput]:
    if not isinstance(inputs, Sequence):
        raise TypeError(
            f"inputs must be InferInputs or an InferenceIO, got {type(inputs).__name__}"
        )
    for item in inputs:
        if not isinstance(item, InferInput):
            raise TypeError(f"inputs must be InferInput objects, got {type(item).__name__}")
    return cast("Sequence[InferInput]", inputs)


class _Batch:
    """A batch's fixed parts: the IO object, its plan, pool and declared outputs."""

    def __init__(
        self,
        model: KServeModel,
        io: InferenceIO,
        *,
        outputs: object,
        priority: int,
        request_id: str,
        parameters: Mapping[str, ParameterValue],
    ) -> None:
        if outputs is not None:
            raise ValueError(
                "an InferenceIO declares its outputs with output_specs(), not outputs="
            )
        self.model = model
        self.io = io
        self.pool: StagingPool = model.pool
        self.specs = output_specs(io)
        self.plan: ChunkPlan = chunk_plan(
            io.item_input_bytes(), self.specs, self.pool, model.max_batch_size
        )
        self.deadline_ns = _deadline_ns(model)
        self.priority = priority
        self.request_id = request_id
        self.parameters = parameters

    def ranges(self) -> Iterator[range]:
        return chunks(len(self.io), self.plan.chunk)

    def call(self, items: range, slot: Slot) -> Call:
        """Encode ``items`` into ``slot``; the request that sends them."""
        staging = StagingSlot(slot)
        inputs = _check_inputs(list(self.io.encode_chunk(items, staging)))
        placed: dict[str, ShmRef] = {}
        if self.pool.shm:
            # Outputs fill the slot from its end (largest elements first, so without gaps).
            for spec in sorted(self.specs, key=lambda s: -s.dtype.itemsize):
                nbytes = spec.per_item_bytes * len(items)
                offset = staging.carve_tail(nbytes, align=natural_align(spec.dtype.itemsize))
                placed[spec.name] = ShmRef(self.pool.name, offset, nbytes)
        outputs = [
            RequestedOutput(spec.name, placed[spec.name], self.pool)
            if spec.name in placed
            else RequestedOutput(spec.name)
            for spec in self.specs
        ]
        suffix = f"-{items.start}" if self.request_id else ""
        return Call(
            self.model,
            inputs,
            outputs,
            self.deadline_ns,
            self.priority,
            self.request_id + suffix,
            self.parameters,
        )


def _prepare(
    model: KServeModel,
    inputs: object,
    *,
    outputs: Sequence[str | RequestedOutput] | None,
    priority: int,
    request_id: str,
    parameters: Mapping[str, ParameterValue] | None,
) -> Call | _Batch:
    """What ``infer_sync``/``infer_async`` send: one request, or a batch of chunks."""
    model.check_open()
    params = dict(parameters or {})
    if _is_io(inputs):
        return _Batch(
            model,
            inputs,
            outputs=outputs,
            priority=priority,
            request_id=request_id,
            parameters=params,
        )
    return Call(
        model,
        _check_inputs(inputs),
        _wanted(outputs),
        _deadline_ns(model),
        priority,
        request_id,
        params,
    )


def infer_sync(
    model: KServeModel,
    inputs: Sequence[InferInput] | InferenceIO,
    *,
    outputs: Sequence[str | RequestedOutput] | None = None,
    priority: int = 0,
    request_id: str = "",
    parameters: Mapping[str, ParameterValue] | None = None,
) -> pb.ModelInferResponse | None:
    """Infer on a blocking channel.

    With a list of :class:`InferInput`: one request; the ``ModelInferResponse`` (read outputs
    with :func:`InferOutput`). With an :class:`InferenceIO`: its items in chunks, one after
    another; results go to ``decode_chunk`` and the return value is ``None``.
    """
    plan = _prepare(
        model,
        inputs,
        outputs=outputs,
        priority=priority,
        request_id=request_id,
        parameters=parameters,
    )
    if isinstance(plan, Call):
        return run_sync(infer_flow(plan))
    for items in plan.ranges():
        with plan.pool.acquire(plan.plan.span, plan.deadline_ns) as slot:
            reply = run_sync(infer_flow(plan.call(items, slot)))
            plan.io.decode_chunk(items, reply)
    return None


async def infer_async(
    model: KServeModel,
    inputs: Sequence[InferInput] | InferenceIO,
    *,
    outputs: Sequence[str | RequestedOutput] | None = None,
    priority: int = 0,
    request_id: str = "",
    parameters: Mapping[str, ParameterValue] | None = None,
    concurrency: int | None = None,
) -> pb.ModelInferResponse | None:
    """:func:`infer_sync` on the running loop's ``grpc.aio`` channel.

    An :class:`InferenceIO` runs up to ``concurrency`` chunks at once (default: as many as the
    pool has room for, ``max(1, slots // span)``), each on its own slot; ``encode_chunk`` and
    ``decode_chunk`` run on the loop, one at a time.
    """
    plan = _prepare(
        model,
        inputs,
        outputs=outputs,
        priority=priority,
        request_id=request_id,
        parameters=parameters,
    )
    if isinstance(plan, Call):
        return await run_async(infer_flow(plan))
    if concurrency is None:
        concurrency = max(1, plan.pool.n_slots // plan.plan.span)
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    await _run_batch(plan, concurrency)
    return None


async def _run_batch(batch: _Batch, concurrency: int) -> None:
    pending = batch.ranges()

    async def lane() -> None:
        for items in pending:  # lanes share one iterator: each chunk is taken once
            slot = await batch.pool.acquire_async(batch.plan.span, batch.deadline_ns)
            try:
                reply = await run_async(infer_flow(batch.call(items, slot)))
                batch.io.decode_chunk(items, reply)
            finally:
                slot.release()

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(lane())
    except BaseExceptionGroup as group:
        # The first chunk that failed is the batch's error, as with infer_sync (the other
        # lanes were cancelled because of it).
        raise group.exceptions[0] from None
