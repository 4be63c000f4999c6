"""Hypothesis settings of the fuzz suite: deterministic, bounded, no deadline, no database.

``REACTANT_FUZZ_EXAMPLES`` (default :data:`DEFAULT_EXAMPLES`) is the number of examples the
whole suite tries; each test takes its ``share`` of it::

    @fuzz_settings(0.05)
    @given(case=...)
    def test_something(case): ...
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

DEFAULT_EXAMPLES = 300
"""Examples across the suite in CI; ``REACTANT_FUZZ_EXAMPLES=5000`` for a long local run."""
MIN_EXAMPLES = 3


def total_examples() -> int:
    """The suite's example budget (``REACTANT_FUZZ_EXAMPLES`` or the default)."""
    return int(os.environ.get("REACTANT_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))


def fuzz_settings(share: float) -> settings:
    """Settings for a test that takes ``share`` (0-1) of the suite's examples."""
    return settings(
        max_examples=max(MIN_EXAMPLES, round(total_examples() * share)),
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=False,
        # The fixtures are module-scoped processes, deliberately shared by every example.
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
