"""Command-line entry point of ``reactantserver-export``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``reactantserver-export``; returns the process exit status."""
    del argv
    print(
        "reactantserver-export: not yet implemented (tracked in issue #4).",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
