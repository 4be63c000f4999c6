"""The worker-wide in-flight cap.

Every ``ModelInfer`` call and every stream message holds one slot from decode to response;
health, metadata and control RPCs are exempt. Over the cap a request fails at once with
``RESOURCE_EXHAUSTED``::

    with limiter.slot():
        outputs = await scheduler.infer(...)
"""

from __future__ import annotations

import threading

from reactantserver.core.errors import OverloadedError

__all__ = ["InflightLimiter"]


class InflightLimiter:
    """Counts in-flight inference requests; ``limit`` 0 means unlimited.

    ``shed`` counts refusals (``reactantserver_worker_requests_shed_total``).
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.limit = limit
        self.in_flight = 0
        self.shed = 0
        self._lock = threading.Lock()
        self._slot = _Slot(self)

    def try_acquire(self) -> bool:
        """Take a slot; ``False`` (and one more shed) when the cap is reached."""
        with self._lock:
            if self.limit and self.in_flight >= self.limit:
                self.shed += 1
                return False
            self.in_flight += 1
            return True

    def check(self) -> None:
        """Refuse early: :class:`OverloadedError` (one more shed) when the cap is reached now.

        Takes no slot: the handler calls it before decoding, so a full worker spends nothing
        on a request it will refuse; :meth:`slot` still decides.
        """
        refusal = self.refusal()
        if refusal is not None:
            raise OverloadedError(refusal)

    def refusal(self) -> str | None:
        """Why a request arriving now is refused (one more shed), or None: the transport's
        gate, asked before the request is even read."""
        if not self.limit or self.in_flight < self.limit:
            return None
        with self._lock:
            self.shed += 1
        return _refusal_text(self.limit)

    def release(self) -> None:
        """Give a slot back."""
        with self._lock:
            if self.in_flight <= 0:
                raise RuntimeError("release without a matching acquire")
            self.in_flight -= 1

    def slot(self) -> _Slot:
        """Hold a slot for the block; :class:`OverloadedError` when none is free.

        A plain context manager rather than a generator one: it runs once per request.
        """
        return self._slot


class _Slot:
    """``with limiter.slot():`` takes a slot on entry and gives it back on exit."""

    __slots__ = ("_limiter",)

    def __init__(self, limiter: InflightLimiter) -> None:
        self._limiter = limiter

    def __enter__(self) -> None:
        limiter = self._limiter
        if not limiter.try_acquire():
            raise OverloadedError(_refusal_text(limiter.limit))

    def __exit__(self, *exc: object) -> None:
        self._limiter.release()


def _refusal_text(limit: int) -> str:
    return f"too many concurrent inference requests (limit {limit}); retry later"
