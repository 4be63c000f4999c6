"""Deadlines with an injected clock: no sleeping."""

from __future__ import annotations

import math
import time

import grpc
import pytest

from reactantserver.core.codec import MAX_BUDGET_NS, decode_request, effective_deadline_ns
from reactantserver.core.errors import DeadlineExceededError
from reactantserver.core.protocol import grpc_service_pb2 as pb

NOW = 1_000_000_000_000
TEN_YEARS_S = MAX_BUDGET_NS / 1e9


def _decode(
    *,
    timeout: int | None = None,
    reactant_timeout_ns: int | None = None,
    grpc_time_remaining: float | None = None,
    unsigned: bool = False,
) -> int | None:
    msg = pb.ModelInferRequest(model_name="m")
    for key, value in (("timeout", timeout), ("reactant_timeout_ns", reactant_timeout_ns)):
        if value is None:
            continue
        if unsigned:
            msg.parameters[key].uint64_param = value
        else:
            msg.parameters[key].int64_param = value
    request = decode_request(
        msg,
        registry=None,
        max_recv_msg_bytes=1 << 20,
        now_ns=NOW,
        grpc_time_remaining=grpc_time_remaining,
    )
    assert "timeout" not in request.parameters
    assert "reactant_timeout_ns" not in request.parameters
    return request.deadline_ns


def test_no_source_no_deadline() -> None:
    assert _decode() is None
    assert effective_deadline_ns(NOW) is None


def test_grpc_deadline() -> None:
    assert _decode(grpc_time_remaining=1.5) == NOW + 1_500_000_000


def test_timeout_parameter_is_microseconds() -> None:
    assert _decode(timeout=250) == NOW + 250_000


def test_reactant_timeout_ns() -> None:
    assert _decode(reactant_timeout_ns=123) == NOW + 123


def test_uint64_budgets() -> None:
    assert _decode(timeout=7, reactant_timeout_ns=9_000, unsigned=True) == NOW + 7_000


@pytest.mark.parametrize(
    ("grpc_s", "timeout_us", "timeout_ns", "expected"),
    [
        (2.0, 1_000_000, 3_000_000_000, NOW + 1_000_000_000),
        (0.5, 1_000_000, 3_000_000_000, NOW + 500_000_000),
        (2.0, 1_000_000, 10, NOW + 10),
        (None, 5, 6_000, NOW + 5_000),
        (None, 0, 6_000, NOW + 6_000),
        (1.0, -5, 0, NOW + 1_000_000_000),
    ],
)
def test_tightest_wins(
    grpc_s: float | None, timeout_us: int, timeout_ns: int, expected: int
) -> None:
    assert (
        _decode(grpc_time_remaining=grpc_s, timeout=timeout_us, reactant_timeout_ns=timeout_ns)
        == expected
    )
    assert (
        effective_deadline_ns(
            NOW, grpc_time_remaining=grpc_s, timeout_us=timeout_us, timeout_ns=timeout_ns
        )
        == expected
    )


@pytest.mark.parametrize("value", [0, -1, -(2**63)])
def test_non_positive_parameters_mean_none(value: int) -> None:
    assert _decode(timeout=value) is None
    assert _decode(reactant_timeout_ns=value) is None


def test_budgets_over_ten_years_mean_none() -> None:
    assert _decode(reactant_timeout_ns=MAX_BUDGET_NS) == NOW + MAX_BUDGET_NS
    assert _decode(reactant_timeout_ns=MAX_BUDGET_NS + 1) is None
    assert _decode(timeout=MAX_BUDGET_NS // 1000 + 1) is None
    assert _decode(timeout=2**64 - 1, unsigned=True) is None
    assert _decode(grpc_time_remaining=TEN_YEARS_S * 2) is None
    assert _decode(grpc_time_remaining=math.inf) is None
    assert _decode(grpc_time_remaining=math.nan) is None
    # A very long budget does not hide a short one from another source.
    assert _decode(grpc_time_remaining=TEN_YEARS_S * 2, timeout=3) == NOW + 3_000


@pytest.mark.parametrize("remaining", [0.0, -0.25])
def test_expired_grpc_deadline_fails_at_decode(remaining: float) -> None:
    assert effective_deadline_ns(NOW, grpc_time_remaining=remaining) == NOW
    with pytest.raises(DeadlineExceededError, match="model 'm'") as info:
        _decode(grpc_time_remaining=remaining, reactant_timeout_ns=10**9)
    assert info.value.status == grpc.StatusCode.DEADLINE_EXCEEDED


def test_default_clock_is_monotonic() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.parameters["reactant_timeout_ns"].int64_param = 10**12
    before = time.monotonic_ns()
    request = decode_request(msg, registry=None, max_recv_msg_bytes=1 << 20)
    after = time.monotonic_ns()
    assert request.deadline_ns is not None
    assert before + 10**12 <= request.deadline_ns <= after + 10**12
