"""The worker's forwarding lane (:class:`LaneServer`) over a real Unix socket.

A small serving object stands in for the inference service (echo, errors, a slow model, a
large answer); the tests speak the frames of :mod:`reactantserver.core.lane` over raw asyncio
connections, on the uvloop loop production uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
import uvloop

from reactantserver.core.config import TracingConfig
from reactantserver.core.errors import InvalidArgumentError, ModelNotFoundError
from reactantserver.core.lane import RESPONSE_HEADER, Kind, request_frame, traced_body
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.tracing import Tracing
from reactantserver.worker.transport.lane import LaneServer

WAIT_S = 2.0


class Serving:
    """Echoes ``request.id``; ``missing``/``bad`` raise, ``slow`` sleeps, ``big`` is large."""

    def __init__(self) -> None:
        self.remaining: dict[str, float | None] = {}
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.tracing = Tracing(TracingConfig(), service="test")
        #: ``(request id, trace context, transport)`` of each call served traced.
        self.traced: list[tuple[str, tuple[tuple[str, Any], ...], str]] = []

    async def serve_traced(
        self,
        request: pb.ModelInferRequest,
        time_remaining: float | None,
        metadata: Iterable[tuple[str, Any]],
        transport: str,
    ) -> pb.ModelInferResponse:
        self.traced.append((request.id, tuple(metadata), transport))
        return await self.serve(request, time_remaining)

    async def serve(
        self, request: pb.ModelInferRequest, time_remaining: float | None
    ) -> pb.ModelInferResponse:
        self.remaining[request.id] = time_remaining
        model = request.model_name
        if model == "missing":
            raise ModelNotFoundError(f"model '{request.id}'\n   is not   found")
        if model == "bad":
            raise InvalidArgumentError("input 'x' has the wrong shape")
        if model == "boom":
            raise RuntimeError("not a ReactantError")
        if model == "slow":
            self.started.append(request.id)
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.append(request.id)
                raise
        if model == "jitter":
            await asyncio.sleep((int(request.id) % 5) * 0.002)
        response = pb.ModelInferResponse(model_name=model, id=request.id)
        if model == "big":
            response.raw_output_contents.append(b"x" * 4096)
        return response


def infer(call_id: int, model: str, request_id: str, timeout: float | None = 5.0) -> bytes:
    body = pb.ModelInferRequest(model_name=model, id=request_id).SerializeToString()
    return request_frame(call_id, Kind.INFER, body, timeout)


class Peer:
    """A raw client connection to the lane (closed by :func:`serving` at the latest)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, lane: LaneServer, *, greet: bool = True) -> Peer:
        reader, writer = await asyncio.open_unix_connection(lane.advert.path)
        peer = cls(reader, writer)
        PEERS.append(peer)
        if greet:
            await peer.send(request_frame(0, Kind.HELLO, lane.advert.token.encode()))
            assert await peer.answer() == (0, 0, b"")
        return peer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self) -> tuple[int, int, bytes]:
        """The next response frame: ``(call id, status code, body)``."""
        header = await asyncio.wait_for(self.reader.readexactly(RESPONSE_HEADER.size), WAIT_S)
        length, call_id, code = RESPONSE_HEADER.unpack(header)
        body = await asyncio.wait_for(self.reader.readexactly(length), WAIT_S)
        return call_id, code, body

    async def rest(self) -> bytes:
        """Everything until the lane closes the connection."""
        with contextlib.suppress(ConnectionResetError):
            return await asyncio.wait_for(self.reader.read(), WAIT_S)
        return b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


PEERS: list[Peer] = []


@contextlib.asynccontextmanager
async def serving(
    service: Serving, *, max_recv: int = 1 << 20, max_send: int = 1 << 20
) -> AsyncIterator[LaneServer]:
    lane = await LaneServer.open(service, max_recv=max_recv, max_send=max_send)
    try:
        yield lane
    finally:
        while PEERS:
            await PEERS.pop().close()
        await lane.close()


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0.002)


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    uvloop.run(main())


def code(status: grpc.StatusCode) -> int:
    number: int = status.value[0]
    return number


def test_private_directory_removed_on_close() -> None:
    async def main() -> None:
        lane = await LaneServer.open(Serving(), max_recv=1 << 20, max_send=1 << 20)
        socket_path = Path(lane.advert.path)
        directory = socket_path.parent
        assert socket_path.is_absolute()
        assert stat.S_ISSOCK(socket_path.stat().st_mode)
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert len(lane.advert.token) >= 32
        other = await LaneServer.open(Serving(), max_recv=1 << 20, max_send=1 << 20)
        assert other.advert.token != lane.advert.token
        assert Path(other.advert.path).parent != directory
        await other.close()
        await lane.close()
        assert not directory.exists()

    run(main)


@pytest.mark.parametrize("token", [b"", b"wrong", b"x" * 64])
def test_wrong_token_closes_without_answer(token: bytes) -> None:
    async def main() -> None:
        service = Serving()
        async with serving(service) as lane:
            peer = await Peer.connect(lane, greet=False)
            await peer.send(request_frame(0, Kind.HELLO, token) + infer(1, "echo", "a"))
            assert await peer.rest() == b""
            await peer.close()
            await until(lambda: not lane.connections)
        assert service.remaining == {}

    run(main)


@pytest.mark.parametrize("kind", [Kind.INFER, Kind.CANCEL])
def test_anything_before_hello_closes_without_answer(kind: Kind) -> None:
    async def main() -> None:
        service = Serving()
        async with serving(service) as lane:
            peer = await Peer.connect(lane, greet=False)
            token = lane.advert.token.encode()
            # Even carrying the token, a first frame that is not HELLO is refused.
            await peer.send(request_frame(0, kind, token) + request_frame(1, Kind.HELLO, token))
            assert await peer.rest() == b""
            await peer.close()
        assert service.remaining == {}

    run(main)


def test_oversized_hello_closes_without_answer() -> None:
    async def main() -> None:
        async with serving(Serving(), max_recv=16) as lane:
            peer = await Peer.connect(lane, greet=False)
            await peer.send(request_frame(0, Kind.HELLO, lane.advert.token.encode()))
            assert await peer.rest() == b""
            await peer.close()

    run(main)


def test_infer_ok_echoes_id_and_passes_time_remaining() -> None:
    async def main() -> None:
        service = Serving()
        async with serving(service) as lane:
            peer = await Peer.connect(lane)
            await peer.send(infer(7, "echo", "req-1", timeout=2.5))
            call_id, status, body = await peer.answer()
            assert (call_id, status) == (7, 0)
            response = pb.ModelInferResponse.FromString(body)
            assert (response.id, response.model_name) == ("req-1", "echo")
            await peer.send(infer(8, "echo", "req-2", timeout=None))
            call_id, status, body = await peer.answer()
            assert (call_id, status) == (8, 0)
            assert pb.ModelInferResponse.FromString(body).id == "req-2"
            await peer.close()
        assert service.remaining == {"req-1": 2.5, "req-2": None}
        assert not any(isinstance(v, float) and math.isnan(v) for v in service.remaining.values())

    run(main)


def test_reactant_error_status_and_message() -> None:
    async def main() -> None:
        async with serving(Serving()) as lane:
            peer = await Peer.connect(lane)
            await peer.send(infer(1, "missing", "m1") + infer(2, "bad", "b1"))
            answers = {
                call_id: (status, body)
                for call_id, status, body in [await peer.answer(), await peer.answer()]
            }
            assert answers == {
                # Whitespace is collapsed, as the gRPC port does.
                1: (code(grpc.StatusCode.NOT_FOUND), b"model 'm1' is not found"),
                2: (code(grpc.StatusCode.INVALID_ARGUMENT), b"input 'x' has the wrong shape"),
            }
            await peer.close()

    run(main)


def test_an_unknown_frame_kind_is_unimplemented_and_the_connection_survives() -> None:
    async def main() -> None:
        service = Serving()
        async with serving(service) as lane:
            peer = await Peer.connect(lane)
            await peer.send(request_frame(7, cast(Kind, 200), b"from a newer gateway", 1.0))
            call_id, status, body = await peer.answer()
            assert (call_id, status) == (7, code(grpc.StatusCode.UNIMPLEMENTED))
            assert body == b"lane: unknown frame kind 200"
            await peer.send(infer(8, "echo", "after"))
            assert (await peer.answer())[:2] == (8, 0)
            await peer.close()

    run(main)


def test_malformed_body_is_invalid_argument() -> None:
    async def main() -> None:
        service = Serving()
        async with serving(service) as lane:
            peer = await Peer.connect(lane)
            await peer.send(request_frame(3, Kind.INFER, b"\x0a\x05ab", 1.0))
            call_id, status, body = await peer.answer()
            assert (call_id, status) == (3, code(grpc.StatusCode.INVALID_ARGUMENT))
            assert body.startswith(b"malformed ModelInferRequest")
            # The connection stays usable.
            await peer.send(infer(4, "echo", "after"))
            assert (await peer.answer())[:2] == (4, 0)
            await peer.close()
        assert list(service.remaining) == ["after"]

    run(main)


@pytest.mark.parametrize("streamed", [False, True], ids=["one-write", "streamed"])
def test_oversized_frame_is_resource_exhausted_and_connection_survives(streamed: bool) -> None:
    async def main() -> None:
        service = Serving()
        async with serving(service, max_recv=1024) as lane:
            peer = await Peer.connect(lane)
            data = request_frame(1, Kind.INFER, b"z" * 2000, 1.0) + infer(2, "echo", "next")
            if streamed:
                for start in range(0, len(data), 100):
                    await peer.send(data[start : start + 100])
                    await asyncio.sleep(0)
            else:
                await peer.send(data)
            assert await peer.answer() == (
                1,
                code(grpc.StatusCode.RESOURCE_EXHAUSTED),
                b"Received message larger than max (2000 vs. 1024)",
            )
            call_id, status, body = await peer.answer()
            assert (call_id, status) == (2, 0)
            assert pb.ModelInferResponse.FromString(body).id == "next"
            await peer.close()
        assert list(service.remaining) == ["next"]

    run(main)


def test_response_over_max_send_is_resource_exhausted() -> None:
    async def main() -> None:
        async with serving(Serving(), max_send=1024) as lane:
            peer = await Peer.connect(lane)
            await peer.send(infer(5, "big", "b"))
            call_id, status, body = await peer.answer()
            assert (call_id, status) == (5, code(grpc.StatusCode.RESOURCE_EXHAUSTED))
            assert body.startswith(b"Sent message larger than max (")
            assert body.endswith(b" vs. 1024)")
            await peer.send(infer(6, "echo", "small"))
            assert (await peer.answer())[:2] == (6, 0)
            await peer.close()

    run(main)


def test_cancel_stops_the_running_call_without_answer() -> None:
    async def main() -> None:
        service = Serving()
        async with serving(service) as lane:
            peer = await Peer.connect(lane)
            await peer.send(infer(3, "slow", "s3") + infer(4, "slow", "s4"))
            await until(lambda: len(service.started) == 2)
            await peer.send(request_frame(3, Kind.CANCEL))
            await until(lambda: service.cancelled == ["s3"])
            # Unknown ids are ignored; the connection keeps serving, and s3 never answers.
            await peer.send(request_frame(99, Kind.CANCEL) + infer(5, "echo", "e5"))
            assert (await peer.answer())[:2] == (5, 0)
            await peer.close()
            # The connection's end cancels the other one.
            await until(lambda: service.cancelled == ["s3", "s4"])

    run(main)


def test_dropping_the_connection_cancels_its_calls_only() -> None:
    async def main() -> None:
        service = Serving()
        async with serving(service) as lane:
            keeper = await Peer.connect(lane)
            await keeper.send(infer(1, "slow", "kept"))
            dropped = await Peer.connect(lane)
            await dropped.send(infer(1, "slow", "d1") + infer(2, "slow", "d2"))
            await until(lambda: len(service.started) == 3)
            assert len(lane.connections) == 2
            await dropped.close()
            await until(lambda: sorted(service.cancelled) == ["d1", "d2"])
            await until(lambda: len(lane.connections) == 1)
            await keeper.send(infer(2, "echo", "alive"))
            assert (await keeper.answer())[:2] == (2, 0)
            await lane.close()
            await until(lambda: "kept" in service.cancelled)
            assert await keeper.rest() == b""
            await keeper.close()

    run(main)


def test_many_concurrent_calls_each_get_their_own_answer() -> None:
    async def main() -> None:
        service = Serving()
        async with serving(service) as lane:
            peer = await Peer.connect(lane)
            ids = range(100, 160)
            await peer.send(b"".join(infer(i, "jitter", str(i * 7)) for i in ids))
            answers = {}
            for _ in ids:
                call_id, status, body = await peer.answer()
                assert status == 0
                answers[call_id] = pb.ModelInferResponse.FromString(body).id
            assert answers == {i: str(i * 7) for i in ids}
            await peer.close()

    run(main)


def test_an_unexpected_error_is_internal_and_the_connection_survives() -> None:
    async def main() -> None:
        async with serving(Serving()) as lane:
            peer = await Peer.connect(lane)
            await peer.send(infer(1, "boom", "b1"))
            call_id, status, body = await peer.answer()
            assert (call_id, status) == (1, code(grpc.StatusCode.INTERNAL))
            assert b"not a ReactantError" in body
            await peer.send(infer(2, "echo", "e2"))
            assert (await peer.answer())[:2] == (2, 0)

    run(main)


def test_a_reused_id_still_cancels_both_calls_when_the_connection_drops() -> None:
    async def main() -> None:
        service = Serving()
        async with serving(service) as lane:
            peer = await Peer.connect(lane)
            await peer.send(infer(3, "slow", "a") + infer(3, "slow", "b"))
            await until(lambda: len(service.started) == 2)
            await peer.close()
            await until(lambda: sorted(service.cancelled) == ["a", "b"])

    run(main)


def test_close_waits_for_the_cancelled_calls() -> None:
    async def main() -> None:
        service = Serving()
        lane = await LaneServer.open(service, max_recv=1 << 20, max_send=1 << 20)
        peer = await Peer.connect(lane)
        await peer.send(infer(1, "slow", "s"))
        await until(lambda: service.started == ["s"])
        await lane.close()
        assert service.cancelled == ["s"]  # already unwound when close() returns
        PEERS.remove(peer)
        await peer.close()

    run(main)


def test_stale_lane_directories_are_swept_and_live_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed worker leaves its directory; the next lane to open removes it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old = time.time() - 3600

    def aged(name: str, *, socket_file: bool) -> Path:
        directory = tmp_path / name
        directory.mkdir(mode=0o700)
        if socket_file:  # a socket nobody listens on any more
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
                dead.bind(str(directory / "lane.sock"))
        os.utime(directory, (old, old))
        return directory

    async def main() -> None:
        dead = aged("reactant-lane-dead", socket_file=True)
        empty = aged("reactant-lane-empty", socket_file=False)
        fresh = tmp_path / "reactant-lane-fresh"
        fresh.mkdir(mode=0o700)  # young: its worker may be about to bind
        other = aged("unrelated-dir", socket_file=False)
        live = await LaneServer.open(Serving(), max_recv=1 << 10, max_send=1 << 10)
        live_directory = Path(live.advert.path).parent
        os.utime(live_directory, (old, old))
        second = await LaneServer.open(Serving(), max_recv=1 << 10, max_send=1 << 10)
        try:
            assert not dead.exists()
            assert not empty.exists()
            assert fresh.exists()
            assert other.exists()
            assert live_directory.exists()
            assert Path(second.advert.path).parent.parent == tmp_path
        finally:
            await live.close()
            await second.close()

    run(main)


def test_traced_frames_hand_their_context_to_the_service_while_tracing() -> None:
    parent = (("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),)

    async def main() -> None:
        service = Serving()
        async with serving(service) as lane:
            peer = await Peer.connect(lane)
            body = pb.ModelInferRequest(model_name="echo", id="off").SerializeToString()
            await peer.send(request_frame(1, Kind.TRACED_INFER, traced_body(parent, body), 2.5))
            call_id, status, answer = await peer.answer()
            assert (call_id, status) == (1, 0)
            assert pb.ModelInferResponse.FromString(answer).id == "off"
            assert service.traced == []  # tracing is off: the context is dropped
            service.tracing.active = True
            body = pb.ModelInferRequest(model_name="echo", id="on").SerializeToString()
            await peer.send(request_frame(2, Kind.TRACED_INFER, traced_body(parent, body), 2.5))
            assert (await peer.answer())[:2] == (2, 0)
            await peer.send(infer(3, "echo", "plain"))
            assert (await peer.answer())[:2] == (3, 0)
            await peer.close()
        assert service.traced == [("on", parent, "lane"), ("plain", (), "lane")]

    run(main)
