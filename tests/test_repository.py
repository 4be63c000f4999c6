"""The monorepo keeps its shape: six lockstep distributions behind their dependency walls."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "client", "gateway", "worker", "node", "export")

# 00-overview §Package map: the runtime dependencies each distribution may declare.
ALLOWED = {
    "core": {"numpy", "protobuf", "grpcio", "pyyaml", "attrs", "cattrs"},
    "client": {"reactantserver-core", "grpcio"},
    "gateway": {
        "reactantserver-core",
        "grpcio",
        "grpcio-health-checking",
        "grpcio-reflection",
        "uvloop",
        "aiohttp",
        "prometheus-client",
    },
    "worker": {
        "reactantserver-core",
        "jax",
        "jaxlib",
        "grpcio-health-checking",
        "grpcio-reflection",
        "uvloop",
        "aiohttp",
        "prometheus-client",
    },
    "node": {"reactantserver-core", "reactantserver-gateway", "psutil", "nvidia-ml-py"},
    # tqdm: issue #4 asks for a well-kept progress library rather than a hand-drawn bar.
    "export": {"reactantserver-core", "jax", "tqdm"},
}
SCRIPTS = {
    "gateway": "reactantserver-gateway",
    "worker": "reactantserver-worker",
    "node": "reactantserver-node",
    "export": "reactantserver-export",
}


def _meta(package: str) -> dict[str, Any]:
    meta: dict[str, Any] = tomllib.loads(
        (ROOT / "packages" / package / "pyproject.toml").read_text()
    )["project"]
    return meta


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()


@pytest.mark.parametrize("package", PACKAGES)
def test_distribution_template(package: str) -> None:
    base = ROOT / "packages" / package
    for required in ("pyproject.toml", "README.md", "tests"):
        assert (base / required).exists(), f"packages/{package}/{required}"
    src = base / "src" / "reactantserver"
    assert (src / package / "py.typed").is_file()
    assert (src / package / "__init__.py").is_file()
    assert not (src / "__init__.py").exists(), "reactantserver must stay a PEP 420 namespace"
    meta = _meta(package)
    assert meta["name"] == f"reactantserver-{package}"
    assert meta["requires-python"] == ">=3.11"
    assert list((base / "tests").glob("test_*.py")), f"packages/{package}/tests has no tests"


def test_no_namespace_init_anywhere() -> None:
    assert not list(ROOT.glob("packages/*/src/reactantserver/__init__.py"))


def test_lockstep_version_and_exact_sibling_pins() -> None:
    versions = {p: _meta(p)["version"] for p in PACKAGES}
    assert len(set(versions.values())) == 1, versions
    version = versions["core"]
    for package in PACKAGES:
        meta = _meta(package)
        requirements = list(meta["dependencies"])
        for extra in meta.get("optional-dependencies", {}).values():
            requirements += extra
        for requirement in requirements:
            if requirement.startswith("reactantserver-"):
                assert requirement.endswith(f"=={version}"), (package, requirement)


@pytest.mark.parametrize("package", PACKAGES)
def test_dependencies_stay_inside_the_walls(package: str) -> None:
    declared = {_name(r) for r in _meta(package)["dependencies"]}
    assert declared <= ALLOWED[package], declared - ALLOWED[package]


def test_extras_of_the_package_map() -> None:
    assert set(_meta("worker")["optional-dependencies"]) == {"cuda12", "cuda13"}
    assert set(_meta("node")["optional-dependencies"]) == {"worker"}
    assert set(_meta("export")["optional-dependencies"]) == {"flax", "torch", "validate"}


@pytest.mark.parametrize("package", PACKAGES)
def test_console_scripts(package: str) -> None:
    scripts = _meta(package).get("scripts", {})
    if package in SCRIPTS:
        assert scripts == {SCRIPTS[package]: f"reactantserver.{package}._cli:main"}
    else:
        assert scripts == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_installed_version_matches_pyproject(package: str) -> None:
    module = importlib.import_module(f"reactantserver.{package}")
    assert module.__version__ == _meta(package)["version"]


def _load_walls_tool() -> Callable[[str], list[str]]:
    # The walls session and this test must agree on what "public module" means: use the tool's.
    spec = importlib.util.spec_from_file_location("check_walls", ROOT / "tools" / "check_walls.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    public_modules: Callable[[str], list[str]] = module.public_modules
    return public_modules


_public_modules = _load_walls_tool()


def _isort_key(name: str) -> tuple[int, str]:
    # The order ruff's RUF022 keeps: CONSTANTS, then Classes, then functions and modules.
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


@pytest.mark.parametrize("module_name", [m for p in PACKAGES for m in _public_modules(p)])
def test_public_surface_is_explicit(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{module_name} declares no __all__"
    assert list(exported) == sorted(exported, key=_isort_key), f"{module_name}.__all__ unsorted"
    for name in exported:
        assert hasattr(module, name), f"{module_name}.__all__ names missing {name}"


def _imported_modules(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every absolute module path ``tree`` imports, with ``from m import n`` also as ``m.n``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def _private_of_another(module: str, owner: str | None) -> bool:
    parts = module.split(".")
    if len(parts) < 3 or parts[0] != "reactantserver" or parts[1] == owner:
        return False
    return any(part.startswith("_") and not part.startswith("__") for part in parts[2:])


def test_no_distribution_imports_another_ones_private_modules() -> None:
    """Distributions meet at public names only; the benchmarks, examples and tests too."""
    offenders = []
    for folder in ("packages", "tests", "bench", "examples", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT)
            owner = relative.parts[1] if relative.parts[0] == "packages" else None
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            offenders += [
                f"{relative}:{line}: {module}"
                for line, module in _imported_modules(tree)
                if _private_of_another(module, owner)
            ]
    assert not offenders, "private modules of another distribution:\n" + "\n".join(offenders)


def test_the_import_wall_check_sees_an_offender() -> None:
    tree = ast.parse("from reactantserver.worker.runtime._cpu_arena import CpuArena\n")
    found = [m for _, m in _imported_modules(tree) if _private_of_another(m, "export")]
    assert found == [
        "reactantserver.worker.runtime._cpu_arena",
        "reactantserver.worker.runtime._cpu_arena.CpuArena",
    ]
    assert not [m for _, m in _imported_modules(tree) if _private_of_another(m, "worker")]


def test_the_licence_file_matches_the_declared_licence() -> None:
    """LICENSE holds the Apache License 2.0 text that every distribution declares."""
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in text
    for package in PACKAGES:
        assert _meta(package)["license"] == "Apache-2.0", package
