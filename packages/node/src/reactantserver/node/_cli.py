"""Command-line entry point of ``reactantserver-node``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``reactantserver-node``; returns the process exit status."""
    del argv
    print(
        "reactantserver-node: not yet implemented (tracked in issue #12).",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
