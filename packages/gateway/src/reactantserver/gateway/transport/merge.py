"""Merging the answers of a fan-out into one answer.

Pure functions on decoded protobuf messages; the inputs are never modified::

    merged = merge_statistics([await stub(w).ModelStatistics(request) for w in ready])
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import Message

from reactantserver.core.protocol import control_pb2, grpc_service_pb2

__all__ = [
    "is_same_namespace",
    "merge_compact",
    "merge_index",
    "merge_statistics",
]

_UINT64_MAX = (1 << 64) - 1
_READY = "READY"
_DURATION = grpc_service_pb2.StatisticDuration.DESCRIPTOR


def _add(a: int, b: int) -> int:
    """Sum of two uint64 counters, saturated rather than overflowing the field."""
    return min(a + b, _UINT64_MAX)


def _add_durations(into: Message, other: Message) -> None:
    """Add every ``StatisticDuration`` set in ``other`` to the same field of ``into``.

    Generic over the descriptor, so it covers ``InferStatistics``, ``InferBatchStatistics`` and
    ``InferResponseStatistics`` and any duration later added to them.
    """
    for field, value in other.ListFields():
        if field.message_type is _DURATION:
            target = getattr(into, field.name)
            target.count = _add(target.count, value.count)
            target.ns = _add(target.ns, value.ns)


def _add_model(
    into: grpc_service_pb2.ModelStatistics, other: grpc_service_pb2.ModelStatistics
) -> None:
    into.last_inference = max(into.last_inference, other.last_inference)
    into.inference_count = _add(into.inference_count, other.inference_count)
    into.execution_count = _add(into.execution_count, other.execution_count)
    if other.HasField("inference_stats"):
        into.inference_stats.SetInParent()
        _add_durations(into.inference_stats, other.inference_stats)
    for batch in other.batch_stats:
        for mine in into.batch_stats:
            if mine.batch_size == batch.batch_size:
                _add_durations(mine, batch)
                break
        else:
            into.batch_stats.add().CopyFrom(batch)
    into.memory_usage.extend(other.memory_usage)
    for key, response in other.response_stats.items():
        _add_durations(into.response_stats[key], response)


def merge_statistics(
    responses: Sequence[grpc_service_pb2.ModelStatisticsResponse],
) -> grpc_service_pb2.ModelStatisticsResponse:
    """One ``ModelStatisticsResponse`` for the fleet: per (name, version), workers summed.

    Counts and every duration (count and ns) are summed, ``last_inference`` is the maximum,
    ``batch_stats`` are merged by batch size (sorted by it), ``response_stats`` by key, and
    ``memory_usage`` entries are concatenated. Models are sorted by (name, version).
    """
    merged: dict[tuple[str, str], grpc_service_pb2.ModelStatistics] = {}
    for response in responses:
        for stats in response.model_stats:
            key = (stats.name, stats.version)
            mine = merged.get(key)
            if mine is None:
                mine = merged[key] = grpc_service_pb2.ModelStatistics(
                    name=stats.name, version=stats.version
                )
            _add_model(mine, stats)
    out = grpc_service_pb2.ModelStatisticsResponse()
    for key in sorted(merged):
        model = out.model_stats.add()
        model.CopyFrom(merged[key])
        model.batch_stats.sort(key=lambda batch: batch.batch_size)
    return out


def merge_index(
    responses: Sequence[grpc_service_pb2.RepositoryIndexResponse],
) -> grpc_service_pb2.RepositoryIndexResponse:
    """One ``RepositoryIndexResponse``: models merged by name, sorted by name.

    The version is the first worker's; the state (with its reason) is ``READY`` when any
    worker reports it, else the first reported state and reason.
    """
    merged: dict[str, grpc_service_pb2.RepositoryIndexResponse.ModelIndex] = {}
    for response in responses:
        for model in response.models:
            mine = merged.get(model.name)
            if mine is None:
                merged[model.name] = mine = grpc_service_pb2.RepositoryIndexResponse.ModelIndex()
                mine.CopyFrom(model)
            elif model.state == _READY and mine.state != _READY:
                mine.state = model.state
                mine.reason = model.reason
    out = grpc_service_pb2.RepositoryIndexResponse()
    out.models.extend(merged[name] for name in sorted(merged))
    return out


def is_same_namespace(answers: Sequence[bool | None]) -> bool:
    """``IsSameIPCNamespace`` for the fleet: every worker said true (errors count false).

    ``None`` stands for an error or ``UNIMPLEMENTED``; no answers at all is false.
    """
    return bool(answers) and all(answer is True for answer in answers)


def merge_compact(
    responses: Sequence[control_pb2.CompactMemoryResponse],
) -> control_pb2.CompactMemoryResponse:
    """One ``CompactMemoryResponse``: ``reloaded_models`` summed, ``resident_bytes_after`` 0.

    Per-worker residency does not add up to anything meaningful for the fleet, so it is left
    unset.
    """
    return control_pb2.CompactMemoryResponse(
        reloaded_models=sum(response.reloaded_models for response in responses)
    )
