from __future__ import annotations

import gzip
import zlib

import grpc
import pytest

from reactantserver.core.front._wire import (
    Deframer,
    FrameError,
    decode_metadata,
    decompress,
    encode_metadata,
    frame,
    parse_timeout,
    percent_encode,
    status_trailers,
)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"1H", 3600.0),
        (b"2M", 120.0),
        (b"3S", 3.0),
        (b"250m", 0.25),
        (b"1500u", 0.0015),
        (b"99999999n", 0.099999999),
    ],
)
def test_timeouts_in_every_unit(value: bytes, seconds: float) -> None:
    assert parse_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [b"", b"S", b"10", b"10x", b"-5S", b"123456789S", b"1.5S"])
def test_malformed_timeouts_are_none(value: bytes) -> None:
    assert parse_timeout(value) is None


def test_plain_messages_are_not_escaped_and_others_are() -> None:
    assert percent_encode("model 'x' not found") == b"model 'x' not found"
    assert percent_encode("100% sure") == b"100%25 sure"
    assert percent_encode("caf\u00e9\nline") == b"caf%C3%A9%0Aline"


def test_trailers_carry_the_status_message_and_metadata() -> None:
    trailers = status_trailers(grpc.StatusCode.NOT_FOUND, "gone", [("why", "moved")])
    assert trailers == [(b"grpc-status", b"5"), (b"grpc-message", b"gone"), (b"why", b"moved")]
    assert status_trailers(grpc.StatusCode.OK) == [(b"grpc-status", b"0")]


def test_metadata_round_trips_text_and_binary_values() -> None:
    pairs = encode_metadata([("x-request", "abc"), ("blob-bin", b"\x00\xff\x10")])
    assert pairs[0] == (b"x-request", b"abc")
    assert b"=" not in pairs[1][1]  # base64 without padding, as gRPC sends it
    headers = [(b"content-type", b"application/grpc"), (b"te", b"trailers"), *pairs]
    assert decode_metadata(headers) == (("x-request", "abc"), ("blob-bin", b"\x00\xff\x10"))


def test_messages_come_out_whole_whatever_the_chunking() -> None:
    stream = frame(b"first") + frame(b"") + frame(b"third message")
    for size in (1, 2, 5, 7, len(stream)):
        deframer = Deframer(1024, None)
        out: list[bytes] = []
        for start in range(0, len(stream), size):
            out.extend(deframer.feed(stream[start : start + size]))
        assert out == [b"first", b"", b"third message"]
        assert not deframer.pending


def test_a_message_over_the_limit_is_refused_from_its_prefix() -> None:
    deframer = Deframer(10, None)
    with pytest.raises(FrameError) as caught:
        deframer.feed(frame(b"x" * 11)[:5])  # only the prefix has arrived
    assert caught.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max (11 vs. 10)" in caught.value.details


def test_compressed_messages_are_inflated() -> None:
    payload = b"tensor bytes " * 20
    packed = gzip.compress(payload)
    deframer = Deframer(1024, b"gzip")
    assert deframer.feed(b"\x01" + len(packed).to_bytes(4, "big") + packed) == [payload]
    assert decompress(b"deflate", zlib.compress(payload)) == payload


def test_unknown_or_missing_compression_is_refused() -> None:
    with pytest.raises(FrameError) as caught:
        decompress(b"snappy", b"...")
    assert caught.value.code is grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(FrameError) as missing:
        Deframer(1024, None).feed(b"\x01\x00\x00\x00\x01x")
    assert missing.value.code is grpc.StatusCode.INTERNAL
    with pytest.raises(FrameError) as corrupt:
        decompress(b"gzip", b"not gzip")
    assert corrupt.value.code is grpc.StatusCode.INTERNAL
