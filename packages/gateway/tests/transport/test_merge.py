"""Fan-out merges: statistics, repository index, IPC namespace, compaction."""

from __future__ import annotations

from reactantserver.core.protocol import control_pb2, grpc_service_pb2
from reactantserver.gateway.transport.merge import (
    is_same_namespace,
    merge_compact,
    merge_index,
    merge_statistics,
)

Stats = grpc_service_pb2.ModelStatistics
StatsResponse = grpc_service_pb2.ModelStatisticsResponse
Duration = grpc_service_pb2.StatisticDuration
Index = grpc_service_pb2.RepositoryIndexResponse
Entry = grpc_service_pb2.RepositoryIndexResponse.ModelIndex

INFER_DURATIONS = [f.name for f in grpc_service_pb2.InferStatistics.DESCRIPTOR.fields]
BATCH_DURATIONS = [
    f.name for f in grpc_service_pb2.InferBatchStatistics.DESCRIPTOR.fields if f.message_type
]
RESPONSE_DURATIONS = [f.name for f in grpc_service_pb2.InferResponseStatistics.DESCRIPTOR.fields]


def worker_stats(name: str, version: str, scale: int, *, last: int = 0) -> Stats:
    """Statistics where every duration ``i`` of a message is ``(scale * (i+1), scale * 1000)``."""
    stats = Stats(
        name=name,
        version=version,
        last_inference=last,
        inference_count=10 * scale,
        execution_count=4 * scale,
    )
    for i, field in enumerate(INFER_DURATIONS):
        getattr(stats.inference_stats, field).CopyFrom(Duration(count=scale * (i + 1), ns=scale))
    for size in (1, 8):
        batch = stats.batch_stats.add(batch_size=size)
        for field in BATCH_DURATIONS:
            getattr(batch, field).CopyFrom(Duration(count=scale * size, ns=scale * 100))
    for field in RESPONSE_DURATIONS:
        getattr(stats.response_stats["0"], field).CopyFrom(Duration(count=scale, ns=scale * 7))
    return stats


def test_statistic_fields_are_all_covered() -> None:
    fields = {f.name for f in Stats.DESCRIPTOR.fields}
    assert fields == {
        "name",
        "version",
        "last_inference",
        "inference_count",
        "execution_count",
        "inference_stats",
        "batch_stats",
        "memory_usage",
        "response_stats",
    }
    # Every sub-statistic is a StatisticDuration (apart from the batch size key), so the
    # descriptor-driven sum cannot miss one.
    for message in (
        grpc_service_pb2.InferStatistics,
        grpc_service_pb2.InferResponseStatistics,
    ):
        assert all(f.message_type is Duration.DESCRIPTOR for f in message.DESCRIPTOR.fields)
    assert {f.name for f in grpc_service_pb2.InferBatchStatistics.DESCRIPTOR.fields} == {
        "batch_size",
        *BATCH_DURATIONS,
    }


def test_statistics_are_summed_per_model_and_version() -> None:
    a = StatsResponse(model_stats=[worker_stats("m", "1", 1, last=500)])
    b = StatsResponse(model_stats=[worker_stats("m", "1", 2, last=300)])
    merged = merge_statistics([a, b])
    assert len(merged.model_stats) == 1
    model = merged.model_stats[0]
    assert (model.name, model.version) == ("m", "1")
    assert model.last_inference == 500
    assert model.inference_count == 30
    assert model.execution_count == 12
    for i, field in enumerate(INFER_DURATIONS):
        assert getattr(model.inference_stats, field) == Duration(count=3 * (i + 1), ns=3)
    assert [batch.batch_size for batch in model.batch_stats] == [1, 8]
    for batch in model.batch_stats:
        for field in BATCH_DURATIONS:
            assert getattr(batch, field) == Duration(count=3 * batch.batch_size, ns=300)
    assert list(model.response_stats) == ["0"]
    for field in RESPONSE_DURATIONS:
        assert getattr(model.response_stats["0"], field) == Duration(count=3, ns=21)


def test_versions_stay_apart_and_models_are_sorted() -> None:
    a = StatsResponse(model_stats=[worker_stats("zeta", "", 1), worker_stats("m", "2", 1)])
    b = StatsResponse(model_stats=[worker_stats("m", "1", 1), worker_stats("alpha", "", 5)])
    merged = merge_statistics([a, b])
    assert [(s.name, s.version) for s in merged.model_stats] == [
        ("alpha", ""),
        ("m", "1"),
        ("m", "2"),
        ("zeta", ""),
    ]
    assert merged.model_stats[0] == worker_stats("alpha", "", 5)  # a single source is unchanged


def test_batch_stats_merge_by_size_and_come_out_sorted() -> None:
    a = Stats(name="m")
    a.batch_stats.add(batch_size=4).compute_infer.CopyFrom(Duration(count=1, ns=10))
    a.batch_stats.add(batch_size=2).compute_infer.CopyFrom(Duration(count=2, ns=20))
    b = Stats(name="m")
    b.batch_stats.add(batch_size=3).compute_input.CopyFrom(Duration(count=5, ns=50))
    b.batch_stats.add(batch_size=4).compute_infer.CopyFrom(Duration(count=7, ns=70))
    merged = merge_statistics([StatsResponse(model_stats=[a]), StatsResponse(model_stats=[b])])
    batches = merged.model_stats[0].batch_stats
    assert [batch.batch_size for batch in batches] == [2, 3, 4]
    assert batches[2].compute_infer == Duration(count=8, ns=80)
    assert not batches[2].HasField("compute_input")  # nobody reported it for size 4
    assert batches[1].compute_input == Duration(count=5, ns=50)


def test_memory_usage_is_concatenated_and_response_stats_merged_by_key() -> None:
    a = Stats(name="m")
    a.memory_usage.add(type="GPU", id=0, byte_size=100)
    a.response_stats["0"].success.CopyFrom(Duration(count=1, ns=1))
    b = Stats(name="m")
    b.memory_usage.add(type="GPU", id=0, byte_size=200)
    b.response_stats["1"].success.CopyFrom(Duration(count=2, ns=2))
    b.response_stats["0"].success.CopyFrom(Duration(count=3, ns=3))
    merged = merge_statistics([StatsResponse(model_stats=[a]), StatsResponse(model_stats=[b])])
    model = merged.model_stats[0]
    assert [m.byte_size for m in model.memory_usage] == [100, 200]
    assert model.response_stats["0"].success == Duration(count=4, ns=4)
    assert model.response_stats["1"].success == Duration(count=2, ns=2)


def test_absent_inference_stats_stay_absent_and_inputs_are_untouched() -> None:
    a = StatsResponse(model_stats=[Stats(name="m", inference_count=1)])
    b = StatsResponse(model_stats=[Stats(name="m", inference_count=2)])
    before = (a.SerializeToString(), b.SerializeToString())
    model = merge_statistics([a, b]).model_stats[0]
    assert model.inference_count == 3
    assert not model.HasField("inference_stats")
    assert (a.SerializeToString(), b.SerializeToString()) == before


def test_counters_saturate_instead_of_overflowing() -> None:
    top = (1 << 64) - 1
    a = Stats(name="m", inference_count=top, execution_count=top - 1)
    a.inference_stats.success.CopyFrom(Duration(count=top, ns=top))
    b = Stats(name="m", inference_count=5, execution_count=1)
    b.inference_stats.success.CopyFrom(Duration(count=1, ns=1))
    model = merge_statistics([StatsResponse(model_stats=[a, b])]).model_stats[0]
    assert (model.inference_count, model.execution_count) == (top, top)
    assert model.inference_stats.success == Duration(count=top, ns=top)


def test_no_statistics_is_an_empty_response() -> None:
    assert merge_statistics([]) == StatsResponse()
    assert merge_statistics([StatsResponse(), StatsResponse()]) == StatsResponse()


# --- repository index --------------------------------------------------------------------------


def test_index_is_merged_by_name_and_sorted() -> None:
    a = Index(models=[Entry(name="b", version="1", state="READY"), Entry(name="a", version="")])
    b = Index(models=[Entry(name="c", state="UNAVAILABLE", reason="oom"), Entry(name="b")])
    merged = merge_index([a, b])
    assert [m.name for m in merged.models] == ["a", "b", "c"]
    assert merged.models[1] == Entry(name="b", version="1", state="READY")
    assert merged.models[2] == Entry(name="c", state="UNAVAILABLE", reason="oom")


def test_index_state_is_ready_if_any_worker_is_ready() -> None:
    a = Index(models=[Entry(name="m", version="1", state="UNAVAILABLE", reason="loading")])
    b = Index(models=[Entry(name="m", version="2", state="UNLOADING", reason="bye")])
    c = Index(models=[Entry(name="m", version="3", state="READY")])
    merged = merge_index([a, b, c])
    assert list(merged.models) == [Entry(name="m", version="1", state="READY")]


def test_index_state_is_the_first_reported_when_none_is_ready() -> None:
    a = Index(models=[Entry(name="m", state="UNAVAILABLE", reason="loading")])
    b = Index(models=[Entry(name="m", state="UNLOADING", reason="bye")])
    assert list(merge_index([a, b]).models) == [
        Entry(name="m", state="UNAVAILABLE", reason="loading")
    ]
    assert merge_index([]) == Index()


# --- IsSameIPCNamespace and CompactMemory ------------------------------------------------------


def test_same_namespace_is_the_and_of_answers() -> None:
    assert is_same_namespace([True])
    assert is_same_namespace([True, True, True])
    assert not is_same_namespace([True, False])
    assert not is_same_namespace([True, None])  # an error or UNIMPLEMENTED counts false
    assert not is_same_namespace([None])
    assert not is_same_namespace([])


def test_compaction_sums_reloaded_models_only() -> None:
    merged = merge_compact(
        [
            control_pb2.CompactMemoryResponse(reloaded_models=2, resident_bytes_after=1 << 30),
            control_pb2.CompactMemoryResponse(reloaded_models=3, resident_bytes_after=5),
        ]
    )
    assert merged == control_pb2.CompactMemoryResponse(reloaded_models=5)
    assert merge_compact([]) == control_pb2.CompactMemoryResponse()
