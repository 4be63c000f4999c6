"""Framing of the forwarding lane (:mod:`reactantserver.core.lane`).

The frames, the incremental :class:`FrameReader` (any split of the stream gives the same
frames; bodies over the limit are skipped and reported once) and the advert parser.
"""

from __future__ import annotations

import math

import pytest

from reactantserver.core.lane import (
    REQUEST_HEADER,
    RESPONSE_HEADER,
    Advert,
    FrameReader,
    Kind,
    parse_advert,
    request_frame,
    response_frame,
)

Frame = tuple[tuple[int | float, ...], bytes | None]
#: A frame with NaN made comparable (``nan != nan``).
Plain = tuple[tuple[int | float | str, ...], bytes | None]


def plain(frames: list[Frame]) -> list[Plain]:
    return [
        (tuple("nan" if isinstance(f, float) and math.isnan(f) else f for f in fields), body)
        for fields, body in frames
    ]


def stream() -> bytes:
    """Request frames of every kind, with and without timeouts and bodies."""
    return b"".join(
        [
            request_frame(1, Kind.HELLO, b"token"),
            request_frame(2, Kind.INFER, b"first body", 2.5),
            request_frame(3, Kind.INFER, b"", None),
            request_frame(2, Kind.CANCEL),
            request_frame(4, Kind.INFER, bytes(range(256)) * 3, 0.001),
        ]
    )


EXPECTED: list[Plain] = [
    ((5, 1, Kind.HELLO, "nan"), b"token"),
    ((10, 2, Kind.INFER, 2.5), b"first body"),
    ((0, 3, Kind.INFER, "nan"), b""),
    ((0, 2, Kind.CANCEL, "nan"), b""),
    ((768, 4, Kind.INFER, 0.001), bytes(range(256)) * 3),
]


def feed_in_chunks(reader: FrameReader, data: bytes, size: int) -> list[Frame]:
    frames: list[Frame] = []
    for start in range(0, len(data), size):
        frames += reader.feed(data[start : start + size])
    return frames


def test_one_feed_gives_every_frame_in_order() -> None:
    reader = FrameReader(REQUEST_HEADER, limit=1 << 20)
    assert plain(reader.feed(stream())) == EXPECTED


def test_one_byte_at_a_time_gives_the_same_frames() -> None:
    reader = FrameReader(REQUEST_HEADER, limit=1 << 20)
    data = stream()
    completed: list[int] = []
    frames: list[Frame] = []
    for index in range(len(data)):
        got = reader.feed(data[index : index + 1])
        if got:
            completed.append(index)
        frames += got
    assert plain(frames) == EXPECTED
    # Each frame is returned by the feed that brings its last byte, never earlier or later.
    ends, end = [], 0
    for fields, _ in EXPECTED:
        end += REQUEST_HEADER.size + int(fields[0])
        ends.append(end - 1)
    assert completed == ends


@pytest.mark.parametrize("size", [2, 3, 7, 13, 64, 1000])
def test_every_chunking_gives_the_same_frames(size: int) -> None:
    reader = FrameReader(REQUEST_HEADER, limit=1 << 20)
    assert plain(feed_in_chunks(reader, stream(), size)) == EXPECTED


def test_empty_feeds_and_partial_header_give_nothing() -> None:
    reader = FrameReader(REQUEST_HEADER, limit=1 << 20)
    frame = request_frame(9, Kind.INFER, b"abc", 1.0)
    assert reader.feed(b"") == []
    assert reader.feed(frame[: REQUEST_HEADER.size - 1]) == []
    assert reader.feed(b"") == []
    assert reader.feed(frame[REQUEST_HEADER.size - 1 : -1]) == []
    assert reader.feed(frame[-1:]) == [((3, 9, Kind.INFER, 1.0), b"abc")]


def test_several_response_frames_in_one_chunk() -> None:
    reader = FrameReader(RESPONSE_HEADER, limit=64)
    chunk = (
        response_frame(1, 0, b"ok")
        + response_frame(2, 5, b"model 'x' not found")
        + response_frame(3, 0, b"")
    )
    assert reader.feed(chunk) == [
        ((2, 1, 0), b"ok"),
        ((19, 2, 5), b"model 'x' not found"),
        ((0, 3, 0), b""),
    ]


def test_a_body_at_the_limit_is_kept() -> None:
    reader = FrameReader(RESPONSE_HEADER, limit=8)
    assert reader.feed(response_frame(1, 0, b"x" * 8)) == [((8, 1, 0), b"x" * 8)]


def oversized_between_normal() -> bytes:
    return (
        request_frame(1, Kind.INFER, b"before", 1.0)
        + request_frame(2, Kind.INFER, b"y" * 1000, 1.0)
        + request_frame(3, Kind.INFER, b"after", 1.0)
    )


OVERSIZED_EXPECTED: list[Frame] = [
    ((6, 1, Kind.INFER, 1.0), b"before"),
    ((1000, 2, Kind.INFER, 1.0), None),
    ((5, 3, Kind.INFER, 1.0), b"after"),
]


def test_oversized_frame_in_one_chunk_is_reported_once_and_skipped() -> None:
    reader = FrameReader(REQUEST_HEADER, limit=100)
    assert reader.feed(oversized_between_normal()) == OVERSIZED_EXPECTED
    # The reader is clean afterwards.
    assert plain(reader.feed(request_frame(5, Kind.CANCEL))) == [((0, 5, Kind.CANCEL, "nan"), b"")]


@pytest.mark.parametrize("size", [1, 2, 5, 17, 99, 100, 101, 250, 999])
def test_oversized_frame_streamed_over_chunks_is_reported_once_and_skipped(size: int) -> None:
    reader = FrameReader(REQUEST_HEADER, limit=100)
    assert feed_in_chunks(reader, oversized_between_normal(), size) == OVERSIZED_EXPECTED


def test_oversized_frame_reported_when_its_header_arrives() -> None:
    reader = FrameReader(REQUEST_HEADER, limit=100)
    data = oversized_between_normal()
    first = REQUEST_HEADER.size + 6
    header_end = first + REQUEST_HEADER.size
    assert reader.feed(data[:header_end]) == OVERSIZED_EXPECTED[:2]
    # The body streams in without another report; the next frame follows its last byte.
    body_end = header_end + 1000
    for start in range(header_end, body_end, 300):
        assert reader.feed(data[start : min(start + 300, body_end)]) == []
    assert reader.feed(data[body_end:]) == OVERSIZED_EXPECTED[2:]


def test_oversized_frames_back_to_back() -> None:
    reader = FrameReader(RESPONSE_HEADER, limit=4)
    data = (
        response_frame(1, 0, b"12345")
        + response_frame(2, 8, b"123456789")
        + response_frame(3, 0, b"1234")
    )
    expected: list[Frame] = [((5, 1, 0), None), ((9, 2, 8), None), ((4, 3, 0), b"1234")]
    assert reader.feed(data) == expected
    for size in (1, 3, 6):
        assert feed_in_chunks(FrameReader(RESPONSE_HEADER, limit=4), data, size) == expected


def test_request_frame_without_timeout_carries_nan() -> None:
    frame = request_frame(7, Kind.INFER, b"body")
    length, call_id, kind, seconds = REQUEST_HEADER.unpack_from(frame)
    assert (length, call_id, kind) == (4, 7, Kind.INFER)
    assert math.isnan(seconds)
    assert frame[REQUEST_HEADER.size :] == b"body"


def test_request_frame_timeout_round_trips() -> None:
    for timeout in (0.0, 0.25, 3600.5):
        frame = request_frame(1, Kind.INFER, b"", timeout)
        assert REQUEST_HEADER.unpack(frame)[3] == timeout


def test_request_frame_wraps_the_call_id_to_32_bits() -> None:
    frame = request_frame((1 << 32) + 5, Kind.CANCEL)
    assert REQUEST_HEADER.unpack(frame)[:3] == (0, 5, Kind.CANCEL)


def test_response_frame_layout() -> None:
    frame = response_frame(0xFFFFFFFF, 14, "unavailable: é".encode())
    length, call_id, code = RESPONSE_HEADER.unpack_from(frame)
    assert (length, call_id, code) == (len("unavailable: é".encode()), 0xFFFFFFFF, 14)
    assert frame[RESPONSE_HEADER.size :].decode() == "unavailable: é"
    assert RESPONSE_HEADER.size == 9
    assert REQUEST_HEADER.size == 17


@pytest.mark.parametrize(
    "value",
    ["tok@/abs/path", b"tok@/abs/path"],
)
def test_parse_advert_accepts_token_at_absolute_path(value: str | bytes) -> None:
    advert = parse_advert(value)
    assert advert is not None
    assert isinstance(advert, Advert)
    assert advert == "tok@/abs/path"
    assert (advert.token, advert.path) == ("tok", "/abs/path")


def test_parse_advert_keeps_at_signs_in_the_path() -> None:
    advert = parse_advert("a1b2@/tmp/x@y/lane.sock")
    assert advert is not None
    assert (advert.token, advert.path) == ("a1b2", "/tmp/x@y/lane.sock")


@pytest.mark.parametrize(
    "value",
    [None, "", b"", "noat", "tok@relative", "@/path", "tok@", b"@/path", b"tok@relative"],
)
def test_parse_advert_rejects(value: str | bytes | None) -> None:
    assert parse_advert(value) is None


def test_advert_of_round_trips_and_compares_as_str() -> None:
    advert = Advert.of("abc", "/run/lane.sock")
    assert advert == "abc@/run/lane.sock"
    assert (advert.token, advert.path) == ("abc", "/run/lane.sock")
    assert parse_advert(str(advert)) == advert
    table: dict[str, int] = {advert: 1}
    assert table["abc@/run/lane.sock"] == 1
