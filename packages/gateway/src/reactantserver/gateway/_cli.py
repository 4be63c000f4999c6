"""Command-line entry point of ``reactantserver-gateway``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``reactantserver-gateway``; returns the process exit status."""
    del argv
    print(
        "reactantserver-gateway: not yet implemented (tracked in issue #11).",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
