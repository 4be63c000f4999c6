"""Which examples this interpreter can export: ``python -m examples._available``.

An example whose package declares ``REQUIRES`` (import names beyond the base install, e.g.
``("torch", "torchvision", "torchax")``) is available only where all of them are importable.
``make serve`` exports the available ones and says how to get the others.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

__all__ = ["all_examples", "available_examples", "missing_requirements"]

ROOT = Path(__file__).resolve().parent


def all_examples() -> list[str]:
    """Every example with an ``export.py``, sorted."""
    return sorted(script.parent.name for script in ROOT.glob("*/export.py"))


def missing_requirements(name: str) -> list[str]:
    """The import names ``examples.<name>`` declares in ``REQUIRES`` that are not importable."""
    requires: tuple[str, ...] = getattr(importlib.import_module(f"examples.{name}"), "REQUIRES", ())
    return [module for module in requires if importlib.util.find_spec(module) is None]


def available_examples() -> list[str]:
    """The examples whose requirements are all importable here, sorted."""
    return [name for name in all_examples() if not missing_requirements(name)]


def main() -> int:
    """Print the available examples, one a line; the others go to stderr with what they lack."""
    for name in all_examples():
        missing = missing_requirements(name)
        if missing:
            print(f"{name}: needs {', '.join(missing)}", file=sys.stderr)
        else:
            print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
