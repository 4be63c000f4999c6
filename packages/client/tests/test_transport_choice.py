"""SHM or inline: the ``IsSameIPCNamespace`` decision table, row by row.

Each row is checked through ``infer_sync`` and ``infer_async``, with a batched
``InferenceIO`` that declares its output (so an SHM pool gets it written into the slot and
copied back) and with a plain list of ``InferInput.from_slot`` inputs.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import grpc
import numpy as np
import pytest

from reactantserver.client import InferInput, InferOutput, KServeModel, StagingPool

from ._scripted import (
    KINDS,
    EchoIO,
    InferCall,
    Pools,
    ScriptedServer,
    ShmEvent,
    client_session,
    code_of,
    run_infer,
    scripted_server,
    slot_inputs,
)

Mode: TypeAlias = Literal["auto", "on", "off"]

ITEMS = 10
BATCH = 4
CHUNKS = 3  # ceil(ITEMS / BATCH)


@pytest.fixture
def pool(pools: Pools) -> StagingPool:
    return pools.new(slots=4)


def model_for(server: ScriptedServer, pool: StagingPool, mode: Mode) -> KServeModel:
    return KServeModel(
        server.url,
        "echo",
        shared_memory=mode,
        max_batch_size=BATCH,
        pool=pool,
    )


def run_batch(kind: str, model: KServeModel) -> EchoIO:
    io = EchoIO(ITEMS)
    assert run_infer(kind, model, io) is None
    np.testing.assert_array_equal(io.result, io.data)
    return io


def run_list(kind: str, model: KServeModel, pool: StagingPool) -> None:
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    with slot_inputs(pool, x=data) as inputs:
        response = run_infer(kind, model, inputs)
    assert response is not None
    np.testing.assert_array_equal(InferOutput(response, "x_out"), data)


def assert_inline(calls: list[InferCall]) -> None:
    assert calls
    for call in calls:
        assert call.status is grpc.StatusCode.OK
        assert call.raw_inputs == 1
        assert call.shm_inputs == ()
        assert call.shm_outputs == ()


def assert_by_reference(calls: list[InferCall], pool: StagingPool, *, outputs: bool) -> None:
    assert calls
    for call in calls:
        assert call.status is grpc.StatusCode.OK
        assert call.raw_inputs == 0
        assert call.shm_inputs == (("x", pool.name),)
        assert call.shm_outputs == ((("x_out", pool.name),) if outputs else ())


def attached(pool: StagingPool) -> list[ShmEvent]:
    """What attaching ``pool`` looks like at the server: best-effort unregister, register."""
    return [
        ShmEvent("unregister", pool.name),
        ShmEvent("register", pool.name, pool.shm_key or "", 0, pool.nbytes),
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_off_never_probes_and_sends_inline(
    kind: str, server: ScriptedServer, pool: StagingPool
) -> None:
    with model_for(server, pool, "off") as model:
        run_batch(kind, model)
        run_list(kind, model, pool)
    assert server.count("IsSameIPCNamespace") == 0
    assert server.shm_events == []
    assert_inline(server.infers)
    # The declared output is still asked for by name (explicit-output mode), just inline.
    assert [c.outputs for c in server.infers[:CHUNKS]] == [("x_out",)] * CHUNKS


@pytest.mark.parametrize("mode", ["auto", "on"])
@pytest.mark.parametrize("kind", KINDS)
def test_same_namespace_registers_the_pool_and_sends_by_reference(
    kind: str, mode: Mode, server: ScriptedServer, pool: StagingPool
) -> None:
    server.answer_probe(True)
    with model_for(server, pool, mode) as model:
        run_batch(kind, model)
        assert server.shm_events == attached(pool)
        assert set(server.registry.status()) == {pool.name}
        assert_by_reference(server.infers, pool, outputs=True)
        assert len(server.infers) == CHUNKS

        # The choice is cached for (endpoint, mode): no second probe, no second registration.
        run_list(kind, model, pool)
        assert_by_reference(server.infers[CHUNKS:], pool, outputs=False)
    assert server.count("IsSameIPCNamespace") == 1
    assert server.shm_events == attached(pool)


@pytest.mark.parametrize("answer", [False, grpc.StatusCode.UNIMPLEMENTED], ids=["false", "unimpl"])
@pytest.mark.parametrize("kind", KINDS)
def test_auto_stays_inline_when_the_server_cannot_map_the_pool(
    kind: str,
    answer: bool | grpc.StatusCode,
    server: ScriptedServer,
    pool: StagingPool,
) -> None:
    server.answer_probe(answer)
    with model_for(server, pool, "auto") as model:
        run_batch(kind, model)
        run_list(kind, model, pool)
    assert server.count("IsSameIPCNamespace") == 1
    assert server.shm_events == []
    assert_inline(server.infers)


@pytest.mark.parametrize("kind", KINDS)
def test_on_with_another_namespace_is_an_error(
    kind: str, server: ScriptedServer, pool: StagingPool
) -> None:
    server.answer_probe(False)
    with model_for(server, pool, "on") as model:
        with pytest.raises(RuntimeError, match="shared_memory='on'"):
            run_list(kind, model, pool)
        # A refusal is not cached as a decision: the next call asks again.
        with pytest.raises(RuntimeError, match="shared_memory='on'"):
            run_list(kind, model, pool)
    assert server.count("IsSameIPCNamespace") == 2
    assert server.shm_events == []
    assert server.count("ModelInfer") == 0


@pytest.mark.parametrize("kind", KINDS)
def test_on_registers_anyway_when_the_probe_is_unimplemented(
    kind: str, server: ScriptedServer, pool: StagingPool
) -> None:
    server.answer_probe(grpc.StatusCode.UNIMPLEMENTED)
    with model_for(server, pool, "on") as model:
        run_batch(kind, model)
        run_list(kind, model, pool)
    assert server.count("IsSameIPCNamespace") == 1
    assert server.shm_events == attached(pool)
    assert_by_reference(server.infers[:CHUNKS], pool, outputs=True)
    assert_by_reference(server.infers[CHUNKS:], pool, outputs=False)


@pytest.mark.parametrize("mode", ["auto", "on"])
@pytest.mark.parametrize("kind", KINDS)
def test_other_probe_errors_propagate(
    kind: str, mode: Mode, server: ScriptedServer, pool: StagingPool
) -> None:
    server.answer_probe(grpc.StatusCode.PERMISSION_DENIED)
    with model_for(server, pool, mode) as model:
        with pytest.raises(grpc.RpcError) as raised:
            run_list(kind, model, pool)
        assert code_of(raised.value) is grpc.StatusCode.PERMISSION_DENIED
        # Nothing was decided: once the server answers, the next call probes again.
        server.answer_probe(True)
        run_list(kind, model, pool)
    assert server.count("IsSameIPCNamespace") == 2
    assert server.count("ModelInfer") == 1
    assert server.shm_events == attached(pool)
    assert_by_reference(server.infers, pool, outputs=False)


@pytest.mark.parametrize(
    ("answer", "mode", "error"),
    [
        (False, "on", RuntimeError),
        (grpc.StatusCode.PERMISSION_DENIED, "auto", grpc.RpcError),
    ],
    ids=["on-false", "auto-error"],
)
@pytest.mark.parametrize("kind", KINDS)
def test_probe_failures_surface_from_a_batch_as_themselves(
    *,
    kind: str,
    answer: bool | grpc.StatusCode,
    mode: Mode,
    error: type[Exception],
    server: ScriptedServer,
    pool: StagingPool,
) -> None:
    server.answer_probe(answer)
    with model_for(server, pool, mode) as model, pytest.raises(error):
        run_batch(kind, model)
    assert server.count("ModelInfer") == 0
    assert server.shm_events == []


@pytest.mark.parametrize("kind", KINDS)
def test_plain_inputs_never_probe(kind: str, server: ScriptedServer) -> None:
    data = np.ones((2, 4), np.float32)
    with KServeModel(server.url, "echo", shared_memory="on") as model:
        response = run_infer(kind, model, [InferInput("x", data)], outputs=["x_out"])
    assert response is not None
    np.testing.assert_array_equal(InferOutput(response, "x_out"), data)
    assert server.count("IsSameIPCNamespace") == 0
    assert_inline(server.infers)


@pytest.mark.parametrize("kind", KINDS)
def test_decision_is_cached_per_endpoint_and_mode(kind: str, pool: StagingPool) -> None:
    with scripted_server() as first, scripted_server() as second, client_session():
        for server in (first, second):
            for mode in ("auto", "auto", "on", "on"):  # type: Mode
                # A new model each time: the cache belongs to the endpoint, not the model.
                with model_for(server, pool, mode) as model:
                    run_list(kind, model, pool)
        for server in (first, second):
            assert server.count("IsSameIPCNamespace") == 2  # once for "auto", once for "on"
            assert server.shm_events == attached(pool) * 2
            assert_by_reference(server.infers, pool, outputs=False)
