"""Command-line entry point of ``reactantserver-worker``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``reactantserver-worker``; returns the process exit status."""
    del argv
    print(
        "reactantserver-worker: not yet implemented (tracked in issue #7).",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
