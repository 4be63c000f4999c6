"""Development sessions: ``nox`` (= ``nox -s tests``) runs everything CI runs.

Sessions:
  tests            every test of every distribution in one environment, then walls, lint, proto
  core, client, …  one distribution installed alone (non-editable) with its own tests
  walls            each distribution installed alone imports its public API; core, client,
                   gateway and node leave jax out of sys.modules
  lint             ruff (lint + format check) and mypy
  proto            regenerate the checked-in protobuf code and fail if it differs from git
  zoo              the model zoo (PyTorch and Flax models, the detector, the framework examples)
                   with the torch and flax extras: ~2.5 min of installs into a fresh venv (torch
                   2.12.1 with its CUDA wheels, ~6 GB), ~7 min of tests on 2 cores
  bench            the benchmark suite (not in the default sessions; ~15 min on 2 cores)
  soak             the soak test at full size, 100,000 requests (not in the default sessions)
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES = ("core", "client", "gateway", "worker", "node", "export")
JAX_FREE = ("core", "client", "gateway", "node")
TEST_REQUIREMENTS = ROOT / "requirements" / "test.txt"
PROTO_REQUIREMENTS = ROOT / "requirements" / "proto.txt"
LINT_REQUIREMENTS = ROOT / "requirements" / "lint.txt"
ZOO_REQUIREMENTS = ROOT / "requirements" / "zoo.txt"
BENCH_REQUIREMENTS = ROOT / "requirements" / "bench.txt"
PROTO_OUT = str(ROOT / "packages/core/src")
PROTO_GENERATED = "packages/core/src/reactantserver/core/_proto"

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"
nox.options.error_on_external_run = True


def _closure(package: str) -> list[str]:
    """``package`` and the sibling distributions it depends on, dependencies first."""
    order: list[str] = []

    def visit(name: str) -> None:
        meta = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())
        for dep in meta["project"]["dependencies"]:
            if dep.startswith("reactantserver-"):
                # "reactantserver-core[server]==0.1.0" -> "core"
                visit(dep.split("==")[0].split("[")[0].removeprefix("reactantserver-"))
        if name not in order:
            order.append(name)

    visit(package)
    return order


def _editable_all(extras: dict[str, str] | None = None) -> list[str]:
    """``-e packages/<name>`` for every distribution, ``[extras]`` where ``extras`` names some."""
    args: list[str] = []
    for name in PACKAGES:
        chosen = (extras or {}).get(name)
        args += ["-e", f"packages/{name}[{chosen}]" if chosen else f"packages/{name}"]
    return args


@nox.session
def tests(session: nox.Session) -> None:
    """Every test in one environment with all six distributions installed editable."""
    session.install(*_editable_all(), "-r", str(TEST_REQUIREMENTS))
    session.run("pytest", *session.posargs)
    if not session.posargs:
        # "everything": the isolation, lint and proto checks run after the suite.
        for package in PACKAGES:
            session.notify(f"walls(package='{package}')")
        session.notify("zoo")
        session.notify("lint")
        session.notify("proto")


@nox.session(reuse_venv=True)
def zoo(session: nox.Session) -> None:
    """The model zoo and the framework examples with the torch and flax extras installed.

    torch with its CUDA libraries is several GB: the venv is reused between local runs, and
    pip's cache keeps the wheels for a fresh one. ``REACTANT_ZOO=1`` turns the zoo's
    missing-framework skips into errors; ``REACTANT_ZOO_FULL=1`` (passed through) runs the
    full input sizes.
    """
    session.install(*_editable_all({"export": "torch,flax"}), "-r", str(ZOO_REQUIREMENTS))
    session.run(
        "pytest",
        "tests/zoo",
        "packages/export/tests/test_torch.py",
        "packages/export/tests/test_flax.py",
        *session.posargs,
        env={"REACTANT_ZOO": "1"},
    )


def _package_session(name: str) -> None:
    @nox.session(name=name)
    def run(session: nox.Session) -> None:
        session.install(*(f"./packages/{p}" for p in _closure(name)))
        session.install("-r", str(TEST_REQUIREMENTS))
        session.run("pytest", f"packages/{name}/tests", *session.posargs)

    run.__doc__ = f"reactantserver-{name} installed alone, with its own tests."


for _name in PACKAGES:
    _package_session(_name)


@nox.session
@nox.parametrize("package", PACKAGES)
def walls(session: nox.Session, package: str) -> None:
    """One distribution alone in a fresh venv: its public API imports (jax-free where required)."""
    session.install(*(f"./packages/{p}" for p in _closure(package)))
    session.run(
        "python",
        str(ROOT / "tools" / "check_walls.py"),
        package,
        "--jax-free" if package in JAX_FREE else "--jax-allowed",
    )


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff lint and format check, then mypy (strict) over sources and tests."""
    session.install(*_editable_all(), "-r", str(TEST_REQUIREMENTS), "-r", str(LINT_REQUIREMENTS))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    sources = [f"packages/{p}/src" for p in PACKAGES]
    session.run("mypy", *sources, "noxfile.py", "tools", "bench", "examples")
    # Test folders share file names across packages; check each on its own.
    for p in PACKAGES:
        session.run("mypy", f"packages/{p}/tests")
    session.run("mypy", "tests")


@nox.session
def proto(session: nox.Session) -> None:
    """Regenerate ``*_pb2*`` from proto/ with the pinned generator; fail on any diff."""
    session.install("-r", str(PROTO_REQUIREMENTS))
    protos = sorted(
        p.relative_to(ROOT / "proto").as_posix() for p in (ROOT / "proto").rglob("*.proto")
    )
    kserve = [p for p in protos if "/kserve/" in p]
    control = [p for p in protos if "/control/" in p]
    protoc = ["python", "-m", "grpc_tools.protoc", "-I", str(ROOT / "proto")]
    session.chdir(ROOT / "proto")
    session.run(*protoc, f"--python_out={PROTO_OUT}", f"--mypy_out={PROTO_OUT}", *kserve)
    session.run(
        *protoc,
        f"--python_out={PROTO_OUT}",
        f"--mypy_out={PROTO_OUT}",
        f"--grpc_python_out={PROTO_OUT}",
        f"--mypy_grpc_out={PROTO_OUT}",
        *control,
    )
    if "--no-check" in session.posargs:
        return
    session.chdir(ROOT)
    status = session.run(
        "git", "status", "--porcelain", "--", PROTO_GENERATED, silent=True, external=True
    )
    if status:
        session.error(
            "generated protobuf code differs from git; commit the regenerated files:\n"
            + str(status)
        )


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark in its suite size: bench/results/<date>-<machine>.{json,md} and plots.

    Arguments go to ``python -m bench.suite`` (``nox -s bench -- --only density``). A full run
    (no arguments) in which every benchmark passed then writes its figures into
    docs/performance.md; the session fails when any benchmark failed (the report says which).
    """
    session.install(*_editable_all(), "-r", str(BENCH_REQUIREMENTS))
    session.run("python", "-m", "bench.suite", *session.posargs)
    if not session.posargs:
        session.run("python", "-m", "bench.suite", "--update-docs")


@nox.session
def soak(session: nox.Session) -> None:
    """tests/soak at full size: 100,000 mixed requests at concurrency 32 against one worker.

    ``REACTANT_SOAK_REQUESTS`` overrides the count; arguments go to pytest. The report (errors,
    RSS growth and its slope, threads, descriptors, shared memory) is printed, not kept: the
    JSON lands in pytest's tmp dir, out of git.
    """
    session.install(*_editable_all(), "-r", str(TEST_REQUIREMENTS))
    requests = os.environ.get("REACTANT_SOAK_REQUESTS", "100000")
    session.run(
        "pytest",
        "tests/soak",
        "-s",
        "-p",
        "no:cacheprovider",
        "-o",
        "timeout=3600",
        *session.posargs,
        env={"REACTANT_SOAK_REQUESTS": requests},
    )
