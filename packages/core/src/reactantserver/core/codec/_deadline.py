"""The effective deadline of a request from its three budget sources."""

from __future__ import annotations

import math

#: Budgets longer than this (10 years) mean "no deadline": clients use huge values for infinity.
MAX_BUDGET_NS = 10 * 365 * 24 * 3600 * 1_000_000_000


def effective_deadline_ns(
    now_ns: int,
    *,
    grpc_time_remaining: float | None = None,
    timeout_us: int | None = None,
    timeout_ns: int | None = None,
) -> int | None:
    """The tightest absolute ``time.monotonic_ns()`` deadline of the sources present.

    ``grpc_time_remaining`` is ``context.time_remaining()`` in seconds (``None`` = no gRPC
    deadline; non-positive = already expired, so the result is not after ``now_ns``).
    ``timeout_us`` is Triton's ``timeout`` parameter and ``timeout_ns`` is
    ``reactant_timeout_ns``; for these two a non-positive value means no deadline. Any budget
    above :data:`MAX_BUDGET_NS` counts as none. ``None`` when no source bounds the request.
    """
    budgets: list[int] = []
    if grpc_time_remaining is not None and not math.isnan(grpc_time_remaining):
        if grpc_time_remaining <= 0:
            # gRPC reports an expired deadline as 0; it is a deadline in the past, not "none".
            budgets.append(0)
        elif grpc_time_remaining * 1e9 <= MAX_BUDGET_NS:
            budgets.append(round(grpc_time_remaining * 1e9))
    if timeout_us is not None and 0 < timeout_us * 1000 <= MAX_BUDGET_NS:
        budgets.append(timeout_us * 1000)
    if timeout_ns is not None and 0 < timeout_ns <= MAX_BUDGET_NS:
        budgets.append(timeout_ns)
    if not budgets:
        return None
    return now_ns + min(budgets)
