"""The gateway's end of the forwarding lane: :class:`LaneClient` and ``WorkerLink.adopt_lane``.

A small asyncio Unix server stands in for a worker's lane: it speaks the frames of
:mod:`reactantserver.core.lane`, greets a known token and answers ``INFER`` frames as each
test scripts (echo, a status, silence, an oversized body); it records the ``CANCEL`` frames
and the connections it accepted. Runs on the uvloop loop production uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import uvloop

from reactantserver.core.lane import REQUEST_HEADER, Advert, FrameReader, Kind, response_frame
from reactantserver.gateway.workers import lane as lane_module
from reactantserver.gateway.workers.lane import LaneClient, LaneError
from reactantserver.gateway.workers.link import ChannelSettings, WorkerLink

TOKEN = "0123456789abcdef"
WAIT_S = 2.0
MB = 1 << 20
SETTINGS = ChannelSettings(max_send_msg_bytes=MB, max_recv_msg_bytes=MB, max_concurrent_streams=4)
#: A worker's gRPC address that no test dials (the lane answers, or nothing is called).
NEVER_DIALLED = "127.0.0.1:1"


def script(call_id: int, body: bytes) -> bytes | None:
    """The fake worker's answer: echo reversed; ``status:<n>:<msg>``; ``hang``; ``big:<n>``."""
    if body == b"hang":
        return None
    if body.startswith(b"status:"):
        _, number, message = body.split(b":", 2)
        return response_frame(call_id, int(number), message)
    if body.startswith(b"big:"):
        return response_frame(call_id, 0, b"x" * int(body[4:]))
    return response_frame(call_id, 0, body[::-1])


class FakeLane:
    """A worker's lane socket at ``path``: greets ``token``, answers by :func:`script`."""

    def __init__(self, path: Path, token: str = TOKEN, *, hello_status: int = 0) -> None:
        self.path = path
        self.token = token
        self.hello_status = hello_status
        self.accepts = 0
        self.infers: list[tuple[int, bytes, float]] = []
        self.cancels: list[int] = []
        self.writers: set[asyncio.StreamWriter] = set()

    @property
    def advert(self) -> Advert:
        return Advert.of(self.token, str(self.path))

    async def drop(self) -> None:
        """Close every accepted connection (the worker went away)."""
        for writer in list(self.writers):
            writer.close()
        await until(lambda: not self.writers)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepts += 1
        self.writers.add(writer)
        frames = FrameReader(REQUEST_HEADER, limit=MB)
        greeted = False
        try:
            while data := await reader.read(1 << 16):
                for (_, call_id, kind, timeout), body in frames.feed(data):
                    assert body is not None
                    if not greeted:
                        if kind != Kind.HELLO or body != self.token.encode():
                            return
                        writer.write(response_frame(int(call_id), self.hello_status, b"no"))
                        greeted = True
                    elif kind == Kind.CANCEL:
                        self.cancels.append(int(call_id))
                    elif kind == Kind.INFER:
                        self.infers.append((int(call_id), body, float(timeout)))
                        answer = script(int(call_id), body)
                        if answer is not None:
                            writer.write(answer)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self.writers.discard(writer)


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0.002)


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    uvloop.run(main())


@pytest.fixture
def sockets() -> Iterator[Path]:
    """A short directory for sockets (``tmp_path`` can pass the 107-byte limit)."""
    directory = Path(tempfile.mkdtemp(prefix="lane-", dir="/tmp"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.asynccontextmanager
async def fake_lane(path: Path, token: str = TOKEN, **kwargs: int) -> AsyncIterator[FakeLane]:
    fake = FakeLane(path, token, **kwargs)
    server = await asyncio.start_unix_server(fake.handle, str(path))
    try:
        yield fake
    finally:
        server.close()
        await fake.drop()
        await server.wait_closed()
        path.unlink(missing_ok=True)


async def connect(fake: FakeLane, *, max_recv: int = MB) -> LaneClient:
    return await LaneClient.connect(fake.advert, label="w0", max_recv=max_recv)


def test_connect_and_call(sockets: Path) -> None:
    async def main() -> None:
        async with fake_lane(sockets / "a.sock") as fake:
            lane = await connect(fake)
            assert lane.open
            assert lane.advert == fake.advert
            assert await lane.call(b"abc", timeout=1.5) == b"cba"
            assert await lane.call(b"", timeout=None) == b""
            (first, body, timeout), (second, _, no_timeout) = fake.infers
            assert (body, timeout) == (b"abc", 1.5)
            assert math.isnan(no_timeout)
            assert first != second
            pending = asyncio.create_task(lane.call(b"hang", timeout=None))
            await until(lambda: len(fake.infers) == 3)
            lane.close()
            assert not lane.open
            with pytest.raises(LaneError) as caught:
                await pending
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            with pytest.raises(LaneError) as caught:
                await lane.call(b"abc", timeout=1.0)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert fake.accepts == 1

    run(main)


def test_concurrent_calls_answered_out_of_order(sockets: Path) -> None:
    async def main() -> None:
        async with fake_lane(sockets / "a.sock") as fake:
            lane = await connect(fake)
            bodies = [f"body-{n}".encode() for n in range(40)]
            answers = await asyncio.gather(*(lane.call(b, timeout=WAIT_S) for b in bodies))
            assert answers == [b[::-1] for b in bodies]
            assert len({call_id for call_id, _, _ in fake.infers}) == 40
            lane.close()

    run(main)


@pytest.mark.parametrize(
    ("number", "status"),
    [
        (3, grpc.StatusCode.INVALID_ARGUMENT),
        (5, grpc.StatusCode.NOT_FOUND),
        (8, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (14, grpc.StatusCode.UNAVAILABLE),
        (99, grpc.StatusCode.UNKNOWN),
    ],
)
def test_status_frame_is_lane_error(sockets: Path, number: int, status: grpc.StatusCode) -> None:
    async def main() -> None:
        async with fake_lane(sockets / "a.sock") as fake:
            lane = await connect(fake)
            with pytest.raises(LaneError) as caught:
                await lane.call(f"status:{number}:model 'm' ✗ failed".encode(), timeout=1.0)
            assert caught.value.code() == status
            assert caught.value.details() == "model 'm' ✗ failed"
            assert lane.open  # a status is one call's outcome, not the connection's
            assert await lane.call(b"ok", timeout=1.0) == b"ko"
            lane.close()

    run(main)


def test_timeout_is_deadline_exceeded_and_sends_cancel(sockets: Path) -> None:
    async def main() -> None:
        async with fake_lane(sockets / "a.sock") as fake:
            lane = await connect(fake)
            with pytest.raises(LaneError) as caught:
                await lane.call(b"hang", timeout=0.05)
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await until(lambda: bool(fake.cancels))
            [(call_id, _, timeout)] = fake.infers
            assert fake.cancels == [call_id]
            assert timeout == 0.05
            assert lane.open
            assert await lane.call(b"next", timeout=1.0) == b"txen"
            lane.close()

    run(main)


def test_cancelling_the_caller_sends_cancel(sockets: Path) -> None:
    async def main() -> None:
        async with fake_lane(sockets / "a.sock") as fake:
            lane = await connect(fake)
            task = asyncio.create_task(lane.call(b"hang", timeout=None))
            await until(lambda: bool(fake.infers))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await until(lambda: bool(fake.cancels))
            assert fake.cancels == [fake.infers[0][0]]
            assert await lane.call(b"next", timeout=1.0) == b"txen"
            lane.close()

    run(main)


def test_connection_lost_fails_pending_and_later_calls(sockets: Path) -> None:
    async def main() -> None:
        async with fake_lane(sockets / "a.sock") as fake:
            lane = await connect(fake)
            calls = [asyncio.create_task(lane.call(b"hang", timeout=None)) for _ in range(3)]
            await until(lambda: len(fake.infers) == 3)
            await fake.drop()
            outcomes = await asyncio.wait_for(
                asyncio.gather(*calls, return_exceptions=True), WAIT_S
            )
            for outcome in outcomes:
                assert isinstance(outcome, LaneError)
                assert outcome.code() == grpc.StatusCode.UNAVAILABLE
                assert "w0" in outcome.details()
            assert not lane.open
            with pytest.raises(LaneError) as caught:
                await asyncio.wait_for(lane.call(b"abc", timeout=None), 0.5)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert len(fake.infers) == 3
            lane.close()

    run(main)


@pytest.mark.parametrize("hello_status", [0, 7], ids=["closed", "refused"])
def test_wrong_token_or_refused_hello_raises_oserror(sockets: Path, hello_status: int) -> None:
    async def main() -> None:
        async with fake_lane(sockets / "a.sock", hello_status=hello_status) as fake:
            advert = fake.advert if hello_status else Advert.of("not-the-token", str(fake.path))
            with pytest.raises(OSError, match="lane refused the greeting"):
                await LaneClient.connect(advert, label="w0", max_recv=MB)
            assert fake.accepts == 1

    run(main)


def test_unreachable_socket_raises_oserror(sockets: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lane_module, "CONNECT_TIMEOUT_S", 0.05)
    refusing = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    refusing.bind(str(sockets / "bound.sock"))  # bound, never listening
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(sockets / "mute.sock"))
    mute.listen()  # never accepts, so never answers the HELLO

    async def main() -> None:
        for name, error in (
            ("missing.sock", FileNotFoundError),
            ("bound.sock", ConnectionRefusedError),
            ("mute.sock", OSError),
        ):
            with pytest.raises(error):
                await LaneClient.connect(
                    Advert.of(TOKEN, str(sockets / name)), label="w0", max_recv=MB
                )

    try:
        run(main)
    finally:
        refusing.close()
        mute.close()


def test_oversized_response_is_resource_exhausted_and_next_call_works(sockets: Path) -> None:
    async def main() -> None:
        async with fake_lane(sockets / "a.sock") as fake:
            lane = await connect(fake, max_recv=64)
            for size in (65, 300_000):  # one chunk, then many
                with pytest.raises(LaneError) as caught:
                    await lane.call(f"big:{size}".encode(), timeout=WAIT_S)
                assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert caught.value.details() == f"Received message larger than max ({size} vs. 64)"
                assert lane.open
                assert await lane.call(b"small", timeout=WAIT_S) == b"llams"
            assert await lane.call(b"big:64", timeout=WAIT_S) == b"x" * 64
            lane.close()

    run(main)


# -- WorkerLink.adopt_lane ---------------------------------------------------------------


def test_adopt_reachable_lane_and_infer_over_it(sockets: Path) -> None:
    async def main() -> None:
        async with fake_lane(sockets / "a.sock") as fake:
            link = WorkerLink(NEVER_DIALLED, "w0", SETTINGS)
            await link.adopt_lane(fake.advert)
            lane = link.lane
            assert lane is not None
            assert lane.open
            assert lane.advert == fake.advert
            await link.adopt_lane(fake.advert)  # same advert, open lane: kept
            assert link.lane is lane
            assert fake.accepts == 1
            assert await link.infer(b"abc", timeout=1.0) == b"cba"
            assert fake.infers[0][1:] == (b"abc", 1.0)
            # A lost lane is reopened at the next adopt of the same advert.
            await fake.drop()
            await until(lambda: not lane.open)
            await link.adopt_lane(fake.advert)
            assert link.lane is not None
            assert link.lane is not lane
            assert link.lane.open
            assert fake.accepts == 2
            current = link.lane
            await link.close()
            assert link.lane is None
            assert not current.open

    run(main)


def test_unreachable_advert_is_not_retried(sockets: Path) -> None:
    async def main() -> None:
        path = sockets / "late.sock"
        link = WorkerLink(NEVER_DIALLED, "w0", SETTINGS)
        advert = Advert.of(TOKEN, str(path))
        await link.adopt_lane(advert)
        assert link.lane is None
        async with fake_lane(path) as fake:
            await link.adopt_lane(advert)  # reachable now, but the same advert
            assert link.lane is None
            assert fake.accepts == 0
            # A different advert (the worker restarted its lane) is tried.
            await link.adopt_lane(Advert.of("fedcba9876543210", str(path)))
            assert fake.accepts == 1
            assert link.lane is None  # wrong token for this fake: refused, gRPC serves
            async with fake_lane(sockets / "b.sock") as other:
                await link.adopt_lane(other.advert)
                assert link.lane is not None
                assert link.lane.open
            await link.close()

    run(main)


def test_new_advert_replaces_lane_and_none_drops_it(sockets: Path) -> None:
    async def main() -> None:
        async with fake_lane(sockets / "a.sock") as first, fake_lane(sockets / "b.sock") as second:
            link = WorkerLink(NEVER_DIALLED, "w0", SETTINGS)
            await link.adopt_lane(first.advert)
            old = link.lane
            assert old is not None
            await link.adopt_lane(second.advert)
            assert not old.open
            assert link.lane is not None
            assert link.lane.advert == second.advert
            assert link.lane.open
            await until(lambda: not first.writers)  # the old connection was closed
            current = link.lane
            await link.adopt_lane(None)
            assert link.lane is None
            assert not current.open
            await until(lambda: not second.writers)
            assert (first.accepts, second.accepts) == (1, 1)
            await link.close()

    run(main)


@pytest.mark.parametrize(
    "settings",
    [
        ChannelSettings(MB, MB, 4, ca_file="/nonexistent/ca.pem"),
        ChannelSettings(MB, MB, 4, cert_file="/nonexistent/cert.pem"),
        ChannelSettings(MB, MB, 4, lane=False),
    ],
    ids=["ca_file", "cert_file", "lane-off"],
)
def test_use_lane_false_never_connects(sockets: Path, settings: ChannelSettings) -> None:
    assert not settings.use_lane
    assert SETTINGS.use_lane

    async def main() -> None:
        async with fake_lane(sockets / "a.sock") as fake:
            link = WorkerLink(NEVER_DIALLED, "w0", settings)
            await link.adopt_lane(fake.advert)
            assert link.lane is None
            assert fake.accepts == 0
            await link.close()

    run(main)
