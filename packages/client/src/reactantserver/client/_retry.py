"""Which failures are worth another attempt, and how long to wait before it.

One request's schedule::

    backoff = Backoff(RetryPolicy(), deadline_ns)
    wait = backoff.next_wait(time.monotonic_ns())   # None: give up, raise the last error
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import TypeVar

import attrs
import grpc

from reactantserver.client._flow import Flow, Sleep
from reactantserver.client._status import status_code

__all__ = ["Backoff", "RetryPolicy", "retrying_flow"]

T = TypeVar("T")

_NS = 1_000_000_000


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"RetryPolicy.{attribute.name} must be > 0, got {value}")


def _not_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value >= 0:
        raise ValueError(f"RetryPolicy.{attribute.name} must be >= 0, got {value}")


@attrs.frozen
class RetryPolicy:
    """Retry ``RESOURCE_EXHAUSTED`` (and ``UNAVAILABLE``) with jittered backoff in the deadline.

    Nothing else is retried: ``DEADLINE_EXCEEDED``, ``NOT_FOUND``, ``INVALID_ARGUMENT``,
    ``FAILED_PRECONDITION``, ``INTERNAL``, a stale shared-memory registration (recovered
    separately) and non-gRPC errors go straight back to the caller. ``enabled=False`` makes
    exactly one attempt with the full budget.
    """

    enabled: bool = True
    initial_backoff: float = attrs.field(default=1.0, validator=_positive)
    factor: float = attrs.field(default=2.0, validator=_positive)
    max_backoff: float = attrs.field(default=math.inf, validator=_positive)
    min_budget: float = attrs.field(default=0.05, validator=_not_negative)
    jitter: bool = True
    retry_unavailable: bool = True

    def retryable(self, code: grpc.StatusCode | None) -> bool:
        """Whether a failure with status ``code`` (``None``: not a gRPC error) may be retried."""
        if not self.enabled:
            return False
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            return True
        return code is grpc.StatusCode.UNAVAILABLE and self.retry_unavailable


class Backoff:
    """One request's waits: full jitter over an exponentially growing ceiling.

    ``uniform`` draws from ``U(0, 1)``; tests pass their own to pin the sequence.
    """

    def __init__(
        self,
        policy: RetryPolicy,
        deadline_ns: int,
        *,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        self._policy = policy
        self._deadline_ns = deadline_ns
        self._uniform = uniform
        self._backoff = policy.initial_backoff

    def next_wait(self, now_ns: int) -> float | None:
        """Seconds to sleep before the next attempt, or ``None`` when the budget cannot hold it.

        Gives up when ``now + wait >= deadline - min_budget``, so the last attempt always
        keeps ``min_budget`` seconds of its own.
        """
        policy = self._policy
        wait = min(self._backoff, policy.max_backoff)
        if policy.jitter:
            wait *= self._uniform()
        give_up_at = self._deadline_ns - int(policy.min_budget * _NS)
        if now_ns + int(wait * _NS) >= give_up_at:
            return None
        self._backoff *= policy.factor
        return wait


def retrying_flow(policy: RetryPolicy, deadline_ns: int, attempt: Callable[[], Flow[T]]) -> Flow[T]:
    """Run ``attempt()`` until it succeeds, fails for good, or the budget runs out."""
    backoff = Backoff(policy, deadline_ns)
    while True:
        try:
            return (yield from attempt())
        except grpc.RpcError as error:
            if not policy.retryable(status_code(error)):
                raise
            wait = backoff.next_wait(time.monotonic_ns())
            if wait is None:
                raise
            yield Sleep(wait)
