"""``shutdown()``: leave every server as we found it, quickly, and stay usable.

It unregisters staging pools wherever they were registered, unlinks their ``/dev/shm`` objects,
stops background re-probes (returning within about a second even when a probe hangs) and
closes channels; later calls start afresh.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from pathlib import Path

import grpc
import grpc.aio
import pytest

from reactantserver.client import KServeModel, StagingPool, infer_async, shutdown
from reactantserver.client._channels import CHANNELS, ChannelKey
from reactantserver.core.protocol import INFERENCE_METHODS
from reactantserver.core.protocol import grpc_service_pb2 as pb

from ._scripted import (
    KINDS,
    Pools,
    ScriptedServer,
    ShmEvent,
    check_echo,
    client_session,
    echo_from_slot,
    pid_shm_files,
    rows,
    scripted_server,
    slot_inputs,
)

SHM = Path("/dev/shm")
METADATA = INFERENCE_METHODS["ModelMetadata"]
REPROBE_PREFIX = "reactantserver-client-reprobe-"
SPEC_BOUND_S = 5.0  # documented as within 1 s; generous for loaded CI machines


def metadata_call(key: ChannelKey) -> pb.ModelMetadataResponse:
    call = CHANNELS.blocking(key).unary(
        METADATA.path, METADATA.request.SerializeToString, METADATA.response.FromString
    )
    reply: pb.ModelMetadataResponse = call(pb.ModelMetadataRequest(name="echo"), timeout=5.0)
    return reply


def reprobe_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(REPROBE_PREFIX)]


def assert_left_clean(servers: list[ScriptedServer], pool: StagingPool) -> None:
    for server in servers:
        assert server.shm_events[-1] == ShmEvent("unregister", pool.name)
        assert server.registry.status() == {}
    assert pool.closed
    assert not (SHM / pool.name).exists()


def test_shutdown_unregisters_everywhere_unlinks_and_closes_channels(
    server: ScriptedServer, pools: Pools
) -> None:
    with scripted_server() as other:
        servers = [server, other]
        pool = pools.new()
        assert (SHM / pool.name).exists()
        models = [KServeModel(s.url, "echo", pool=pool) for s in servers]
        for model in models:
            echo_from_slot("sync", model, pool, rows(2))
        for s in servers:
            assert set(s.registry.status()) == {pool.name}
        stubs = CHANNELS.blocking(models[0].key)

        shutdown()
        assert_left_clean(servers, pool)
        with pytest.raises(ValueError, match="closed channel"):
            stubs.unary(
                METADATA.path, METADATA.request.SerializeToString, METADATA.response.FromString
            )(pb.ModelMetadataRequest(name="echo"), timeout=5.0)

        # Usable again: the same model opens a new channel and negotiates afresh.
        assert metadata_call(models[0].key).name == "echo"
        fresh = pools.new()
        echo_from_slot("sync", models[0], fresh, rows(3))
        assert server.count("IsSameIPCNamespace") == 2
        assert server.registrations(fresh.name) == 1
        assert server.infers[-1].shm_inputs == (("x", fresh.name),)
        shutdown()
        assert_left_clean([server], fresh)
        assert other.shm_events[-1] == ShmEvent("unregister", pool.name)  # not told of fresh


def test_shutdown_on_the_loop_closes_its_aio_channels(server: ScriptedServer, pools: Pools) -> None:
    async def main() -> None:
        pool = pools.new()
        model = KServeModel(server.url, "echo", pool=pool)
        with slot_inputs(pool, x=rows(2)) as inputs:
            check_echo(await infer_async(model, inputs), rows(2))
        stubs = CHANNELS.for_loop(model.key)
        shutdown()
        assert_left_clean([server], pool)
        call = stubs.unary(
            METADATA.path, METADATA.request.SerializeToString, METADATA.response.FromString
        )
        stop = time.monotonic() + 10.0
        while True:  # the channel closes on its own loop, a few iterations later
            try:
                await call(pb.ModelMetadataRequest(name="echo"), timeout=5.0)
            except grpc.aio.UsageError:
                break  # "Channel is closed."
            except asyncio.CancelledError:
                # A call caught while the channel was closing is cancelled by the close.
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
            assert time.monotonic() < stop, "the aio channel was not closed"
            await asyncio.sleep(0.01)

        fresh = pools.new()
        with slot_inputs(fresh, x=rows(3)) as inputs:
            check_echo(await infer_async(model, inputs), rows(3))
        assert server.infers[-1].shm_inputs == (("x", fresh.name),)

    asyncio.run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_shutdown_returns_quickly_while_a_reprobe_hangs(
    kind: str, server: ScriptedServer, pools: Pools
) -> None:
    pool = pools.new()
    with KServeModel(server.url, "echo", pool=pool, shm_reprobe_interval=0.05) as model:
        echo_from_slot(kind, model, pool, rows(2))
        server.forget()
        server.refuse_registrations(grpc.StatusCode.UNAVAILABLE)
        server.hang_probe(30.0)
        echo_from_slot(kind, model, pool, rows(2))  # latches inline, starts the re-probe
        assert model.endpoint.latched(pool)
        assert server.probe_hanging.wait(10.0), "the re-probe never reached the server"
        threads = reprobe_threads()
        assert len(threads) == 1

        started = time.monotonic()
        shutdown()
        assert time.monotonic() - started < SPEC_BOUND_S

        threads[0].join(10.0)
        assert not threads[0].is_alive()
        assert not (SHM / pool.name).exists()
        assert server.shm_events[-1] == ShmEvent("unregister", pool.name)


@pytest.mark.parametrize("kind", KINDS)
def test_shutdown_gives_up_on_a_server_that_is_gone(
    kind: str, server: ScriptedServer, pools: Pools
) -> None:
    pool = pools.new()
    with scripted_server() as gone:
        echo_from_slot(kind, KServeModel(gone.url, "echo", pool=pool), pool, rows(2))
        assert gone.registrations(pool.name) == 1
    echo_from_slot(kind, KServeModel(server.url, "echo", pool=pool), pool, rows(2))

    started = time.monotonic()
    shutdown()
    assert time.monotonic() - started < SPEC_BOUND_S
    assert_left_clean([server], pool)
    assert pid_shm_files() == []


def test_a_pool_dropped_without_close_does_not_leak_its_shm_object() -> None:
    pool = StagingPool(1 << 16, 4)
    path = SHM / pool.name
    del pool
    gc.collect()
    try:
        shutdown()
        assert not path.exists()
    finally:
        path.unlink(missing_ok=True)  # the leak must not spill into later tests


def test_shutdown_is_idempotent_and_harmless_when_nothing_was_used() -> None:
    with client_session():
        shutdown()
        shutdown()
    assert pid_shm_files() == []
