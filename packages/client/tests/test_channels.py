"""Channel cache and channel options: sharing, per-loop aio channels, refcounts, limits."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import numpy as np
import pytest

from reactantserver import client
from reactantserver.client import (
    InferInput,
    InferOutput,
    KServeModel,
    RetryPolicy,
    Target,
    infer_async,
    infer_sync,
)
from reactantserver.client._channels import CHANNELS, KEEPALIVE_OPTIONS, ChannelKey
from reactantserver.client._model import (
    DEFAULT_MESSAGE_BYTES,
    MAX_RECV_ENV,
    MAX_SEND_ENV,
    message_limit,
)
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.protocol import inference_service_handler

SHM = Path("/dev/shm")
MIB_512 = 512 * 1024 * 1024
NOWHERE = Target("127.0.0.1", 1, tls=False)  # channels connect lazily: never dialled


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(MAX_SEND_ENV, raising=False)
    monkeypatch.delenv(MAX_RECV_ENV, raising=False)
    yield
    client.shutdown()
    left = sorted(SHM.glob(f"reactantserver-client-{os.getpid()}-*"))
    assert not left, f"staging pools left behind: {left}"


def _key(target: Target = NOWHERE, **changes: Any) -> ChannelKey:
    fields: dict[str, Any] = {
        "max_send_message_length": MIB_512,
        "max_receive_message_length": MIB_512,
    }
    fields.update(changes)
    return ChannelKey(target, **fields)


def _echo(request: pb.ModelInferRequest, context: grpc.ServicerContext) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name=request.model_name, id=request.id)
    for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(raw)
    return response


def _big(request: pb.ModelInferRequest, context: grpc.ServicerContext) -> pb.ModelInferResponse:
    """Whatever was asked: 16 KiB back."""
    response = pb.ModelInferResponse(model_name=request.model_name)
    response.outputs.add(name="y", datatype="UINT8", shape=[16384])
    response.raw_output_contents.append(bytes(16384))
    return response


@pytest.fixture
def server() -> Iterator[str]:
    """A real in-process gRPC server: model ``echo`` returns its inputs, ``big`` 16 KiB."""

    def infer(
        request: pb.ModelInferRequest, context: grpc.ServicerContext
    ) -> pb.ModelInferResponse:
        return (_big if request.model_name == "big" else _echo)(request, context)

    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    srv.add_generic_rpc_handlers((inference_service_handler({"ModelInfer": infer}),))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        yield f"grpc://127.0.0.1:{port}"
    finally:
        srv.stop(grace=None).wait(10)


# -- the cache --------------------------------------------------------------------------------


def test_same_key_same_channel() -> None:
    first = CHANNELS.blocking(_key())
    again = CHANNELS.blocking(_key())
    assert again is first
    assert again.channel is first.channel


def test_models_on_one_endpoint_share_a_channel() -> None:
    with KServeModel("grpc://127.0.0.1:1", "a") as a, KServeModel("127.0.0.1:1/", "b") as b:
        assert a.key == b.key
        assert CHANNELS.blocking(a.key).channel is CHANNELS.blocking(b.key).channel


@pytest.mark.parametrize(
    "other",
    [
        _key(max_send_message_length=1024),
        _key(max_receive_message_length=1024),
        _key(Target("127.0.0.1", 2, tls=False)),
        _key(Target("localhost", 1, tls=False)),
        _key(Target("127.0.0.1", 1, tls=True)),
    ],
    ids=["send-limit", "recv-limit", "port", "host", "tls"],
)
def test_different_key_different_channel(other: ChannelKey) -> None:
    assert other != _key()
    assert CHANNELS.blocking(other).channel is not CHANNELS.blocking(_key()).channel


def test_different_tls_material_different_channel() -> None:
    tls = Target("127.0.0.1", 1, tls=True)
    plain_roots = CHANNELS.blocking(_key(tls)).channel
    with_roots = CHANNELS.blocking(_key(tls, root_certificates=b"roots-a")).channel
    other_roots = CHANNELS.blocking(_key(tls, root_certificates=b"roots-b")).channel
    client_cert = CHANNELS.blocking(
        _key(tls, root_certificates=b"roots-a", private_key=b"k", certificate_chain=b"c")
    ).channel
    assert len({id(plain_roots), id(with_roots), id(other_roots), id(client_cert)}) == 4
    assert CHANNELS.blocking(_key(tls, root_certificates=b"roots-a")).channel is with_roots


def test_private_key_stays_out_of_repr() -> None:
    key = _key(Target("h", 1, tls=True), private_key=b"very-secret")
    assert "very-secret" not in repr(key)


def test_credentials_only_for_tls() -> None:
    assert _key().credentials() is None
    assert isinstance(_key(Target("h", 1, tls=True)).credentials(), grpc.ChannelCredentials)


def test_aio_channels_are_per_loop() -> None:
    key = _key()

    async def grab() -> tuple[object, object]:
        first = CHANNELS.for_loop(key).channel
        again = CHANNELS.for_loop(key).channel
        await first.close()
        return first, again

    a1, a2 = asyncio.run(grab())
    b1, b2 = asyncio.run(grab())
    assert a1 is a2
    assert b1 is b2
    assert a1 is not b1


def test_aio_and_blocking_channels_differ() -> None:
    key = _key()
    blocking = CHANNELS.blocking(key).channel

    async def grab() -> object:
        channel = CHANNELS.for_loop(key).channel
        await channel.close()
        return channel

    assert asyncio.run(grab()) is not blocking
    assert isinstance(blocking, grpc.Channel)


def test_for_loop_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        CHANNELS.for_loop(_key())


def test_detach_closes_at_zero() -> None:
    key = _key()
    CHANNELS.attach(key)
    CHANNELS.attach(key)
    stubs = CHANNELS.blocking(key)
    call = stubs.unary("/inference.GRPCInferenceService/ServerLive", bytes, bytes)
    CHANNELS.detach(key)
    assert CHANNELS.blocking(key) is stubs  # one user left: still open
    CHANNELS.detach(key)
    with pytest.raises(ValueError, match="closed channel"):
        call(b"", timeout=5)
    fresh = CHANNELS.blocking(key)
    assert fresh is not stubs
    assert fresh.channel is not stubs.channel


def test_detach_closes_aio_channels_of_the_running_loop() -> None:
    key = _key()

    async def scenario() -> None:
        CHANNELS.attach(key)
        stubs = CHANNELS.for_loop(key)
        call = stubs.unary("/inference.GRPCInferenceService/ServerLive", bytes, bytes)
        CHANNELS.detach(key)
        for _ in range(20):  # the close is scheduled on this loop
            await asyncio.sleep(0)
        with pytest.raises(grpc.aio.UsageError):
            await call(b"", timeout=5)
        assert CHANNELS.for_loop(key) is not stubs
        await CHANNELS.for_loop(key).channel.close()

    asyncio.run(scenario())


def test_closing_models_detaches() -> None:
    a = KServeModel("grpc://127.0.0.1:1", "a")
    b = KServeModel("grpc://127.0.0.1:1", "b")
    stubs = CHANNELS.blocking(a.key)
    a.close()
    a.close()  # idempotent: must not count twice
    assert CHANNELS.blocking(b.key) is stubs
    b.close()
    assert CHANNELS.blocking(b.key) is not stubs


def test_close_all_starts_afresh() -> None:
    key = _key()
    stubs = CHANNELS.blocking(key)
    CHANNELS.close_all()
    assert CHANNELS.blocking(key) is not stubs


# -- options ----------------------------------------------------------------------------------


def test_options_carry_limits_and_keepalive() -> None:
    with KServeModel("grpc://127.0.0.1:1", "m") as model:
        options = dict(model.key.options())
    assert options["grpc.max_send_message_length"] == MIB_512
    assert options["grpc.max_receive_message_length"] == MIB_512
    assert options["grpc.keepalive_time_ms"] == 30_000
    assert options["grpc.keepalive_timeout_ms"] == 20_000
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert set(KEEPALIVE_OPTIONS) <= set(model.key.options())
    assert DEFAULT_MESSAGE_BYTES == MIB_512


def test_explicit_limits() -> None:
    with KServeModel(
        "grpc://127.0.0.1:1", "m", max_send_message_length=1000, max_receive_message_length=2000
    ) as model:
        options = dict(model.key.options())
    assert options["grpc.max_send_message_length"] == 1000
    assert options["grpc.max_receive_message_length"] == 2000


def test_env_gives_defaults_per_direction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_SEND_ENV, "1234")
    with KServeModel("grpc://127.0.0.1:1", "m") as model:
        assert model.key.max_send_message_length == 1234
        assert model.key.max_receive_message_length == MIB_512
    monkeypatch.delenv(MAX_SEND_ENV)
    monkeypatch.setenv(MAX_RECV_ENV, "5678")
    with KServeModel("grpc://127.0.0.1:1", "m") as model:
        assert model.key.max_send_message_length == MIB_512
        assert model.key.max_receive_message_length == 5678


def test_the_older_variable_names_still_work_and_warn_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    old = "REACTANT_CLIENT_GRPC_MAX_SEND_MSG_BYTES"
    assert MAX_SEND_ENV == "REACTANTSERVER_CLIENT_GRPC_MAX_SEND_MSG_BYTES"
    monkeypatch.setenv(old, "4321")
    with caplog.at_level(logging.WARNING, logger="reactantserver.client"):
        assert message_limit(None, MAX_SEND_ENV) == 4321
        assert message_limit(None, MAX_SEND_ENV) == 4321
    assert [r.getMessage() for r in caplog.records] == [f"{old} is deprecated; use {MAX_SEND_ENV}"]
    monkeypatch.setenv(MAX_SEND_ENV, "99")
    assert message_limit(None, MAX_SEND_ENV) == 99  # the new name wins


def test_explicit_arguments_beat_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_SEND_ENV, "1234")
    monkeypatch.setenv(MAX_RECV_ENV, "5678")
    with KServeModel(
        "grpc://127.0.0.1:1", "m", max_send_message_length=11, max_receive_message_length=22
    ) as model:
        assert model.key.max_send_message_length == 11
        assert model.key.max_receive_message_length == 22


@pytest.mark.parametrize("env", [MAX_SEND_ENV, MAX_RECV_ENV])
@pytest.mark.parametrize("text", ["lots", "1.5", "", "0", "-1", "512MiB"])
def test_bad_env(monkeypatch: pytest.MonkeyPatch, env: str, text: str) -> None:
    monkeypatch.setenv(env, text)
    with pytest.raises(ValueError, match=env if text not in ("0", "-1") else ">= 1"):
        KServeModel("grpc://127.0.0.1:1", "m")


def test_bad_env_is_ignored_when_the_argument_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_SEND_ENV, "lots")
    assert message_limit(4096, MAX_SEND_ENV) == 4096


@pytest.mark.parametrize("value", [0, -1])
def test_explicit_limits_must_be_positive(value: int) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        KServeModel("grpc://127.0.0.1:1", "m", max_send_message_length=value)
    with pytest.raises(ValueError, match=">= 1"):
        KServeModel("grpc://127.0.0.1:1", "m", max_receive_message_length=value)


# -- the options reach the wire (a real in-process server) ------------------------------------

NO_RETRY = RetryPolicy(enabled=False)


def test_defaults_carry_a_request_both_ways(server: str) -> None:
    data = np.arange(4096, dtype=np.uint8)
    with KServeModel(server, "echo", retry=NO_RETRY) as model:
        response = infer_sync(model, [InferInput("x", data)])
        assert response is not None
        np.testing.assert_array_equal(InferOutput(response, "x"), data)


def test_send_limit_applies(server: str) -> None:
    with (
        KServeModel(server, "echo", retry=NO_RETRY, max_send_message_length=1024) as model,
        pytest.raises(grpc.RpcError) as info,
    ):
        infer_sync(model, [InferInput("x", np.zeros(4096, np.uint8))])
    assert isinstance(info.value, grpc.Call)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_receive_limit_applies(server: str) -> None:
    with (
        KServeModel(server, "big", retry=NO_RETRY, max_receive_message_length=1024) as model,
        pytest.raises(grpc.RpcError) as info,
    ):
        infer_sync(model, [InferInput("x", np.zeros(1, np.uint8))])
    assert isinstance(info.value, grpc.Call)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_env_limit_applies(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_RECV_ENV, "1024")
    with (
        KServeModel(server, "big", retry=NO_RETRY) as model,
        pytest.raises(grpc.RpcError) as info,
    ):
        infer_sync(model, [InferInput("x", np.zeros(1, np.uint8))])
    assert isinstance(info.value, grpc.Call)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_async_calls_work_across_event_loops(server: str) -> None:
    # Each asyncio.run is a new loop; a channel bound to the previous one must not be reused.
    data = np.arange(6, dtype=np.float32)
    with KServeModel(server, "echo", retry=NO_RETRY) as model:
        for _ in range(3):
            response = asyncio.run(infer_async(model, [InferInput("x", data)]))
            assert response is not None
            np.testing.assert_array_equal(InferOutput(response, "x"), data)


def test_async_limit_applies(server: str) -> None:
    with (
        KServeModel(server, "echo", retry=NO_RETRY, max_send_message_length=1024) as model,
        pytest.raises(grpc.RpcError) as info,
    ):
        asyncio.run(infer_async(model, [InferInput("x", np.zeros(4096, np.uint8))]))
    assert isinstance(info.value, grpc.aio.AioRpcError)
    assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
