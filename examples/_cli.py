"""The command line shared by every ``examples/<name>/export.py``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["DEFAULT_OUT", "run"]

DEFAULT_OUT = Path("build/models")
"""Where ``make serve`` keeps the exported bundles."""


def run(
    export: Callable[..., list[Path]], description: str, argv: Sequence[str] | None = None
) -> int:
    """Parse ``--out DIR [--no-progress]``, call ``export(out, progress=…)``, print the paths.

    Each bundle lands in ``DIR/<bundle name>/``; an existing one is replaced atomically.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"model directory that receives one bundle per model (default: {DEFAULT_OUT})",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    for path in export(args.out, progress=not args.no_progress):
        print(f"exported {path}")
    return 0
