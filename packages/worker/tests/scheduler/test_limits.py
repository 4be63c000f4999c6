"""The worker-wide in-flight cap."""

from __future__ import annotations

import grpc
import pytest

from reactantserver.core.errors import OverloadedError, status_of
from reactantserver.worker.scheduler.limits import InflightLimiter


def test_zero_is_unlimited() -> None:
    limiter = InflightLimiter(0)
    for _ in range(1000):
        assert limiter.try_acquire()
    assert limiter.in_flight == 1000
    assert limiter.shed == 0


def test_over_the_cap_is_shed() -> None:
    limiter = InflightLimiter(2)
    assert limiter.try_acquire()
    assert limiter.try_acquire()
    assert not limiter.try_acquire()
    assert not limiter.try_acquire()
    assert (limiter.in_flight, limiter.shed) == (2, 2)
    limiter.release()
    assert limiter.try_acquire()
    assert (limiter.in_flight, limiter.shed) == (2, 2)


def test_slot_holds_and_releases() -> None:
    limiter = InflightLimiter(1)
    with limiter.slot():
        assert limiter.in_flight == 1
    assert limiter.in_flight == 0


def test_slot_releases_on_error() -> None:
    limiter = InflightLimiter(1)
    with pytest.raises(KeyError), limiter.slot():
        raise KeyError("inner")
    assert limiter.in_flight == 0


def test_full_slot_raises_resource_exhausted() -> None:
    limiter = InflightLimiter(1)
    with limiter.slot():
        with (
            pytest.raises(OverloadedError, match=r"limit 1\); retry later") as info,
            limiter.slot(),
        ):
            pytest.fail("entered a slot over the cap")
        assert info.value.status is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert status_of(info.value) is grpc.StatusCode.RESOURCE_EXHAUSTED
        # The refused request held nothing.
        assert limiter.in_flight == 1
    assert limiter.in_flight == 0
    assert limiter.shed == 1


def test_negative_limit() -> None:
    with pytest.raises(ValueError, match="limit must be >= 0"):
        InflightLimiter(-1)


def test_release_without_acquire() -> None:
    with pytest.raises(RuntimeError, match="release without a matching acquire"):
        InflightLimiter(3).release()


def test_check_refuses_early_at_the_cap_without_taking_a_slot() -> None:
    limiter = InflightLimiter(1)
    limiter.check()  # below the cap: nothing happens
    assert (limiter.in_flight, limiter.shed) == (0, 0)
    with limiter.slot():
        with pytest.raises(OverloadedError, match="limit 1"):
            limiter.check()
        assert (limiter.in_flight, limiter.shed) == (1, 1)
    limiter.check()
    InflightLimiter(0).check()  # unlimited
