"""The forwarding lane: a gateway's short cut to a worker on the same host.

A worker that serves gRPC without TLS also listens on a Unix socket in a private directory
(mode 0700) and names it, with a random token, in the initial metadata of its ``ServerReady``
answers (:data:`ADVERT_METADATA_KEY`). A gateway that sees the advert connects, proves it read
the advert by sending the token (``HELLO``), and from then on forwards ``ModelInfer`` bodies
over the socket instead of a second gRPC hop: the same serialized ``ModelInferRequest`` bytes
in, the same ``ModelInferResponse`` bytes or gRPC status out. Only the transport differs; the
worker serves the body with the handler its gRPC port uses. A gateway that cannot reach the
socket (another host, another user) keeps using gRPC.

Frames, little-endian, many calls in flight on one connection::

    request:  u32 body length | u32 call id | u8 kind | f64 timeout seconds (NaN: none) | body
    response: u32 body length | u32 call id | u8 gRPC status code                        | body

``INFER`` bodies are ``ModelInferRequest`` bytes, answered with ``ModelInferResponse`` bytes
(status 0) or a UTF-8 message (any other status). ``TRACED_INFER`` is an ``INFER`` that carries
the W3C trace context of the gateway's span before the request bytes
(``u16 length | traceparent, then a newline and tracestate if any | ModelInferRequest``;
:func:`traced_body`, :func:`split_traced`). ``CANCEL`` withdraws call ``id`` (no body,
no answer). ``HELLO`` carries the token and is answered with status 0 and an empty body, or
the connection is closed::

    reader = FrameReader(REQUEST_HEADER, limit=512 << 20)
    for fields, body in reader.feed(data):   # body None: over the limit, skipped
        ...
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Sequence
from typing import Final

__all__ = [
    "ADVERT_METADATA_KEY",
    "REQUEST_HEADER",
    "RESPONSE_HEADER",
    "Advert",
    "FrameReader",
    "Kind",
    "oversize_message",
    "parse_advert",
    "request_frame",
    "response_frame",
    "split_traced",
    "traced_body",
]

#: Initial-metadata key of a worker's ``ServerReady`` answer that names its lane.
ADVERT_METADATA_KEY: Final = "reactant-lane"
REQUEST_HEADER: Final = struct.Struct("<IIBd")
RESPONSE_HEADER: Final = struct.Struct("<IIB")
_MAX_ID: Final = 0xFFFFFFFF
_CONTEXT_LENGTH: Final = struct.Struct("<H")
_TRACE_KEYS: Final = ("traceparent", "tracestate")


class Kind(enum.IntEnum):
    """What a request frame asks for."""

    INFER = 0
    CANCEL = 1
    HELLO = 2
    TRACED_INFER = 3


class Advert(str):
    """``<token>@<socket path>`` as sent in the metadata (a ``str``, compared by value)."""

    @property
    def token(self) -> str:
        """The secret the connecting side sends back in its ``HELLO``."""
        return self.partition("@")[0]

    @property
    def path(self) -> str:
        """The Unix socket's path."""
        return self.partition("@")[2]

    @classmethod
    def of(cls, token: str, path: str) -> Advert:
        """The advert of a lane at ``path`` with ``token``."""
        return cls(f"{token}@{path}")


def parse_advert(value: str | bytes | None) -> Advert | None:
    """The advert in a metadata value, or ``None`` when it is absent or malformed."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not value:
        return None
    token, at, path = value.partition("@")
    if not (token and at and path.startswith("/")):
        return None
    return Advert(value)


def oversize_message(direction: str, size: int, limit: int) -> str:
    """gRPC's wording for a message over a size limit (``direction``: "Received"/"Sent")."""
    return f"{direction} message larger than max ({size} vs. {limit})"


def request_frame(
    call_id: int, kind: Kind, body: bytes = b"", timeout: float | None = None
) -> bytes:
    """One request frame (``timeout`` in seconds; ``None`` for none)."""
    seconds = math.nan if timeout is None else timeout
    return REQUEST_HEADER.pack(len(body), call_id & _MAX_ID, kind, seconds) + body


def traced_body(headers: Sequence[tuple[str, str]], body: bytes) -> bytes:
    """The body of a ``TRACED_INFER`` frame: ``headers``' trace context, then ``body``."""
    values = dict(headers)
    context = values.get("traceparent", "")
    if values.get("tracestate"):
        context += "\n" + values["tracestate"]
    encoded = context.encode("ascii", "replace")[:0xFFFF]
    return _CONTEXT_LENGTH.pack(len(encoded)) + encoded + body


def split_traced(body: bytes) -> tuple[tuple[tuple[str, str], ...], bytes]:
    """A ``TRACED_INFER`` body's trace context (metadata pairs) and its request bytes.

    A body too short for its own length prefix reads as no context and no request.
    """
    if len(body) < _CONTEXT_LENGTH.size:
        return (), b""
    (length,) = _CONTEXT_LENGTH.unpack_from(body)
    start = _CONTEXT_LENGTH.size
    context = body[start : start + length].decode("ascii", "replace")
    values = context.split("\n", 1)
    pairs = tuple((key, value) for key, value in zip(_TRACE_KEYS, values, strict=False) if value)
    return pairs, body[start + length :]


def response_frame(call_id: int, code: int, body: bytes) -> bytes:
    """One response frame (``code``: the gRPC status number, 0 for OK)."""
    return RESPONSE_HEADER.pack(len(body), call_id, code) + body


class FrameReader:
    """Splits a byte stream into ``(header fields, body)`` frames.

    A frame whose body is longer than ``limit`` is skipped as it streams in and reported
    once with ``body = None``, so the connection stays usable.
    """

    def __init__(self, header: struct.Struct, *, limit: int) -> None:
        self._header = header
        self._limit = limit
        self._buffer = bytearray()
        self._skip = 0

    def feed(self, data: bytes) -> list[tuple[tuple[int | float, ...], bytes | None]]:
        """Take ``data``; return every frame it completed, in order."""
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = data[dropped:]
        self._buffer += data
        frames: list[tuple[tuple[int | float, ...], bytes | None]] = []
        buffer, size, position = self._buffer, self._header.size, 0
        while len(buffer) - position >= size:
            fields = self._header.unpack_from(buffer, position)
            length = int(fields[0])
            start = position + size
            if length > self._limit:
                frames.append((fields, None))
                available = len(buffer) - start
                if available >= length:
                    position = start + length
                    continue
                self._skip = length - available
                position = len(buffer)
                break
            if len(buffer) - start < length:
                break
            frames.append((fields, bytes(buffer[start : start + length])))
            position = start + length
        if position:
            del buffer[:position]
        return frames
