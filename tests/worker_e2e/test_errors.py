"""Every bad request in docs/reference/protocol.md's status table gets its status, and good
requests keep succeeding.

Each bad request is sent together with a good one (both in flight at once) and followed by
another good one; the good ones must get their own correct rows. Requests are built by hand
with tritonclient's generated messages, since its high-level client refuses most of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import grpc
import numpy as np
import pytest

from ._bundles import (
    BROKEN,
    HOOK_BAD_OUTPUT,
    HOOK_CRASH,
    HOOK_REJECT,
    HOOKY,
    assert_close,
    mlp_reference,
)
from ._harness import raw_request, response_array, rows

pytestmark = pytest.mark.slow

X = rows(2, 16, seed=11)
A, B = rows(2, 8, seed=12), rows(2, 8, seed=13)


def _mlp(shape: tuple[int, ...] = (2, 16), datatype: str = "FP32", raw: bytes | None = None) -> Any:
    data = X.tobytes() if raw is None else raw
    return raw_request("mlp", [("x", datatype, shape, data)])


def _two_io(a: np.ndarray[Any, Any] = A, b: np.ndarray[Any, Any] = B) -> Any:
    return raw_request(
        "two_io", [("a", "FP32", a.shape, a.tobytes()), ("b", "FP32", b.shape, b.tobytes())]
    )


def _hooky(marker: float) -> Any:
    x = X.copy()
    x[0, 0] = marker
    return raw_request(HOOKY, [("x", "FP32", x.shape, x.tobytes())])


def _with(request: Any, edit: Callable[[Any], object]) -> Any:
    edit(request)
    return request


def _typed_and_raw() -> Any:
    request = _mlp()
    request.inputs[0].contents.fp32_contents.extend(X.ravel().tolist())
    return request


def _typed(count: int, datatype: str = "FP32") -> Any:
    request = raw_request("mlp", [("x", datatype, (1, 16), None)])
    request.inputs[0].contents.fp32_contents.extend([0.5] * count)
    return request


def _bytes_input() -> Any:
    # a 5-byte element announced, 2 bytes present
    return raw_request("mlp", [("x", "BYTES", (1,), b"\x05\x00\x00\x00ab")])


def _extra_input() -> Any:
    request = _mlp()
    request.inputs.add(name="y", datatype="FP32", shape=[2, 16])
    request.raw_input_contents.append(X.tobytes())
    return request


def _outputs(*names: str) -> Any:
    request = _mlp()
    for name in names:
        request.outputs.add(name=name)
    return request


def _parameter(key: str, **value: Any) -> Any:
    request = _mlp()
    for field, v in value.items():
        setattr(request.parameters[key], field, v)
    return request


def _classification() -> Any:
    request = _mlp()
    request.outputs.add(name="logits").parameters["classification"].int64_param = 2
    return request


@attrs.frozen
class Case:
    """One bad request: how to build it, its status, and a word its message must contain."""

    build: Callable[[], Any]
    status: grpc.StatusCode
    mentions: str = ""


INVALID = grpc.StatusCode.INVALID_ARGUMENT
CASES: dict[str, Case] = {
    "empty model name": Case(
        lambda: _with(_mlp(), lambda r: setattr(r, "model_name", "")), INVALID
    ),
    "unknown datatype": Case(lambda: _mlp(datatype="FP99"), INVALID, "mlp"),
    "negative dim": Case(lambda: _mlp(shape=(-2, 16)), INVALID, "mlp"),
    "overflowing shape": Case(lambda: _mlp(shape=(1 << 40, 1 << 40)), INVALID, "mlp"),
    "byte count mismatch": Case(lambda: _mlp(shape=(3, 16)), INVALID, "mlp"),
    "raw count mismatch": Case(
        lambda: _with(_two_io(), lambda r: r.raw_input_contents.pop()), INVALID, "two_io"
    ),
    "typed and raw for one input": Case(_typed_and_raw, INVALID, "mlp"),
    "missing data": Case(lambda: raw_request("mlp", [("x", "FP32", (1, 16), None)]), INVALID),
    "typed count mismatch": Case(lambda: _typed(15), INVALID, "mlp"),
    "typed contents for FP16": Case(lambda: _typed(16, "FP16"), INVALID, "mlp"),
    "malformed BYTES": Case(_bytes_input, INVALID, "mlp"),
    "undeclared input": Case(_extra_input, INVALID, "mlp"),
    "missing input": Case(
        lambda: raw_request("two_io", [("a", "FP32", A.shape, A.tobytes())]), INVALID, "two_io"
    ),
    "dtype mismatch": Case(lambda: _mlp(datatype="INT32"), INVALID, "mlp"),
    "rank mismatch": Case(lambda: _mlp(shape=(2, 16, 1)), INVALID, "mlp"),
    "fixed extent mismatch": Case(
        lambda: _mlp(shape=(2, 15), raw=rows(2, 15, seed=0).tobytes()), INVALID, "mlp"
    ),
    "zero rows": Case(lambda: _mlp(shape=(0, 16), raw=b""), INVALID, "mlp"),
    "inconsistent rows": Case(lambda: _two_io(b=rows(3, 8, seed=1)), INVALID, "two_io"),
    "too many rows": Case(
        lambda: _mlp(shape=(33, 16), raw=rows(33, 16, seed=2).tobytes()), INVALID, "mlp"
    ),
    "unknown requested output": Case(lambda: _outputs("nope"), INVALID, "nope"),
    "duplicate requested output": Case(lambda: _outputs("logits", "logits"), INVALID, "logits"),
    "sequence_id": Case(lambda: _parameter("sequence_id", int64_param=5), INVALID, "sequence_id"),
    "string sequence_id": Case(
        lambda: _parameter("sequence_id", string_param="s1"), INVALID, "sequence_id"
    ),
    "classification": Case(_classification, INVALID, "classification"),
    "hook rejects": Case(lambda: _hooky(HOOK_REJECT), INVALID, "hooky rejects"),
    "hook crashes": Case(lambda: _hooky(HOOK_CRASH), grpc.StatusCode.INTERNAL, "hooky crashed"),
    "hook output violates": Case(
        lambda: _hooky(HOOK_BAD_OUTPUT), grpc.StatusCode.INTERNAL, "preprocess"
    ),
    "client tensor dtype (hooks)": Case(
        lambda: raw_request(
            "classifier_hooks",
            [("image", "FP32", (1, 28, 28, 3), bytes(4 * 28 * 28 * 3))],
        ),
        INVALID,
        "classifier_hooks",
    ),
    "unknown model": Case(
        lambda: _with(_mlp(), lambda r: setattr(r, "model_name", "no_such_model")),
        grpc.StatusCode.NOT_FOUND,
        "no_such_model",
    ),
    "unknown version": Case(
        lambda: _with(_mlp(), lambda r: setattr(r, "model_version", "2")),
        grpc.StatusCode.NOT_FOUND,
        "mlp",
    ),
    "failed model": Case(
        lambda: _with(_mlp(), lambda r: setattr(r, "model_name", BROKEN)),
        grpc.StatusCode.UNAVAILABLE,
        BROKEN,
    ),
}


def _assert_good(future: Any, weights: dict[str, Any]) -> None:
    response = future.result(timeout=30)
    assert_close(response_array(response, 0), mlp_reference(weights["mlp"], X))


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_request_status_while_others_succeed(
    stub: Any, weights: dict[str, Any], case: str
) -> None:
    spec = CASES[case]
    good_before = stub.ModelInfer.future(_mlp())
    bad = stub.ModelInfer.future(spec.build())
    good_during = stub.ModelInfer.future(_mlp())
    with pytest.raises(grpc.RpcError) as caught:
        bad.result(timeout=30)
    error: Any = caught.value
    assert error.code() == spec.status, error.details()
    details = str(error.details() or "")
    assert details
    assert "\n" not in details
    assert spec.mentions in details
    _assert_good(good_before, weights)
    _assert_good(good_during, weights)
    _assert_good(stub.ModelInfer.future(_mlp()), weights)
