"""Import one distribution's whole public API and check the jax wall.

Usage: ``python tools/check_walls.py PACKAGE (--jax-free | --jax-allowed)``. Run by
``nox -s walls`` in a fresh environment holding only that distribution and the siblings
it depends on, so a missing dependency or a stray ``import jax`` fails here.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys


def public_modules(package: str) -> list[str]:
    """The package and every submodule whose dotted path has no ``_``-prefixed part."""
    root = importlib.import_module(f"reactantserver.{package}")
    names = [root.__name__]
    for info in pkgutil.walk_packages(root.__path__, prefix=root.__name__ + "."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def main(argv: list[str]) -> int:
    """Import, check, report; returns the exit status."""
    package, mode = argv
    namespace = importlib.import_module("reactantserver")
    if getattr(namespace, "__file__", None) is not None:
        print(f"reactantserver is not a PEP 420 namespace: {namespace.__file__}")
        return 1
    modules = public_modules(package)
    for name in modules:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            getattr(module, attr)
    leaked = sorted(m for m in sys.modules if m == "jax" or m.startswith(("jax.", "jaxlib")))
    if mode == "--jax-free" and leaked:
        print(f"reactantserver.{package} imported jax: {leaked[:5]}")
        return 1
    loaded = "loaded" if leaked else "not loaded"
    print(f"reactantserver.{package}: {len(modules)} public modules import; jax {loaded}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
