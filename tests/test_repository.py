"""The monorepo keeps its shape: six lockstep distributions behind their dependency walls."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import re
import tokenize
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "client", "gateway", "worker", "node", "export")

# The dependency walls (docs/architecture.md): the runtime dependencies each distribution may
# declare.
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
    assert set(_meta("core")["optional-dependencies"]) == {"server", "tracing"}
    assert set(_meta("worker")["optional-dependencies"]) == {"cuda12", "cuda13", "tracing"}
    assert set(_meta("gateway")["optional-dependencies"]) == {"tracing"}
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


def _module_of(path: Path, src: Path) -> str:
    """The dotted module ``path`` holds (a package for its ``__init__.py``)."""
    parts = path.relative_to(src).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_targets(tree: ast.Module, module: str, is_package: bool) -> Iterator[str]:
    """Every dotted name ``tree`` imports, anywhere in it; relative imports made absolute."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[: None if is_package else -1]
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            yield base
            # ``from pkg import name`` may name a submodule.
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _import_graph(sources: Iterable[Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``sources`` (``src`` folders) that importing it imports.

    Imports under ``if TYPE_CHECKING:`` and inside functions count, and so does every package
    ``__init__`` that importing a module runs first; a module's own packages do not.
    """
    files = {
        _module_of(path, src): path
        for src in sources
        for path in sorted(src.glob("reactantserver/**/*.py"))
    }
    graph: dict[str, set[str]] = {module: set() for module in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target in _import_targets(tree, module, path.name == "__init__.py"):
            parts = target.split(".")  # the module imported, or its ``module.name``
            for prefix in (".".join(parts[:n]) for n in range(len(parts), 0, -1)):
                if prefix in files and not f"{module}.".startswith(f"{prefix}."):
                    graph[module].add(prefix)
    return graph


def _reachable(graph: Mapping[str, set[str]], start: str) -> set[str]:
    """The modules a path of imports leads to from ``start`` (``start`` only on a cycle)."""
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph[module]
    return seen


def _import_cycles(graph: Mapping[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of ``graph`` with more than one module."""
    reach = {module: _reachable(graph, module) for module in graph}
    return {
        frozenset(other for other in reach[module] if module in reach[other])
        for module in graph
        if module in reach[module]
    }


def test_no_import_cycles() -> None:
    """No module imports itself back, by type-only, function-local or package imports."""
    graph = _import_graph(ROOT / "packages" / package / "src" for package in PACKAGES)
    cycles = sorted(sorted(c) for c in _import_cycles(graph))
    assert not cycles, "modules that import one another:\n" + "\n".join(map(str, cycles))


def test_the_cycle_check_sees_planted_cycles(tmp_path: Path) -> None:
    """A type-only cycle, a function-local one and one through a package ``__init__``."""
    sources = {
        "__init__.py": "from reactantserver.planted.base import Base\n",
        "typed_a.py": "if TYPE_CHECKING:\n    from reactantserver.planted.typed_b import B\n",
        "typed_b.py": "from reactantserver.planted.typed_a import A\n",
        "local_a.py": "def f() -> None:\n    from . import local_b\n",
        "local_b.py": "import reactantserver.planted.local_a\n",
        "base.py": "from reactantserver.planted.sub.leaf import leaf\n",
        "sub/__init__.py": "from .user import User\n",
        "sub/user.py": "from reactantserver.planted.base import Base\n",
        "sub/leaf.py": "import numpy\n",
    }
    for name, text in sources.items():
        path = tmp_path / "reactantserver" / "planted" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    planted = "reactantserver.planted"
    assert _import_cycles(_import_graph([tmp_path])) == {
        frozenset({f"{planted}.typed_a", f"{planted}.typed_b"}),
        frozenset({f"{planted}.local_a", f"{planted}.local_b"}),
        frozenset({f"{planted}.base", f"{planted}.sub", f"{planted}.sub.user"}),
    }


# Citations of the design specification the product grew from, which is not in the repository:
# "(04 §Request admission)", "(beyond, 04)", "(12)", "spec 03", "09-node.md", "../shared/".
_CITATION = re.compile(
    r"\b(?:0\d|1[0-2]) ?§|\(beyond,? ?(?:0\d|1[0-2])\)|\((?:0\d|1[0-2])(?:, (?:0\d|1[0-2]))*\)"
    r"|\bspec (?:0\d|1[0-2])\b|\b(?:0\d|1[0-2])-[a-z-]+\.md\b|\.\./shared/"
)


def _citations(text: str) -> list[int]:
    return [text.count("\n", 0, m.start()) + 1 for m in _CITATION.finditer(text)]


def _python_citations(path: Path) -> list[int]:
    """Lines where a comment or a string of ``path`` cites the specification."""
    source = path.read_text(encoding="utf-8")
    lines = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            lines += [token.start[0] + n - 1 for n in _citations(token.string)]
    return lines


def test_nothing_cites_a_specification_the_repository_does_not_hold() -> None:
    """Docstrings, comments and docs say what they mean or point to docs/ instead."""
    found = []
    for folder in ("packages", "tests", "bench", "examples", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            # This file holds the pattern and its examples.
            if "_pb2" not in path.name and path != Path(__file__).resolve():
                found += [f"{path.relative_to(ROOT)}:{n}" for n in _python_citations(path)]
    texts = [*(ROOT / "docs").rglob("*.md"), *ROOT.glob("*.md"), *ROOT.glob("packages/*/README.md")]
    texts += [ROOT / "bench" / "README.md", *(ROOT / "deploy").rglob("*.md")]
    texts += [*(ROOT / "deploy").rglob("*.y*ml"), *(ROOT / "deploy" / "monitoring").rglob("*.json")]
    texts += [*(ROOT / "docker").iterdir()]
    for path in sorted(texts):
        found += [f"{path.relative_to(ROOT)}:{n}" for n in _citations(path.read_text())]
    assert not found, "cites the design specification; say what it means instead:\n" + "\n".join(
        found
    )


def test_the_citation_check_sees_one() -> None:
    assert _citations("queued (04 §Request admission) and\nkept (beyond, 04), see 09-node.md") == [
        1,
        2,
        2,
    ]
    assert not _citations("batch (10 models), 1.5x (11 vs. 10), see docs/reference/")
