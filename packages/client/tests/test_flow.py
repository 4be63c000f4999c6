"""The flow engine: hand-written flows driven by ``run_sync`` and ``run_async`` alike.

A flow yields :class:`Unary`, :class:`Sleep` or :class:`Exclusive` and gets the result back
at its ``yield`` (a failure is thrown in there); both drivers must behave the same.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
import pytest

from reactantserver.client import parse_url
from reactantserver.client._channels import ChannelKey
from reactantserver.client._flow import Exclusive, Flow, Guard, Sleep, Unary, run_async, run_sync
from reactantserver.core.protocol import INFERENCE_METHODS
from reactantserver.core.protocol import grpc_service_pb2 as pb

from ._scripted import KINDS, ScriptedServer, code_of

T = TypeVar("T")
METADATA = INFERENCE_METHODS["ModelMetadata"]
INFER = INFERENCE_METHODS["ModelInfer"]
HOLD_S = 0.05


@pytest.fixture
def key(server: ScriptedServer) -> ChannelKey:
    return ChannelKey(parse_url(server.url), 1 << 20, 1 << 20)


def drive(kind: str, flow: Flow[T]) -> T:
    if kind == "sync":
        return run_sync(flow)
    return asyncio.run(run_async(flow))


def metadata(key: ChannelKey, name: str) -> Unary:
    return Unary(key, METADATA, pb.ModelMetadataRequest(name=name), 5.0)


def infer_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="x", datatype="INT32", shape=[1])
    request.raw_input_contents.append(b"\x07\x00\x00\x00")
    return request


@pytest.mark.parametrize("kind", KINDS)
def test_a_unary_result_comes_back_at_the_yield(
    kind: str, key: ChannelKey, server: ScriptedServer
) -> None:
    def flow() -> Flow[tuple[str, str]]:
        first: pb.ModelMetadataResponse = yield metadata(key, "one")
        second: pb.ModelMetadataResponse = yield metadata(key, "two")
        return first.name, second.name

    assert drive(kind, flow()) == ("one", "two")
    assert server.count("ModelMetadata") == 2


@pytest.mark.parametrize("kind", KINDS)
def test_a_failure_is_thrown_at_the_yield_and_the_flow_carries_on(
    kind: str, key: ChannelKey, server: ScriptedServer
) -> None:
    server.fail_infer(grpc.StatusCode.NOT_FOUND, details="no such model (scripted)")

    def flow() -> Flow[tuple[Any, bytes]]:
        try:
            yield Unary(key, INFER, infer_request(), 5.0)
        except grpc.RpcError as error:
            caught = (code_of(error), error.details())
        else:
            raise AssertionError("the failure was not thrown in")
        reply: pb.ModelInferResponse = yield Unary(key, INFER, infer_request(), 5.0)
        return caught, reply.raw_output_contents[0]

    caught, echoed = drive(kind, flow())
    assert caught == (grpc.StatusCode.NOT_FOUND, "no such model (scripted)")
    assert echoed == b"\x07\x00\x00\x00"
    assert server.count("ModelInfer") == 2


@pytest.mark.parametrize("kind", KINDS)
def test_an_uncaught_failure_leaves_the_driver(
    kind: str, key: ChannelKey, server: ScriptedServer
) -> None:
    server.fail_infer(grpc.StatusCode.INTERNAL)
    after: list[str] = []

    def flow() -> Flow[None]:
        yield Unary(key, INFER, infer_request(), 5.0)
        after.append("resumed")

    with pytest.raises(grpc.RpcError) as raised:
        drive(kind, flow())
    assert code_of(raised.value) is grpc.StatusCode.INTERNAL
    assert after == []


@pytest.mark.parametrize("kind", KINDS)
def test_non_grpc_errors_are_thrown_in_too(kind: str) -> None:
    guard = Guard()

    def body() -> Flow[None]:
        raise KeyError("inside")
        yield Sleep(0)  # unreachable; makes body a generator

    def flow() -> Flow[str]:
        try:
            yield Exclusive(guard, body)
        except KeyError as error:
            return f"caught {error}"
        return "not caught"

    assert drive(kind, flow()) == "caught 'inside'"


@pytest.mark.parametrize("kind", KINDS)
def test_sleep_waits_and_yields_none(kind: str) -> None:
    def flow() -> Flow[list[Any]]:
        got = yield Sleep(HOLD_S)
        again = yield Sleep(0)
        return [got, again]

    assert drive(kind, flow()) == [None, None]


@pytest.mark.parametrize("kind", KINDS)
def test_exclusive_returns_what_its_body_returns(kind: str, key: ChannelKey) -> None:
    guard = Guard()

    def body() -> Flow[str]:
        reply: pb.ModelMetadataResponse = yield metadata(key, "inside")
        return reply.name

    def flow() -> Flow[str]:
        name: str = yield Exclusive(guard, body)
        return name

    assert drive(kind, flow()) == "inside"


def _tracing(events: list[str], name: str, guard: Guard | None) -> Callable[[], Flow[None]]:
    def body() -> Flow[None]:
        events.append(f"enter {name}")
        yield Sleep(HOLD_S)
        events.append(f"leave {name}")

    def flow() -> Flow[None]:
        if guard is None:
            yield from body()
        else:
            yield Exclusive(guard, body)

    return flow


def _serialised(events: list[str]) -> bool:
    return events in (
        ["enter a", "leave a", "enter b", "leave b"],
        ["enter b", "leave b", "enter a", "leave a"],
    )


@pytest.mark.parametrize("guarded", [True, False], ids=["exclusive", "free"])
def test_exclusive_serialises_two_concurrent_async_flows(guarded: bool) -> None:
    events: list[str] = []
    guard = Guard() if guarded else None

    async def main() -> None:
        await asyncio.gather(
            run_async(_tracing(events, "a", guard)()), run_async(_tracing(events, "b", guard)())
        )

    asyncio.run(main())
    # Unguarded, b starts while a sleeps (the loop is single-threaded, so this is certain):
    # the control shows the test can tell.
    assert _serialised(events) is guarded


def test_exclusive_serialises_two_threads() -> None:
    events: list[str] = []
    guard = Guard()
    both = threading.Barrier(2)

    def run(name: str) -> None:
        both.wait(10.0)
        run_sync(_tracing(events, name, guard)())

    threads = [threading.Thread(target=run, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10.0)
    assert _serialised(events)


def test_one_guard_serves_several_event_loops() -> None:
    guard = Guard()
    events: list[str] = []
    for name in "ab":
        asyncio.run(run_async(_tracing(events, name, guard)()))
    assert events == ["enter a", "leave a", "enter b", "leave b"]
