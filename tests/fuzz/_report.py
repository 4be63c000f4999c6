"""The figures the fuzz suite reports: cases per strategy, statuses seen, worker RSS.

Tests record into the module-level tallies; ``conftest.py`` prints them in the terminal
summary (issue 14 asks for the numbers, not only a green run)::

    record("datatypes", "INVALID_ARGUMENT")
    RSS["request worker"] = (before, after)
"""

from __future__ import annotations

from collections import Counter, defaultdict

CASES: defaultdict[str, Counter[str]] = defaultdict(Counter)
"""Per strategy, how many cases ended with each status (``OK`` for a success)."""
RSS: dict[str, tuple[int, int]] = {}
"""Per worker, its resident set size in bytes after warm-up and at the end of the run."""

MIB = 1 << 20


def record(strategy: str, status: str) -> None:
    """Count one case of ``strategy`` that ended with ``status``."""
    CASES[strategy][status] += 1


def summary_lines() -> list[str]:
    """The report: one line per strategy, a total, then the RSS figures."""
    lines = []
    total = 0
    for strategy in sorted(CASES):
        statuses = CASES[strategy]
        count = sum(statuses.values())
        total += count
        seen = ", ".join(f"{name} {n}" for name, n in sorted(statuses.items()))
        lines.append(f"{strategy:<22} {count:>5} cases: {seen}")
    if CASES:
        lines.append(f"{'total':<22} {total:>5} cases")
    for worker, (before, after) in sorted(RSS.items()):
        lines.append(
            f"RSS {worker}: {before / MIB:.1f} MiB after warm-up, {after / MIB:.1f} MiB at the "
            f"end ({(after - before) / MIB:+.1f} MiB)"
        )
    return lines
