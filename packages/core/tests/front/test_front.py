"""The native front against a real ``grpc.aio`` client on 127.0.0.1: every call shape and
every way a call can end, as a grpc server would answer it."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from reactantserver.core.front import GrpcFront, RpcContext

SERVICE = "test.Echo"
Handler = Callable[..., Any]


def _identity(data: bytes) -> bytes:
    return data


def _front(handlers: dict[str, grpc.RpcMethodHandler], **options: Any) -> tuple[GrpcFront, int]:
    front = GrpcFront(
        max_recv_msg_bytes=options.pop("max_recv", 1 << 20),
        max_send_msg_bytes=options.pop("max_send", 1 << 20),
        **options,
    )
    front.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    port = front.add_port("127.0.0.1:0")
    return front, port


def _run(
    handlers: dict[str, grpc.RpcMethodHandler],
    body: Callable[[grpc.aio.Channel, int], Awaitable[Any]],
    **options: Any,
) -> Any:
    async def main() -> Any:
        front, port = _front(handlers, **options)
        await front.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                return await body(channel, port)
        finally:
            await front.stop(1.0)

    return asyncio.run(main())


def _unary(fn: Handler) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(fn)


async def _call(channel: grpc.aio.Channel, method: str, data: bytes, **kwargs: Any) -> Any:
    return await channel.unary_unary(f"/{SERVICE}/{method}")(data, **kwargs)


async def _status(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def test_a_unary_call_and_its_metadata_both_ways() -> None:
    async def echo(request: bytes, context: RpcContext) -> bytes:
        metadata = dict(context.invocation_metadata())
        await context.send_initial_metadata([("server-said", "hello")])
        context.set_trailing_metadata([("trace-bin", b"\x01\x02")])
        raw = metadata["raw-bin"]
        assert isinstance(raw, bytes)
        return request + b"|" + str(metadata["who"]).encode() + b"|" + raw

    async def body(channel: grpc.aio.Channel, port: int) -> Any:
        call = channel.unary_unary(f"/{SERVICE}/Echo")(
            b"ping", metadata=(("who", "me"), ("raw-bin", b"\xff\x00"))
        )
        answer = await call
        return answer, await call.initial_metadata(), await call.trailing_metadata()

    answer, initial, trailing = _run({"Echo": _unary(echo)}, body)
    assert answer == b"ping|me|\xff\x00"
    assert ("server-said", "hello") in tuple(initial)
    assert ("trace-bin", b"\x01\x02") in tuple(trailing)


def test_empty_and_large_messages() -> None:
    async def echo(request: bytes, context: RpcContext) -> bytes:
        return request

    async def body(channel: grpc.aio.Channel, port: int) -> list[int]:
        sizes = [0, 1, 65_535, 65_537, 3 << 20]
        return [len(await _call(channel, "Echo", b"x" * n)) for n in sizes]

    assert _run({"Echo": _unary(echo)}, body, max_recv=4 << 20, max_send=4 << 20) == [
        0,
        1,
        65_535,
        65_537,
        3 << 20,
    ]


def test_every_way_a_unary_call_ends() -> None:
    async def abort(request: bytes, context: RpcContext) -> bytes:
        await context.abort(grpc.StatusCode.NOT_FOUND, "no model 'caf\u00e9' (100%)")
        raise AssertionError

    async def set_code(request: bytes, context: RpcContext) -> None:
        context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
        context.set_details("not now")

    async def crash(request: bytes, context: RpcContext) -> bytes:
        raise ValueError("boom")

    def sync(request: bytes, context: Any) -> bytes:
        return b"sync:" + request

    async def body(channel: grpc.aio.Channel, port: int) -> dict[str, Any]:
        return {
            "abort": await _status(_call(channel, "Abort", b"")),
            "set_code": await _status(_call(channel, "SetCode", b"")),
            "crash": await _status(_call(channel, "Crash", b"")),
            "unknown": await _status(_call(channel, "Nope", b"")),
            "sync": await _call(channel, "Sync", b"a"),
        }

    out = _run(
        {
            "Abort": _unary(abort),
            "SetCode": _unary(set_code),
            "Crash": _unary(crash),
            "Sync": _unary(sync),
        },
        body,
    )
    assert out["abort"] == (grpc.StatusCode.NOT_FOUND, "no model 'caf\u00e9' (100%)")
    assert out["set_code"] == (grpc.StatusCode.FAILED_PRECONDITION, "not now")
    assert out["crash"][0] is grpc.StatusCode.UNKNOWN
    assert "boom" in out["crash"][1]
    assert out["unknown"][0] is grpc.StatusCode.UNIMPLEMENTED
    assert out["sync"] == b"sync:a"


def test_message_limits_both_ways_and_the_server_keeps_serving() -> None:
    async def echo(request: bytes, context: RpcContext) -> bytes:
        return request * 2

    async def body(channel: grpc.aio.Channel, port: int) -> list[Any]:
        return [
            await _status(_call(channel, "Echo", b"x" * 2000)),  # in: over 1000
            await _status(_call(channel, "Echo", b"x" * 800)),  # out: 1600 over 1000
            await _call(channel, "Echo", b"ok"),
        ]

    over_in, over_out, fine = _run({"Echo": _unary(echo)}, body, max_recv=1000, max_send=1000)
    assert over_in[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "2000 vs. 1000" in over_in[1]
    assert over_out[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert fine == b"okok"


def test_a_deadline_reaches_the_handler_and_ends_a_call_that_overruns_it() -> None:
    seen: dict[str, Any] = {}

    async def slow(request: bytes, context: RpcContext) -> bytes:
        seen["remaining"] = context.time_remaining()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise
        return b"late"

    async def fast(request: bytes, context: RpcContext) -> bytes:
        seen["none"] = context.time_remaining()
        return b""

    async def body(channel: grpc.aio.Channel, port: int) -> Any:
        status = await _status(_call(channel, "Slow", b"", timeout=0.3))
        await _call(channel, "Fast", b"")
        await asyncio.sleep(0.2)
        return status

    status = _run({"Slow": _unary(slow), "Fast": _unary(fast)}, body)
    assert status[0] is grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.0 < seen["remaining"] <= 0.31  # the client rounds its timeout up a little
    assert seen["cancelled"]
    assert seen["none"] is None


def test_a_client_that_cancels_cancels_the_handler() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def wait(request: bytes, context: RpcContext) -> bytes:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b""

    async def body(channel: grpc.aio.Channel, port: int) -> bool:
        call = channel.unary_unary(f"/{SERVICE}/Wait")(b"")
        await asyncio.wait_for(started.wait(), 5)
        call.cancel()
        await asyncio.wait_for(cancelled.wait(), 5)
        return True

    assert _run({"Wait": _unary(wait)}, body)


def test_server_streaming_by_generator_and_by_write() -> None:
    async def generate(request: bytes, context: RpcContext) -> AsyncIterator[bytes]:
        for i in range(3):
            yield request + str(i).encode()

    async def write(request: bytes, context: RpcContext) -> None:
        await context.write(b"a")
        await context.write(b"b")

    async def fail_midway(request: bytes, context: RpcContext) -> AsyncIterator[bytes]:
        yield b"one"
        await context.abort(grpc.StatusCode.ABORTED, "stopped")

    async def body(channel: grpc.aio.Channel, port: int) -> Any:
        generated = [m async for m in channel.unary_stream(f"/{SERVICE}/Gen")(b"n")]
        written = [m async for m in channel.unary_stream(f"/{SERVICE}/Write")(b"")]
        got: list[bytes] = []
        call = channel.unary_stream(f"/{SERVICE}/Fail")(b"")
        try:
            async for message in call:
                got.append(message)
        except grpc.aio.AioRpcError as error:
            return generated, written, got, error.code()
        return generated, written, got, None

    generated, written, got, code = _run(
        {
            "Gen": grpc.unary_stream_rpc_method_handler(generate),
            "Write": grpc.unary_stream_rpc_method_handler(write),
            "Fail": grpc.unary_stream_rpc_method_handler(fail_midway),
        },
        body,
    )
    assert generated == [b"n0", b"n1", b"n2"]
    assert written == [b"a", b"b"]
    assert got == [b"one"]
    assert code is grpc.StatusCode.ABORTED


def test_client_and_bidirectional_streaming() -> None:
    async def total(requests: AsyncIterator[bytes], context: RpcContext) -> bytes:
        return b"".join([r async for r in requests])

    async def by_read(requests: Any, context: RpcContext) -> bytes:
        parts = []
        while (message := await context.read()) is not grpc.aio.EOF:
            parts.append(message)
        return b"+".join(parts)

    async def upper(requests: AsyncIterator[bytes], context: RpcContext) -> AsyncIterator[bytes]:
        async for message in requests:
            yield message.upper()

    async def body(channel: grpc.aio.Channel, port: int) -> Any:
        joined = await channel.stream_unary(f"/{SERVICE}/Total")(iter([b"a", b"b", b"c"]))
        read = await channel.stream_unary(f"/{SERVICE}/Read")(iter([b"x", b"y"]))
        call = channel.stream_stream(f"/{SERVICE}/Upper")()
        answers = []
        for word in (b"one", b"two"):
            await call.write(word)
            answers.append(await call.read())
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        return joined, read, answers, await call.code()

    joined, read, answers, code = _run(
        {
            "Total": grpc.stream_unary_rpc_method_handler(total),
            "Read": grpc.stream_unary_rpc_method_handler(by_read),
            "Upper": grpc.stream_stream_rpc_method_handler(upper),
        },
        body,
    )
    assert joined == b"abc"
    assert read == b"x+y"
    assert answers == [b"ONE", b"TWO"]
    assert code is grpc.StatusCode.OK


def test_compressed_requests_are_served() -> None:
    async def echo(request: bytes, context: RpcContext) -> bytes:
        return request

    async def body(channel: grpc.aio.Channel, port: int) -> bytes:
        return bytes(await _call(channel, "Echo", b"z" * 5000, compression=grpc.Compression.Gzip))

    assert _run({"Echo": _unary(echo)}, body) == b"z" * 5000


def test_typed_messages_through_the_deserializers() -> None:
    from reactantserver.core.protocol import grpc_service_pb2 as pb

    async def live(request: pb.ServerLiveRequest, context: RpcContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    handler = grpc.unary_unary_rpc_method_handler(
        live,
        request_deserializer=pb.ServerLiveRequest.FromString,
        response_serializer=pb.ServerLiveResponse.SerializeToString,
    )

    async def body(channel: grpc.aio.Channel, port: int) -> Any:
        stub = channel.unary_unary(
            f"/{SERVICE}/Live",
            request_serializer=pb.ServerLiveRequest.SerializeToString,
            response_deserializer=pb.ServerLiveResponse.FromString,
        )
        return await stub(pb.ServerLiveRequest())

    assert _run({"Live": handler}, body).live


def test_a_plain_http_request_is_told_this_port_speaks_grpc() -> None:
    async def body(channel: grpc.aio.Channel, port: int) -> int:
        def fetch() -> int:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/", data=b"{}")
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    return int(answer.status)
            except urllib.error.HTTPError as error:
                return error.code

        return await asyncio.to_thread(fetch)

    assert _run({}, body) == 415


def test_a_taken_port_fails_at_once() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        front = GrpcFront(max_recv_msg_bytes=1024, max_send_msg_bytes=1024)
        with pytest.raises(RuntimeError, match="Failed to bind"):
            front.add_port(f"127.0.0.1:{taken.getsockname()[1]}")


def test_stop_lets_a_call_in_flight_finish_within_the_grace() -> None:
    async def slowish(request: bytes, context: RpcContext) -> bytes:
        await asyncio.sleep(0.3)
        return b"done"

    async def main() -> Any:
        front, port = _front({"Slow": _unary(slowish)})
        await front.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = asyncio.ensure_future(_call(channel, "Slow", b""))
            await asyncio.sleep(0.1)
            await front.stop(5.0)
            return await call

    assert asyncio.run(main()) == b"done"


def test_a_flood_beyond_the_call_limit_is_shed_natively() -> None:
    async def slow(request: bytes, context: RpcContext) -> bytes:
        await asyncio.sleep(0.3)
        return b"ok"

    async def body(channel: grpc.aio.Channel, port: int) -> list[Any]:
        calls = [_status(_call(channel, "Slow", b"")) for _ in range(4)]
        return list(await asyncio.gather(*calls))

    statuses = _run({"Slow": _unary(slow)}, body, max_concurrent_calls=2)
    codes = sorted(code.name for code, _ in statuses)
    assert codes == ["OK", "OK", "UNAVAILABLE", "UNAVAILABLE"], statuses


def test_the_backstop_sits_well_above_the_in_flight_cap() -> None:
    from reactantserver.core.front import flood_backstop

    assert flood_backstop(0) == 0  # no cap, no backstop
    assert flood_backstop(4) == 256
    assert flood_backstop(64) == 512


def test_client_keepalive_pings_are_answered_on_an_idle_connection() -> None:
    async def echo(request: bytes, context: RpcContext) -> bytes:
        return request

    async def main() -> list[bytes]:
        front, port = _front({"Echo": _unary(echo)})
        await front.start()
        options = [
            ("grpc.keepalive_time_ms", 100),
            ("grpc.keepalive_timeout_ms", 1000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
                first = await _call(channel, "Echo", b"a")
                await asyncio.sleep(1.5)  # ~15 pings on the idle connection, each answered
                assert channel.get_state() is grpc.ChannelConnectivity.READY
                return [first, await _call(channel, "Echo", b"b")]
        finally:
            await front.stop(1.0)

    assert asyncio.run(main()) == [b"a", b"b"]
