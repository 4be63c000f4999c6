"""The worker's end of the forwarding lane (:mod:`reactantserver.core.lane`).

A Unix socket in a fresh private directory (0700) that serves ``ModelInfer`` bodies with the
same :meth:`InferenceService.serve` the gRPC port uses, so statuses, statistics, metrics and
deadlines are the same whichever way a request came. The gateway finds it through the advert
in the ``ServerReady`` initial metadata; a connection must first send the advert's token::

    lane = await LaneServer.open(service, max_recv=..., max_send=...)
    lane.advert          # "<token>@/tmp/reactant-lane-xxxx/lane.sock"
    await lane.close()   # cancels what is still running, removes the directory
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, cast

import grpc
from google.protobuf.message import DecodeError

from reactantserver.core.errors import ReactantError, status_message, status_of
from reactantserver.core.lane import (
    REQUEST_HEADER,
    Advert,
    FrameReader,
    Kind,
    oversize_message,
    response_frame,
    split_traced,
)
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.tracing import Tracing

__all__ = ["LaneServer"]

_log = logging.getLogger("reactantserver.worker.lane")

_SOCKET_NAME = "lane.sock"
_PREFIX = "reactant-lane-"
#: A lane directory younger than this is never swept (its worker may be binding right now).
_SWEEP_MIN_AGE_S = 60.0


class Serving(Protocol):
    """What the lane needs of the inference service."""

    @property
    def tracing(self) -> Tracing: ...

    async def serve(
        self, request: pb.ModelInferRequest, time_remaining: float | None
    ) -> pb.ModelInferResponse: ...

    async def serve_traced(
        self,
        request: pb.ModelInferRequest,
        time_remaining: float | None,
        metadata: Iterable[tuple[str, Any]],
        transport: str,
    ) -> pb.ModelInferResponse: ...


class LaneServer:
    """The listening socket, its directory and its open connections."""

    def __init__(self, server: asyncio.AbstractServer, directory: Path, advert: Advert) -> None:
        self._server = server
        self._directory = directory
        self.advert = advert
        self.connections: set[_Connection] = set()

    @classmethod
    async def open(cls, service: Serving, *, max_recv: int, max_send: int) -> LaneServer:
        """Listen on a new socket (``OSError`` if the platform or path does not allow it)."""
        _sweep_stale(Path(tempfile.gettempdir()))
        directory = Path(tempfile.mkdtemp(prefix=_PREFIX))
        path = directory / _SOCKET_NAME
        token = secrets.token_hex(16)
        lane: LaneServer | None = None

        def connection() -> _Connection:
            assert lane is not None
            return _Connection(lane, service, token, max_recv=max_recv, max_send=max_send)

        try:
            server = await asyncio.get_running_loop().create_unix_server(connection, str(path))
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        lane = cls(server, directory, Advert.of(token, str(path)))
        return lane

    async def close(self) -> None:
        """Stop listening, cancel running calls (and wait for them), remove the directory."""
        self._server.close()
        running: list[asyncio.Task[None]] = []
        for connection in list(self.connections):
            running.extend(connection.running())
            connection.abort()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._server.wait_closed()
        shutil.rmtree(self._directory, ignore_errors=True)


def _sweep_stale(root: Path) -> None:
    """Remove lane directories of this user that nobody listens on (a killed worker's)."""
    uid = os.getuid()
    now = time.time()
    for directory in root.glob(f"{_PREFIX}*"):
        try:
            info = directory.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
                continue
            if now - info.st_mtime < _SWEEP_MIN_AGE_S:
                continue
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(directory / _SOCKET_NAME))
        except (ConnectionRefusedError, FileNotFoundError):
            shutil.rmtree(directory, ignore_errors=True)
        except OSError:
            continue  # not ours to judge (permissions, a live socket's backlog, ...)


class _Connection(asyncio.Protocol):
    """One gateway connection: ``HELLO`` first, then any number of concurrent calls."""

    def __init__(
        self, lane: LaneServer, service: Serving, token: str, *, max_recv: int, max_send: int
    ) -> None:
        self._lane = lane
        self._service = service
        self._token = token.encode()
        self._max_send = max_send
        self._reader = FrameReader(REQUEST_HEADER, limit=max_recv)
        self._max_recv = max_recv
        self._transport: asyncio.Transport | None = None
        self._greeted = False
        self._calls: dict[int, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._lane.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lane.connections.discard(self)
        for task in self._tasks:
            task.cancel()  # the caller is gone, as a cancelled gRPC call
        self._calls.clear()
        self._transport = None

    def running(self) -> list[asyncio.Task[None]]:
        """The calls still being served."""
        return [task for task in self._tasks if not task.done()]

    def abort(self) -> None:
        """Drop the connection (worker shutdown)."""
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        for fields, body in self._reader.feed(data):
            length, call_id, kind = int(fields[0]), int(fields[1]), int(fields[2])
            if not self._greeted:
                if (
                    kind != Kind.HELLO
                    or body is None
                    or not secrets.compare_digest(body, self._token)
                ):
                    _log.warning("lane: a connection without the right token; closing it")
                    self.abort()
                    return
                self._greeted = True
                self._write(response_frame(call_id, 0, b""))
            elif kind in {Kind.INFER, Kind.TRACED_INFER}:
                if body is None:
                    message = oversize_message("Received", length, self._max_recv)
                    self._answer_error(call_id, grpc.StatusCode.RESOURCE_EXHAUSTED, message)
                    continue
                timeout = float(fields[3])
                context: tuple[tuple[str, str], ...] = ()
                request = body
                if kind == Kind.TRACED_INFER:
                    context, request = split_traced(body)
                task = asyncio.get_running_loop().create_task(
                    self._infer(call_id, request, None if math.isnan(timeout) else timeout, context)
                )
                self._calls[call_id] = task  # a reused id: CANCEL reaches the newest call
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif kind == Kind.CANCEL:
                running = self._calls.pop(call_id, None)
                if running is not None:
                    running.cancel()
            elif kind != Kind.HELLO:
                # A frame this worker does not know (a newer gateway's): answered, so the
                # caller gets an error at once instead of waiting for its deadline.
                message = f"lane: unknown frame kind {kind}"
                self._answer_error(call_id, grpc.StatusCode.UNIMPLEMENTED, message)

    async def _infer(
        self,
        call_id: int,
        body: bytes,
        time_remaining: float | None,
        context: tuple[tuple[str, str], ...],
    ) -> None:
        try:
            try:
                request = pb.ModelInferRequest.FromString(body)
            except DecodeError as exc:
                message = f"malformed ModelInferRequest: {exc}"
                self._answer_error(call_id, grpc.StatusCode.INVALID_ARGUMENT, message)
                return
            try:
                if self._service.tracing.active:
                    response = await self._service.serve_traced(
                        request, time_remaining, context, "lane"
                    )
                else:
                    response = await self._service.serve(request, time_remaining)
            except ReactantError as exc:
                self._answer_error(call_id, status_of(exc), status_message(exc))
                return
            except Exception as exc:
                _log.exception("lane: call %d failed", call_id)
                self._answer_error(call_id, grpc.StatusCode.INTERNAL, f"internal error: {exc}")
                return
            answer = response.SerializeToString()
            if len(answer) > self._max_send:
                message = oversize_message("Sent", len(answer), self._max_send)
                self._answer_error(call_id, grpc.StatusCode.RESOURCE_EXHAUSTED, message)
                return
            self._write(response_frame(call_id, 0, answer))
        finally:
            if self._calls.get(call_id) is asyncio.current_task():
                del self._calls[call_id]

    def _answer_error(self, call_id: int, code: grpc.StatusCode, message: str) -> None:
        self._write(response_frame(call_id, code.value[0], message.encode()))

    def _write(self, frame: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(frame)
