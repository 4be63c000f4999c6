"""Hypothesis strategies that break the tensors of a request.

Each strategy draws a :class:`Mutation` of the fuzzed model's input ``x``: its datatype,
shape, raw byte count, BYTES framing, typed contents, or the set of inputs itself. The
statuses come from docs/reference/protocol.md (status codes): every malformed tensor is
``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import strategies as st

from ._requests import (
    DATATYPES,
    FEATURES,
    INVALID,
    ITEMSIZE,
    MAX_RECV_BYTES,
    OK,
    Mutation,
    element_count,
    first_input,
    is_good_x,
    set_raw,
    x_rows,
    zeros_for,
)
from ._wire import SHM_IN

_INVALID = frozenset({INVALID})
_DTYPE_TEXT = st.text(max_size=10).filter(lambda s: s not in DATATYPES)
_NAME = st.text(max_size=8)


@st.composite
def datatypes(draw: st.DrawFn) -> Mutation:
    """``x`` declared as another datatype (a real one or garbage), its bytes sized to match."""
    datatype = draw(st.one_of(st.sampled_from([d for d in DATATYPES if d != "FP32"]), _DTYPE_TEXT))
    noise = draw(st.binary(max_size=64))

    def apply(request: Any) -> None:
        x = first_input(request)
        x.datatype = datatype
        size = ITEMSIZE.get(datatype)
        set_raw(request, 0, noise if size is None else zeros_for(x.shape, size))

    return Mutation(f"datatype {datatype!r}", apply, _INVALID)


@st.composite
def extents(draw: st.DrawFn) -> Mutation:
    """Any small rank and extents (``[n, 16]`` with 1 <= n <= 32 is the only good shape)."""
    shape = draw(st.lists(st.integers(0, 40), max_size=4))
    if draw(st.booleans()):
        shape = [draw(st.integers(0, 40)), draw(st.sampled_from([FEATURES, 15, 17, 0]))]

    def apply(request: Any) -> None:
        x = first_input(request)
        x.ClearField("shape")
        x.shape.extend(shape)
        set_raw(request, 0, zeros_for(shape, 4))

    good = is_good_x("FP32", shape)
    return Mutation(f"shape {shape}", apply, frozenset({OK if good else INVALID}))


@st.composite
def byte_counts(draw: st.DrawFn) -> Mutation:
    """The raw bytes of ``x`` short, long or empty, or one raw entry too many or too few."""
    kind = draw(st.sampled_from(["short", "long", "empty", "extra entry", "no entry"]))
    cut = draw(st.integers(1, 1 << 12))
    # At most 63 bytes: never exactly the 64 of one good row, whatever came before.
    extra = draw(st.binary(min_size=1, max_size=63))

    def apply(request: Any) -> None:
        first_input(request)
        raw = request.raw_input_contents
        payload = raw[0] if raw else b""
        if kind == "short":
            set_raw(request, 0, payload[: max(0, len(payload) - cut)])
        elif kind == "long":
            set_raw(request, 0, payload + extra)
        elif kind == "empty":
            set_raw(request, 0, b"")
        elif kind == "extra entry":
            raw.append(extra)
        else:
            # Raw contents for a second input the request does not have.
            request.inputs.add(name="x2", datatype="FP32", shape=[1, FEATURES])

    return Mutation(f"raw bytes {kind}", apply, _INVALID)


@st.composite
def huge_shapes(draw: st.DrawFn) -> Mutation:
    """Declared shapes of 2**62 elements and more, or byte counts past the message cap."""
    shape = draw(
        st.one_of(
            st.sampled_from(
                [[1 << 62], [1 << 31, 1 << 31], [2, 1 << 61], [(1 << 63) - 1], [1, FEATURES << 40]]
            ),
            st.lists(st.integers(1 << 16, (1 << 63) - 1), min_size=1, max_size=4),
            st.just([MAX_RECV_BYTES // 4 // FEATURES + 1, FEATURES]),
        )
    )
    datatype = draw(st.sampled_from(["FP32", "INT64", "BOOL", "BYTES"]))

    def apply(request: Any) -> None:
        x = first_input(request)
        x.datatype = datatype
        x.ClearField("shape")
        x.shape.extend(shape)

    return Mutation(f"{datatype} shape {shape}", apply, _INVALID)


@st.composite
def negative_dims(draw: st.DrawFn) -> Mutation:
    """A shape with at least one negative dimension."""
    shape = draw(st.lists(st.integers(0, 1 << 40), max_size=3))
    negative = draw(st.one_of(st.just(-1), st.integers(-(1 << 63), -1)))
    shape.insert(draw(st.integers(0, len(shape))), negative)

    def apply(request: Any) -> None:
        x = first_input(request)
        x.ClearField("shape")
        x.shape.extend(shape)

    return Mutation(f"shape {shape}", apply, _INVALID)


@st.composite
def input_sets(draw: st.DrawFn) -> Mutation:
    """Duplicate, missing, unknown, unnamed or renamed inputs; ``two_io`` with one input."""
    kind = draw(
        st.sampled_from(
            ["duplicate", "missing", "unknown", "renamed", "two_io one input", "two_io rows"]
        )
    )
    name = draw(_NAME.filter(lambda s: s != "x"))

    def apply(request: Any) -> None:
        x = first_input(request)
        raw = request.raw_input_contents
        if kind == "duplicate":
            request.inputs.add().CopyFrom(x)
            raw.append(raw[0] if raw else b"")
        elif kind == "missing":
            request.ClearField("inputs")
            request.ClearField("raw_input_contents")
        elif kind == "unknown":
            request.inputs.add(name=name, datatype="FP32", shape=[1, FEATURES])
            raw.append(x_rows(1).tobytes())
        elif kind == "renamed":
            x.name = name
        else:
            request.model_name = "two_io"
            request.ClearField("inputs")
            request.ClearField("raw_input_contents")
            rows = [(1, 2)] if kind == "two_io rows" else [(2,)]
            for tensor, count in zip("ab", rows[0], strict=False):
                request.inputs.add(name=tensor, datatype="FP32", shape=[count, 8])
                raw.append(bytes(count * 8 * 4))

    return Mutation(f"inputs {kind} ({name!r})", apply, _INVALID)


_LENGTH = struct.Struct("<I")


@st.composite
def bytes_edge(draw: st.DrawFn) -> Mutation:
    """``x`` as BYTES: long or cut length prefixes, empty and non-UTF-8 elements, from SHM."""
    elements = draw(st.lists(st.binary(max_size=8), max_size=6))
    kind = draw(
        st.sampled_from(
            [
                "well-formed",
                "prefix too long",
                "truncated prefix",
                "trailing",
                "count",
                "typed",
                "shared memory",
            ]
        )
    )
    shm_bytes = draw(st.integers(0, SHM_IN[1]))
    framed = b"".join(_LENGTH.pack(len(e)) + e for e in elements)
    if kind == "prefix too long":
        framed += _LENGTH.pack(draw(st.integers(1, (1 << 32) - 1))) + b"\x00"
    elif kind == "truncated prefix":
        framed += _LENGTH.pack(3)[: draw(st.integers(1, 3))]
    elif kind == "trailing":
        framed += draw(st.binary(min_size=1, max_size=3))
    shape = [len(elements) + (1 if kind == "count" else 0)]
    if draw(st.booleans()):
        shape = [1, *shape]

    def apply(request: Any) -> None:
        x = first_input(request)
        x.datatype = "BYTES"
        x.ClearField("shape")
        x.shape.extend(shape)
        if kind == "typed":
            request.ClearField("raw_input_contents")
            x.contents.bytes_contents.extend(elements)
        elif kind == "shared memory":
            # FP32 rows read as BYTES framing: whatever the lengths say, never a good x.
            if request.raw_input_contents:
                del request.raw_input_contents[0]
            x.parameters["shared_memory_region"].string_param = SHM_IN[0]
            x.parameters["shared_memory_byte_size"].int64_param = shm_bytes
        else:
            set_raw(request, 0, framed)

    return Mutation(f"BYTES {kind} {elements!r}", apply, _INVALID)


_WRONG_FIELDS: dict[str, list[Any]] = {
    "int_contents": [1],
    "int64_contents": [1],
    "uint_contents": [1],
    "uint64_contents": [1],
    "bool_contents": [True],
    "fp64_contents": [1.0],
    "bytes_contents": [b"\xff"],
}


@st.composite
def typed_raw(draw: st.DrawFn) -> Mutation:
    """Typed contents: right, miscounted, in the wrong field, next to raw, or no data at all."""
    kind = draw(
        st.sampled_from(["typed", "count", "wrong field", "typed and raw", "two fields", "none"])
    )
    field = draw(st.sampled_from(sorted(_WRONG_FIELDS)))
    delta = draw(st.integers(-3, 3).filter(bool))

    def apply(request: Any) -> None:
        x = first_input(request)
        x.ClearField("contents")  # self-contained: what an earlier mutation typed is gone
        count = element_count(x.shape)
        values = [0.5] * min(count if count is not None else 1, 1 << 14)
        if kind != "typed and raw":
            request.ClearField("raw_input_contents")
        elif not request.raw_input_contents:
            set_raw(request, 0, zeros_for(x.shape, 4))
        if kind == "count":
            values = [0.5] * max(1, len(values) + delta)
        if kind == "wrong field":
            getattr(x.contents, field).extend(_WRONG_FIELDS[field] * len(values))
        elif kind != "none":
            x.contents.fp32_contents.extend(values)
        if kind == "two fields":
            getattr(x.contents, field).extend(_WRONG_FIELDS[field])

    expected = frozenset({OK}) if kind == "typed" else _INVALID
    return Mutation(f"contents {kind} ({field})", apply, expected)
