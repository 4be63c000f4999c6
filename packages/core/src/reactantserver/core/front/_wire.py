"""gRPC over HTTP/2, the parts above the HTTP layer: message framing, timeouts, metadata.

A gRPC message on the wire is a 5-byte prefix (a compressed flag and a big-endian length)
followed by the serialized message; the call's status travels in the trailers as
``grpc-status`` and a percent-encoded ``grpc-message``. Everything here is pure and works on
the ``(name, value)`` byte pairs an ASGI server hands over::

    frame(b"...")                          # b"\\x00\\x00\\x00\\x00\\x03..."
    parse_timeout(b"250m")                 # 0.25
    status_trailers(grpc.StatusCode.NOT_FOUND, "no model 'x'")
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import Final

import grpc

__all__ = [
    "HEADER_LEN",
    "Deframer",
    "FrameError",
    "Headers",
    "Metadata",
    "decode_metadata",
    "decompress",
    "encode_metadata",
    "frame",
    "frame_prefix",
    "parse_timeout",
    "percent_encode",
    "status_trailers",
]

#: The prefix of every message: one flag byte and a 4-byte big-endian length.
HEADER_LEN: Final = 5
_PREFIX = struct.Struct(">BI")

#: What an ASGI server hands over and takes: ``(lower-case name, value)`` byte pairs.
Headers = Sequence[tuple[bytes, bytes]]
#: gRPC metadata as handlers see it: text values, or bytes for ``-bin`` keys.
Metadata = tuple[tuple[str, str | bytes], ...]

_TIMEOUT_UNITS: Final = {
    ord("H"): 3600.0,
    ord("M"): 60.0,
    ord("S"): 1.0,
    ord("m"): 1e-3,
    ord("u"): 1e-6,
    ord("n"): 1e-9,
}
# Request headers that are transport, not metadata: handlers never see them.
_NOT_METADATA: Final = frozenset(
    {
        b"content-type",
        b"te",
        b"grpc-timeout",
        b"grpc-encoding",
        b"grpc-accept-encoding",
        b"content-length",
        b"host",
        b"connection",
        b"transfer-encoding",
    }
)
# Bytes a grpc-message may carry unescaped: printable ASCII except '%'.
_PLAIN: Final = frozenset(range(0x20, 0x7F)) - {ord("%")}


class FrameError(Exception):
    """A malformed or refused message stream; carries the status to answer with."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def frame_prefix(length: int, *, compressed: bool = False) -> bytes:
    """The 5-byte prefix of a message of ``length`` bytes."""
    return _PREFIX.pack(1 if compressed else 0, length)


def frame(payload: bytes) -> bytes:
    """One uncompressed message: prefix and payload."""
    return _PREFIX.pack(0, len(payload)) + payload


def parse_timeout(value: bytes) -> float | None:
    """Seconds in a ``grpc-timeout`` value (``"250m"``); None when it is malformed."""
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1])
    if unit is None:
        return None
    return int(value[:-1]) * unit


def percent_encode(text: str) -> bytes:
    """``grpc-message`` encoding: UTF-8, with bytes outside printable ASCII and '%' escaped."""
    raw = text.encode("utf-8", "replace")
    if all(b in _PLAIN for b in raw):
        return raw
    return b"".join(bytes((b,)) if b in _PLAIN else b"%%%02X" % b for b in raw)


def decode_metadata(headers: Headers) -> Metadata:
    """Custom metadata of a request: every header but the transport's, ``-bin`` decoded."""
    out: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name in _NOT_METADATA or name.startswith(b":"):
            continue
        key = name.decode("latin-1")
        if key.endswith("-bin"):
            out.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
        else:
            out.append((key, value.decode("latin-1")))
    return tuple(out)


def encode_metadata(metadata: Iterable[tuple[str, str | bytes]]) -> list[tuple[bytes, bytes]]:
    """Response metadata as header pairs (``-bin`` values base64 without padding)."""
    out: list[tuple[bytes, bytes]] = []
    for key, value in metadata:
        name = key.lower().encode("latin-1")
        if name.endswith(b"-bin"):
            raw = value if isinstance(value, bytes) else value.encode()
            out.append((name, base64.b64encode(raw).rstrip(b"=")))
        else:
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            out.append((name, text.encode("latin-1")))
    return out


def status_trailers(
    code: grpc.StatusCode,
    details: str = "",
    metadata: Iterable[tuple[str, str | bytes]] = (),
) -> list[tuple[bytes, bytes]]:
    """The trailers that end a call: ``grpc-status``, ``grpc-message``, trailing metadata."""
    trailers = [(b"grpc-status", b"%d" % code.value[0])]
    if details:
        trailers.append((b"grpc-message", percent_encode(details)))
    trailers.extend(encode_metadata(metadata))
    return trailers


def decompress(encoding: bytes, payload: bytes) -> bytes:
    """The payload of a compressed message (``gzip`` or ``deflate``)."""
    try:
        if encoding == b"gzip":
            return zlib.decompress(payload, wbits=31)
        if encoding == b"deflate":
            return zlib.decompress(payload)
    except zlib.error as exc:
        detail = f"could not decompress a message: {exc}"
        raise FrameError(grpc.StatusCode.INTERNAL, detail) from exc
    name = encoding.decode("latin-1")
    raise FrameError(
        grpc.StatusCode.UNIMPLEMENTED,
        f"message compressed with '{name}', which this server does not support "
        "(supported: identity, gzip, deflate)",
    )


class Deframer:
    """Messages out of a byte stream that arrives in arbitrary chunks.

    ``max_length`` bounds each message; a longer one is refused as soon as its prefix is
    read (``RESOURCE_EXHAUSTED``, as gRPC words it), before its bytes are buffered.
    """

    def __init__(self, max_length: int, encoding: bytes | None) -> None:
        self._max = max_length
        self._encoding = encoding
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add ``chunk``; returns the messages it completed (decompressed)."""
        buffer = self._buffer
        buffer += chunk
        messages: list[bytes] = []
        while len(buffer) >= HEADER_LEN:
            flag, length = _PREFIX.unpack_from(buffer)
            if length > self._max:
                raise FrameError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Received message larger than max ({length} vs. {self._max})",
                )
            end = HEADER_LEN + length
            if len(buffer) < end:
                break
            payload = bytes(buffer[HEADER_LEN:end])
            del buffer[:end]
            messages.append(self._payload(flag, payload))
        return messages

    def _payload(self, flag: int, payload: bytes) -> bytes:
        if not flag:
            return payload
        if self._encoding is None or self._encoding == b"identity":
            raise FrameError(
                grpc.StatusCode.INTERNAL, "compressed message without a grpc-encoding header"
            )
        return decompress(self._encoding, payload)

    @property
    def pending(self) -> bool:
        """Whether part of a message is still buffered (an error at end of stream)."""
        return bool(self._buffer)
