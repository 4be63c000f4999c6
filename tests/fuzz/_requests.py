"""The vocabulary of the request fuzz: a good base request, mutations of it, the status names.

A :class:`Mutation` edits a raw ``ModelInferRequest`` (tritonclient's generated
``service_pb2``) in place and names the statuses docs/reference/protocol.md documents for what it
breaks. The oracle is written from the documentation, never from the server's code: a case
passes when its status is in the union of its mutations' sets::

    request = base_request(rows=3)
    for mutation in mutations:
        mutation.apply(request)
    expected = expected_statuses(mutations)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
from tritonclient.grpc import service_pb2

OK = "OK"
INVALID = "INVALID_ARGUMENT"
NOT_FOUND = "NOT_FOUND"
PRECONDITION = "FAILED_PRECONDITION"
DEADLINE = "DEADLINE_EXCEEDED"

MODEL = "mlp"
"""The fuzzed model: ``x`` FP32 ``[n, 16]`` -> ``logits`` FP32 ``[n, 4]``, sizes 1, 8, 32."""
FEATURES = 16
LOGITS = 4
MAX_ROWS = 32
"""The largest compiled batch size of :data:`MODEL`: more rows are ``INVALID_ARGUMENT``."""
SERVED = frozenset({"mlp", "two_io", "spin"})
"""Every model the fuzzed worker serves (names a strategy must not hit by chance)."""
MAX_RECV_BYTES = 512 * 1024 * 1024
"""The worker's default ``grpc.max_recv_msg_bytes``."""
PAYLOAD_CAP = 1 << 20
"""A mutation never builds a payload larger than this, whatever shape it declared."""

ITEMSIZE: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "BF16": 2,
    "FP32": 4,
    "FP64": 8,
}
"""KServe datatypes with a fixed element size; ``BYTES`` has none."""
DATATYPES = (*ITEMSIZE, "BYTES")


@attrs.frozen
class Mutation:
    """One way of breaking (or legitimately varying) a request, and its documented statuses."""

    label: str
    apply: Callable[[Any], None]
    expected: frozenset[str]

    @property
    def harmless(self) -> bool:
        """Whether the protocol allows this mutation to succeed."""
        return OK in self.expected


def expected_statuses(mutations: Sequence[Mutation]) -> frozenset[str]:
    """The statuses a request carrying all of ``mutations`` may end with.

    Any of the violated conditions may be the one reported (their order is not documented), so
    the union; a request that breaks anything must not succeed.
    """
    union = frozenset().union(*(m.expected for m in mutations))
    if any(not m.harmless for m in mutations):
        union -= {OK}
    return union


def x_rows(rows: int, seed: int = 0) -> np.ndarray[Any, Any]:
    """Deterministic FP32 input of :data:`MODEL`."""
    return np.random.default_rng(seed).standard_normal((rows, FEATURES)).astype(np.float32)


def base_request(rows: int) -> Any:
    """A good request: ``rows`` rows of ``x`` for :data:`MODEL` as raw contents."""
    request = service_pb2.ModelInferRequest(model_name=MODEL, id=f"fuzz-{rows}")
    request.inputs.add(name="x", datatype="FP32", shape=[rows, FEATURES])
    request.raw_input_contents.append(x_rows(rows).tobytes())
    return request


def first_input(request: Any) -> Any:
    """The request's first input, added (``x``, one row, raw) when it has none."""
    if not request.inputs:
        request.inputs.add(name="x", datatype="FP32", shape=[1, FEATURES])
        if not request.raw_input_contents:
            request.raw_input_contents.append(x_rows(1).tobytes())
    return request.inputs[0]


def set_raw(request: Any, index: int, payload: bytes) -> None:
    """Raw entry ``index`` becomes ``payload`` (appended when the list is shorter)."""
    raw = request.raw_input_contents
    while len(raw) <= index:
        raw.append(b"")
    raw[index] = payload


def element_count(shape: Sequence[int]) -> int | None:
    """Elements of a shape, or ``None`` when it has a negative dimension."""
    if any(dim < 0 for dim in shape):
        return None
    return math.prod(shape)


def zeros_for(shape: Sequence[int], itemsize: int) -> bytes:
    """Zero bytes for ``shape`` of ``itemsize``-byte elements, empty when too large to build."""
    count = element_count(shape)
    if count is None or count * itemsize > PAYLOAD_CAP:
        return b""
    return bytes(count * itemsize)


def is_good_x(datatype: str, shape: Sequence[int]) -> bool:
    """Whether ``x`` of this datatype and shape is what :data:`MODEL` accepts."""
    return (
        datatype == "FP32"
        and len(shape) == 2
        and shape[1] == FEATURES
        and 1 <= shape[0] <= MAX_ROWS
    )
