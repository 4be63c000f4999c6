"""RetryPolicy and Backoff: the retryable table and the backoff algorithm."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import grpc
import pytest

from reactantserver.client import RetryPolicy
from reactantserver.client._retry import Backoff

NS = 1_000_000_000
FAR = 10**6 * NS
"""A deadline no test reaches."""

OTHER_CODES = [
    code
    for code in grpc.StatusCode
    if code not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)
]


def _draws(*values: float) -> Callable[[], float]:
    """A pinned ``U(0, 1)``: ``values`` in order, then a failure (no more draws expected)."""
    queue = list(values)

    def uniform() -> float:
        assert queue, "Backoff drew more random numbers than the test pinned"
        return queue.pop(0)

    return uniform


def _waits(backoff: Backoff, times: Iterable[int]) -> list[float | None]:
    return [backoff.next_wait(now) for now in times]


# -- the policy -------------------------------------------------------------------------------


def test_defaults_are_the_spec() -> None:
    policy = RetryPolicy()
    assert policy.enabled is True
    assert policy.initial_backoff == 1.0
    assert policy.factor == 2.0
    assert policy.max_backoff == math.inf
    assert policy.min_budget == 0.05
    assert policy.jitter is True
    assert policy.retry_unavailable is True


def test_frozen() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        RetryPolicy().enabled = False  # type: ignore[misc]


def test_resource_exhausted_is_retried() -> None:
    assert RetryPolicy().retryable(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert RetryPolicy(retry_unavailable=False).retryable(grpc.StatusCode.RESOURCE_EXHAUSTED)


def test_unavailable_is_retried_iff_retry_unavailable() -> None:
    assert RetryPolicy().retryable(grpc.StatusCode.UNAVAILABLE)
    assert not RetryPolicy(retry_unavailable=False).retryable(grpc.StatusCode.UNAVAILABLE)


@pytest.mark.parametrize("code", OTHER_CODES, ids=lambda c: c.name)
@pytest.mark.parametrize("retry_unavailable", [True, False])
def test_every_other_code_is_not_retried(code: grpc.StatusCode, retry_unavailable: bool) -> None:
    assert not RetryPolicy(retry_unavailable=retry_unavailable).retryable(code)


def test_non_grpc_errors_are_not_retried() -> None:
    assert not RetryPolicy().retryable(None)


@pytest.mark.parametrize("code", [*grpc.StatusCode, None], ids=str)
def test_disabled_retries_nothing(code: grpc.StatusCode | None) -> None:
    assert not RetryPolicy(enabled=False).retryable(code)


@pytest.mark.parametrize(
    "field", ["initial_backoff", "factor", "max_backoff"], ids=lambda f: f"{f}"
)
@pytest.mark.parametrize("value", [0.0, -1.0, math.nan])
def test_positive_fields_are_validated(field: str, value: float) -> None:
    kwargs: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=field):
        RetryPolicy(**kwargs)


@pytest.mark.parametrize("value", [-0.01, -1.0, math.nan])
def test_min_budget_must_not_be_negative(value: float) -> None:
    with pytest.raises(ValueError, match="min_budget"):
        RetryPolicy(min_budget=value)


def test_zero_min_budget_and_finite_max_backoff_are_valid() -> None:
    policy = RetryPolicy(min_budget=0.0, max_backoff=0.5, factor=1.0)
    assert (policy.min_budget, policy.max_backoff, policy.factor) == (0.0, 0.5, 1.0)


# -- the algorithm ----------------------------------------------------------------------------


def test_full_jitter_multiplies_the_ceiling() -> None:
    backoff = Backoff(RetryPolicy(), FAR, uniform=_draws(0.5, 0.25, 1.0, 0.0))
    assert _waits(backoff, [0, 0, 0, 0]) == [0.5, 0.5, 4.0, 0.0]


def test_without_jitter_the_plain_value() -> None:
    backoff = Backoff(RetryPolicy(jitter=False), FAR, uniform=_draws())
    assert _waits(backoff, [0] * 5) == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_initial_backoff_and_factor() -> None:
    policy = RetryPolicy(initial_backoff=0.25, factor=3.0, jitter=False)
    assert _waits(Backoff(policy, FAR), [0] * 4) == [0.25, 0.75, 2.25, 6.75]


def test_max_backoff_caps_the_ceiling() -> None:
    policy = RetryPolicy(max_backoff=3.0, jitter=False)
    assert _waits(Backoff(policy, FAR), [0] * 5) == [1.0, 2.0, 3.0, 3.0, 3.0]


def test_max_backoff_caps_before_the_jitter() -> None:
    policy = RetryPolicy(max_backoff=3.0)
    backoff = Backoff(policy, FAR, uniform=_draws(0.5, 0.5, 0.5, 0.5))
    assert _waits(backoff, [0] * 4) == [0.5, 1.0, 1.5, 1.5]


def test_default_uniform_stays_within_the_ceiling() -> None:
    backoff = Backoff(RetryPolicy(), FAR)
    for ceiling in [1.0, 2.0, 4.0, 8.0]:
        wait = backoff.next_wait(0)
        assert wait is not None
        assert 0.0 <= wait <= ceiling


def test_gives_up_exactly_at_the_boundary() -> None:
    # Exact binary fractions, so the boundary is exact: deadline - min_budget - wait.
    policy = RetryPolicy(initial_backoff=0.5, min_budget=0.25, jitter=False)
    deadline = 100 * NS
    boundary = deadline - NS // 4 - NS // 2
    assert Backoff(policy, deadline).next_wait(boundary) is None
    assert Backoff(policy, deadline).next_wait(boundary + 1) is None
    assert Backoff(policy, deadline).next_wait(deadline) is None
    assert Backoff(policy, deadline).next_wait(boundary - 1) == 0.5


def test_give_up_uses_the_jittered_wait() -> None:
    policy = RetryPolicy(initial_backoff=1.0, min_budget=0.25)
    deadline = 10 * NS
    now = deadline - NS  # 0.75 s usable: a full 1 s wait would not fit, a quarter does
    assert Backoff(policy, deadline, uniform=_draws(0.25)).next_wait(now) == 0.25
    assert Backoff(policy, deadline, uniform=_draws(0.75)).next_wait(now) is None


def test_zero_min_budget_still_gives_up_when_the_wait_reaches_the_deadline() -> None:
    policy = RetryPolicy(initial_backoff=0.5, min_budget=0.0, jitter=False)
    deadline = 10 * NS
    assert Backoff(policy, deadline).next_wait(deadline - NS // 2) is None
    assert Backoff(policy, deadline).next_wait(deadline - NS // 2 - 1) == 0.5


def test_backoff_grows_only_after_a_wait_is_granted() -> None:
    policy = RetryPolicy(initial_backoff=1.0, min_budget=0.0, jitter=False)
    deadline = 10 * NS
    backoff = Backoff(policy, deadline)
    assert backoff.next_wait(0) == 1.0
    assert backoff.next_wait(0) == 2.0
    # 4 s would overrun from here: give up, and the next wait is still 4 s (not 8 s).
    assert backoff.next_wait(7 * NS) is None
    assert backoff.next_wait(0) == 4.0


def test_a_schedule_in_time() -> None:
    # Waits 1, 2, 4 fit a 10 s budget from t=0 (sleeping each); 8 would end at 15 s >= 9.95.
    policy = RetryPolicy(jitter=False)
    deadline = 10 * NS
    backoff = Backoff(policy, deadline)
    now = 0
    waits = []
    while (wait := backoff.next_wait(now)) is not None:
        waits.append(wait)
        now += int(wait * NS)
    assert waits == [1.0, 2.0, 4.0]
    assert now == 7 * NS
