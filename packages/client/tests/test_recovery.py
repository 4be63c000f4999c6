"""Stale registrations: a server that forgot this process's regions.

``forget()`` drops every registration as a restarted server would; the next request that
references a region gets ``FAILED_PRECONDITION`` and the client registers again, once per
failure wave, or falls back to inline and re-probes in the background.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest

from reactantserver.client import (
    InferInput,
    InferOutput,
    KServeModel,
    StagingPool,
    create_region,
    infer_async,
    infer_sync,
    register_region,
    unregister_region,
)

from ._scripted import (
    KINDS,
    EchoIO,
    Pools,
    ScriptedServer,
    ShmEvent,
    check_echo,
    code_of,
    echo_from_slot,
    rows,
    run_infer,
    slot_inputs,
    wait_for,
)

STALE = grpc.StatusCode.FAILED_PRECONDITION
OK = grpc.StatusCode.OK
REPROBE_S = 0.05


@pytest.fixture
def pool(pools: Pools) -> StagingPool:
    return pools.new(slots=8)


def shm_model(server: ScriptedServer, pool: StagingPool) -> KServeModel:
    return KServeModel(
        server.url, "echo", max_batch_size=4, pool=pool, shm_reprobe_interval=REPROBE_S
    )


def by_reference(server: ScriptedServer, pool: StagingPool) -> bool:
    last = server.infers[-1]
    return last.status is OK and last.raw_inputs == 0 and last.shm_inputs == (("x", pool.name),)


def shm_outputs(server: ScriptedServer) -> tuple[tuple[str, str], ...]:
    return server.infers[-1].shm_outputs


def inline(server: ScriptedServer) -> bool:
    last = server.infers[-1]
    return last.status is OK and last.raw_inputs == 1 and last.shm_inputs == ()


@pytest.mark.parametrize("kind", KINDS)
def test_a_forgotten_pool_is_registered_again_once(
    kind: str, server: ScriptedServer, pool: StagingPool
) -> None:
    with shm_model(server, pool) as model:
        echo_from_slot(kind, model, pool, rows(2))
        assert server.registrations(pool.name) == 1
        for restart in range(2):
            server.forget()
            echo_from_slot(kind, model, pool, rows(3, 100 * restart))
            assert by_reference(server, pool)
            assert server.registrations(pool.name) == 2 + restart
    assert [c.status for c in server.infers] == [OK, STALE, OK, STALE, OK]
    assert server.count("IsSameIPCNamespace") == 1
    assert not model.endpoint.latched(pool)


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_with_pool_outputs_registers_the_forgotten_pool_once(
    kind: str, server: ScriptedServer, pool: StagingPool
) -> None:
    with shm_model(server, pool) as model:
        echo_from_slot(kind, model, pool, rows(2))
        server.forget()
        io = EchoIO(6)  # two chunks; the first one finds the pool forgotten
        assert run_infer(kind, model, io) is None
        np.testing.assert_array_equal(io.result, io.data)
        assert by_reference(server, pool)
        assert shm_outputs(server) == (("x_out", pool.name),)
    statuses = [c.status for c in server.infers]
    # infer_async may have sent both chunks before either failed; each is re-sent once.
    assert statuses.count(STALE) in {1, 2}
    assert statuses.count(OK) == 3
    # The chunk references the pool twice (input and output): still one registration.
    assert server.registrations(pool.name) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_the_stale_message_is_recognised_under_any_status(
    kind: str, server: ScriptedServer, pool: StagingPool
) -> None:
    with shm_model(server, pool) as model:
        echo_from_slot(kind, model, pool, rows(2))
        server.fail_infer(
            grpc.StatusCode.INTERNAL,
            details=f"unregistered shared memory region {pool.name!r}",
        )
        echo_from_slot(kind, model, pool, rows(2, 8))
    assert [c.status for c in server.infers] == [OK, grpc.StatusCode.INTERNAL, OK]
    assert server.registrations(pool.name) == 2
    assert by_reference(server, pool)


def assert_one_wave(server: ScriptedServer, pool: StagingPool, n: int) -> None:
    """The first request, then ``n`` that all failed and were all re-sent after one registration.

    Calls are recorded as they finish, so a re-sent call may come before a failed one.
    """
    statuses = [c.status for c in server.infers]
    assert statuses[0] is OK
    assert statuses.count(STALE) == n
    assert statuses.count(OK) == 1 + n
    assert server.registrations(pool.name) == 2


def test_concurrent_async_failures_coalesce_into_one_registration(
    server: ScriptedServer, pool: StagingPool
) -> None:
    n = 6

    async def main(model: KServeModel) -> None:
        with pool.acquire() as slot:
            buffers = slot.scratch([((2, 4), np.float32)] * n)
            for i, buffer in enumerate(buffers):
                buffer[...] = rows(2, 8 * i)
            inputs = [[InferInput.from_slot("x", b)] for b in buffers]
            check_echo(await infer_async(model, inputs[0]), rows(2))  # decide: SHM
            server.forget()
            server.gather_infer(n)  # all n fail before any client hears of it
            replies = await asyncio.gather(*(infer_async(model, i) for i in inputs))
        for i, reply in enumerate(replies):
            check_echo(reply, rows(2, 8 * i))

    with shm_model(server, pool) as model:
        asyncio.run(main(model))
    assert_one_wave(server, pool, n)


def test_concurrent_sync_failures_coalesce_into_one_registration(
    server: ScriptedServer, pool: StagingPool
) -> None:
    n = 6
    with shm_model(server, pool) as model, pool.acquire() as slot:
        buffers = slot.scratch([((2, 4), np.float32)] * n)
        for i, buffer in enumerate(buffers):
            buffer[...] = rows(2, 8 * i)
        inputs = [[InferInput.from_slot("x", b)] for b in buffers]
        check_echo(infer_sync(model, inputs[0]), rows(2))
        server.forget()
        server.gather_infer(n)
        with ThreadPoolExecutor(n) as threads:
            replies = list(threads.map(lambda i: infer_sync(model, i), inputs))
    for i, reply in enumerate(replies):
        check_echo(reply, rows(2, 8 * i))
    assert_one_wave(server, pool, n)


@pytest.mark.parametrize("kind", KINDS)
def test_explicit_regions_are_registered_again(
    kind: str, server: ScriptedServer, pool: StagingPool
) -> None:
    key = f"/reactantserver-test-{os.getpid()}-{secrets.token_hex(4)}"
    mask = np.array([[1, 0, 1, 1]], np.int32)
    with create_region(key, 4096) as region, shm_model(server, pool) as model:
        # Registered from byte 64 of the object; tensor offsets count from there (Triton).
        region.write(128, mask)
        register_region(model, region, "mask", offset=64, byte_size=1024)
        registered = ShmEvent("register", "mask", key, 64, 1024)
        assert server.shm_events == [registered]
        data = rows(1)
        with slot_inputs(pool, x=data) as inputs:
            inputs.append(InferInput.from_shm("m", region, 64, (1, 4), np.int32))
            check_echo(run_infer(kind, model, inputs), data)
            server.forget()
            response = run_infer(kind, model, inputs)
        check_echo(response, data)
        assert response is not None
        np.testing.assert_array_equal(InferOutput(response, "m_out"), mask)
        unregister_region(model, region)
    assert [c.status for c in server.infers] == [OK, STALE, OK]
    assert server.infers[-1].shm_inputs == (("x", pool.name), ("m", "mask"))
    assert [e for e in server.shm_events if e.name == "mask"] == [
        registered,
        registered,  # the same range again
        ShmEvent("unregister", "mask"),
    ]
    assert server.registrations(pool.name) == 2
    assert set(server.registry.status()) == {pool.name}


@pytest.mark.parametrize("kind", KINDS)
def test_refused_registration_latches_inline_until_the_reprobe_restores_shm(
    kind: str, server: ScriptedServer, pool: StagingPool
) -> None:
    with shm_model(server, pool) as model:
        echo_from_slot(kind, model, pool, rows(2))
        assert by_reference(server, pool)
        server.forget()
        server.refuse_registrations(grpc.StatusCode.UNAVAILABLE)

        # The request itself still succeeds: re-sent inline, outputs included.
        io = EchoIO(3)
        assert run_infer(kind, model, io) is None
        np.testing.assert_array_equal(io.result, io.data)
        assert [c.status for c in server.infers] == [OK, STALE, OK]
        assert inline(server)
        assert shm_outputs(server) == ()
        assert model.endpoint.latched(pool)

        # While registrations are refused the re-probe keeps failing; requests stay inline.
        def refused() -> int:
            return sum(1 for e in server.shm_events if e.status is grpc.StatusCode.UNAVAILABLE)

        wait_for(lambda: refused() >= 3, what="the background re-probe to try again")
        echo_from_slot(kind, model, pool, rows(2, 50))
        assert inline(server)

        server.refuse_registrations(None)
        wait_for(lambda: not model.endpoint.latched(pool), what="the re-probe to restore SHM")
        assert server.registrations(pool.name) == 2
        echo_from_slot(kind, model, pool, rows(2, 70))
        assert by_reference(server, pool)
        io = EchoIO(3)
        assert run_infer(kind, model, io) is None
        np.testing.assert_array_equal(io.result, io.data)
        assert by_reference(server, pool)
        assert shm_outputs(server) == (("x_out", pool.name),)
    assert STALE not in [c.status for c in server.infers[3:]]


@pytest.mark.parametrize("kind", KINDS)
def test_a_stale_registration_is_not_retried_as_a_shed(
    kind: str, server: ScriptedServer, pool: StagingPool
) -> None:
    # A FAILED_PRECONDITION that re-registering cannot fix, on a request with no pool
    # to fall back from, is raised at once: not a retryable overload.
    key = f"/reactantserver-test-{os.getpid()}-{secrets.token_hex(4)}"
    with create_region(key, 4096) as region, shm_model(server, pool) as model:
        register_region(model, region, "only")
        server.forget()
        server.refuse_registrations(grpc.StatusCode.INTERNAL)
        inputs = [InferInput.from_shm("m", region, 0, (1, 4), np.int32)]
        with pytest.raises(grpc.RpcError) as raised:
            run_infer(kind, model, inputs)
        assert code_of(raised.value) is STALE
        server.refuse_registrations(None)
        unregister_region(model, region)
    assert [c.status for c in server.infers] == [STALE]
