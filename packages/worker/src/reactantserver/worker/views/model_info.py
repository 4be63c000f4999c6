"""Model descriptions for the inference service: metadata, config, repository index, statistics.

Pure functions from registry entries (and the counters the caller read) to the generated
KServe/Triton messages. The
gRPC handlers resolve names and read live state; nothing here touches grpc or the scheduler::

    entry = state.registry.find(name, version)
    response = model_config(
        entry,
        platform=runtime.platform,
        device_ordinal=0,
        max_queue_depth=256,
        effective_max_batch=entry.scheduled.max_batch,
        residency="PINNED_DEVICE",
        weight_bytes=entry.loaded.weight_nbytes,
    )

Choices made here:

- ``platform`` is the backend platform (``cpu``/``cuda``); a meta reports
  :data:`META_PLATFORM` instead, its instance group still follows the backend.
- ``compiled_batch_sizes`` is ``""`` for a bundle with a lone ``model.mlir`` (it has no
  compiled batch sizes, only the internal key 0); ``variants`` is ``"[]"`` without
  ``input_shapes``. Metas carry ``kind``, ``calls``, ``residency``, ``weight_bytes`` and
  ``manifest_format`` (no batch sizes or variants: they have no modules).
- An entry without a manifest (loading or failed) gets metadata with name, versions and
  platform only, and a config with name, platform, backend and instance group only.
- ``batch_stats`` reports a lone module's internal key 0 as ``batch_size = 1`` (Triton's
  convention for models that do not batch).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from reactantserver.core.dtypes import DType
from reactantserver.core.manifest import Manifest
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.protocol import model_config_pb2 as mc
from reactantserver.core.types import TensorSpec
from reactantserver.worker.dataplane import RequestStats
from reactantserver.worker.registry import NOT_RESIDENT_REASON, ModelEntry, ModelState
from reactantserver.worker.scheduler.stats import BatchStats, StatsSnapshot

__all__ = [
    "BACKEND",
    "CONFIG_DATA_TYPES",
    "META_PLATFORM",
    "MODEL_VERSION",
    "NOT_RESIDENT_REASON",
    "config_data_type",
    "model_config",
    "model_metadata",
    "model_statistics",
    "repository_index",
]

MODEL_VERSION = "1"
"""The one version every model has."""

BACKEND = "reactantserver"
"""``ModelConfig.backend``."""

META_PLATFORM = "reactantserver_meta"
"""``platform`` of a meta model in ``ModelMetadata`` and ``ModelConfig``."""

_CUDA_PLATFORM = "cuda"

CONFIG_DATA_TYPES: Mapping[DType, mc.DataType.ValueType] = {
    DType.BOOL: mc.TYPE_BOOL,
    DType.U8: mc.TYPE_UINT8,
    DType.U16: mc.TYPE_UINT16,
    DType.U32: mc.TYPE_UINT32,
    DType.U64: mc.TYPE_UINT64,
    DType.I8: mc.TYPE_INT8,
    DType.I16: mc.TYPE_INT16,
    DType.I32: mc.TYPE_INT32,
    DType.I64: mc.TYPE_INT64,
    DType.F16: mc.TYPE_FP16,
    DType.F32: mc.TYPE_FP32,
    DType.F64: mc.TYPE_FP64,
    DType.BF16: mc.TYPE_BF16,
    DType.BYTES: mc.TYPE_STRING,
}
"""``ModelConfig`` data types of every wire dtype (``bytes`` is ``TYPE_STRING``)."""


def config_data_type(dtype: DType) -> mc.DataType.ValueType:
    """The ``TYPE_*`` of ``dtype``; ``ValueError`` for the FP8 types (never on the wire)."""
    data_type = CONFIG_DATA_TYPES.get(dtype)
    if data_type is None:
        raise ValueError(f"{dtype.token} has no ModelConfig data type (executable-internal only)")
    return data_type


def _platform(entry: ModelEntry, platform: str) -> str:
    return META_PLATFORM if entry.manifest is not None and entry.manifest.is_meta else platform


# -- ModelMetadata -----------------------------------------------------------------------------


def _tensor_metadata(spec: TensorSpec) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(
        name=spec.name, datatype=spec.dtype.kserve, shape=spec.wire_shape
    )


def model_metadata(entry: ModelEntry, *, platform: str) -> pb.ModelMetadataResponse:
    """``ModelMetadata``: the client-facing tensors, ``-1`` for batch and variable axes."""
    response = pb.ModelMetadataResponse(
        name=entry.name, versions=[MODEL_VERSION], platform=_platform(entry, platform)
    )
    if entry.manifest is not None:
        response.inputs.extend(_tensor_metadata(s) for s in entry.manifest.client_inputs)
        response.outputs.extend(_tensor_metadata(s) for s in entry.manifest.client_outputs)
    return response


# -- ModelConfig -------------------------------------------------------------------------------


def _batches_at_front(manifest: Manifest) -> bool:
    """Whether every client-facing tensor has its batch axis at row-major position 0."""
    tensors = manifest.client_inputs + manifest.client_outputs
    return all(spec.batch_axis == 0 for spec in tensors)


def _dims(spec: TensorSpec, *, batched: bool) -> list[int]:
    """Config dims: the wire shape, without the (leading) batch axis when ``batched``."""
    shape = spec.wire_shape
    return shape[1:] if batched else shape


def _parameters(
    manifest: Manifest, *, residency: str, weight_bytes: int
) -> dict[str, mc.ModelParameter]:
    values: dict[str, str] = {}
    if manifest.is_meta:
        values["kind"] = "meta"
        values["calls"] = ",".join(manifest.meta_calls)
    else:
        values["compiled_batch_sizes"] = ",".join(str(b) for b in manifest.compiled_batch_sizes)
        keys = [list(key) for key in manifest.variant_keys]
        values["variants"] = json.dumps(keys, separators=(",", ":"))
    values["residency"] = residency
    values["weight_bytes"] = str(weight_bytes)
    values["manifest_format"] = manifest.source_format
    return {key: mc.ModelParameter(string_value=value) for key, value in values.items()}


def _instance_group(platform: str, device_ordinal: int) -> mc.ModelInstanceGroup:
    if platform == _CUDA_PLATFORM:
        return mc.ModelInstanceGroup(
            count=1, kind=mc.ModelInstanceGroup.KIND_GPU, gpus=[device_ordinal]
        )
    return mc.ModelInstanceGroup(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)


def model_config(
    entry: ModelEntry,
    *,
    platform: str,
    device_ordinal: int,
    max_queue_depth: int,
    effective_max_batch: int,
    residency: str,
    weight_bytes: int,
    queue_delay_us: int = 0,
) -> pb.ModelConfigResponse:
    """``ModelConfig`` generated from the manifest.

    ``platform`` is the backend platform, ``effective_max_batch`` the scheduled model's
    ``max_batch`` (reported only when the model coalesces and every client tensor batches
    along axis 0), ``max_queue_depth`` the per-model queue limit, ``residency`` and
    ``weight_bytes`` go to ``parameters`` as given, ``queue_delay_us`` (the model's
    ``max_queue_delay_microseconds``, 0 by default) to ``dynamic_batching``.
    """
    config = mc.ModelConfig(
        name=entry.name,
        platform=_platform(entry, platform),
        backend=BACKEND,
        instance_group=[_instance_group(platform, device_ordinal)],
    )
    manifest = entry.manifest
    if manifest is None:
        return pb.ModelConfigResponse(config=config)
    coalescable = manifest.coalescable
    if coalescable and _batches_at_front(manifest):
        config.max_batch_size = effective_max_batch
    batched = config.max_batch_size > 0
    config.input.extend(
        mc.ModelInput(
            name=spec.name,
            data_type=config_data_type(spec.dtype),
            dims=_dims(spec, batched=batched),
        )
        for spec in manifest.client_inputs
    )
    config.output.extend(
        mc.ModelOutput(
            name=spec.name,
            data_type=config_data_type(spec.dtype),
            dims=_dims(spec, batched=batched),
        )
        for spec in manifest.client_outputs
    )
    if coalescable:
        config.dynamic_batching.CopyFrom(
            mc.ModelDynamicBatching(
                preferred_batch_size=[
                    b for b in manifest.compiled_batch_sizes if b <= effective_max_batch
                ],
                max_queue_delay_microseconds=queue_delay_us,
                default_queue_policy=mc.ModelQueuePolicy(
                    max_queue_size=max_queue_depth, allow_timeout_override=True
                ),
            )
        )
    for key, parameter in _parameters(
        manifest, residency=residency, weight_bytes=weight_bytes
    ).items():
        config.parameters[key].CopyFrom(parameter)
    return pb.ModelConfigResponse(config=config)


# -- RepositoryIndex ---------------------------------------------------------------------------


def _index_row(
    entry: ModelEntry, unavailable: Callable[[ModelEntry], str | None]
) -> pb.RepositoryIndexResponse.ModelIndex:
    state, reason = entry.state, entry.reason
    if state is ModelState.READY:
        # A READY entry's reason is a failed reload's error (the old generation serves).
        why = unavailable(entry)
        if why is not None:
            state, reason = ModelState.UNAVAILABLE, why
    elif state is ModelState.LOADING:
        reason = ""
    return pb.RepositoryIndexResponse.ModelIndex(
        name=entry.name, version=MODEL_VERSION, state=state.value, reason=reason
    )


def repository_index(
    entries: Iterable[ModelEntry],
    *,
    ready_only: bool,
    unavailable: Callable[[ModelEntry], str | None],
) -> pb.RepositoryIndexResponse:
    """``RepositoryIndex``: visible models sorted by name with state and reason.

    A READY entry for which ``unavailable`` gives a reason (explicit mode, not pinned:
    :data:`NOT_RESIDENT_REASON`; a meta whose sub-models do not serve) is ``UNAVAILABLE``
    with that reason; ``ready_only`` keeps READY rows only. Hidden entries are never listed.
    """
    rows = [
        _index_row(entry, unavailable)
        for entry in sorted(entries, key=lambda e: e.name)
        if not entry.hidden
    ]
    if ready_only:
        rows = [row for row in rows if row.state == ModelState.READY.value]
    return pb.RepositoryIndexResponse(models=rows)


# -- ModelStatistics ---------------------------------------------------------------------------


def _duration(count: int, ns: int) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=count, ns=ns)


def _batch_row(batch: int, stats: BatchStats) -> pb.InferBatchStatistics:
    return pb.InferBatchStatistics(
        batch_size=batch or 1,
        compute_input=_duration(stats.count, stats.input_ns),
        compute_infer=_duration(stats.count, stats.infer_ns),
        compute_output=_duration(stats.count, stats.output_ns),
    )


def _model_stats(name: str, snapshot: StatsSnapshot, requests: RequestStats) -> pb.ModelStatistics:
    batches = sorted(snapshot.batches.items())
    dispatches = sum(b.count for _, b in batches)
    return pb.ModelStatistics(
        name=name,
        version=MODEL_VERSION,
        last_inference=requests.last_inference_ms,
        inference_count=snapshot.rows_served,
        execution_count=snapshot.dispatch_count,
        inference_stats=pb.InferStatistics(
            success=_duration(requests.success_count, requests.success_ns),
            fail=_duration(requests.fail_count, requests.fail_ns),
            queue=_duration(snapshot.queue_wait_count, snapshot.queue_wait_ns),
            compute_input=_duration(dispatches, sum(b.input_ns for _, b in batches)),
            compute_infer=_duration(dispatches, sum(b.infer_ns for _, b in batches)),
            compute_output=_duration(dispatches, sum(b.output_ns for _, b in batches)),
        ),
        batch_stats=[_batch_row(size, stats) for size, stats in batches],
    )


def model_statistics(
    entries: Sequence[ModelEntry],
    *,
    scheduler_stats: Mapping[str, StatsSnapshot],
    request_stats: Callable[[str], RequestStats],
) -> pb.ModelStatisticsResponse:
    """``ModelStatistics`` of ``entries`` in the given order (hidden ones skipped).

    ``scheduler_stats`` maps a model name to its snapshot (a model without one, e.g. still
    loading, reports zeros); ``request_stats`` gives the handler-level outcomes of a name.
    """
    return pb.ModelStatisticsResponse(
        model_stats=[
            _model_stats(
                entry.name,
                scheduler_stats.get(entry.name, StatsSnapshot()),
                request_stats(entry.name),
            )
            for entry in entries
            if not entry.hidden
        ]
    )
