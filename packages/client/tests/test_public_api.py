"""The public surface: an honest, sorted ``__all__``, and an import that pulls in no jax."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

import reactantserver.client as package

SPEC_NAMES = {
    "KServeModel",
    "InferInput",
    "InferOutput",
    "RequestedOutput",
    "infer_sync",
    "infer_async",
    "InferenceIO",
    "OutputSpec",
    "ModelIOSpec",
    "TensorInfo",
    "StagingPool",
    "ShmRegion",
    "create_region",
    "register_region",
    "unregister_region",
    "shutdown",
    "RetryPolicy",
    "validate_io",
    "manifest_io_spec",
}
"""Names the client's documentation (packages/client/README.md) calls part of the API."""


def test_all_is_sorted_and_unique() -> None:
    assert list(package.__all__) == sorted(package.__all__)
    assert len(set(package.__all__)) == len(package.__all__)


@pytest.mark.parametrize("name", package.__all__)
def test_every_name_is_importable(name: str) -> None:
    assert hasattr(package, name)
    namespace: dict[str, object] = {}
    exec(f"from reactantserver.client import {name}", namespace)
    assert namespace[name] is getattr(package, name)


def test_the_spec_names_are_exported() -> None:
    missing = SPEC_NAMES - set(package.__all__)
    assert not missing


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from reactantserver.client import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(package.__all__)


@pytest.mark.parametrize("name", [n for n in package.__all__ if n != "__version__"])
def test_public_objects_are_documented(name: str) -> None:
    obj = getattr(package, name)
    assert inspect.getdoc(obj), f"{name} has no docstring"


def test_no_public_module_besides_the_package() -> None:
    import pkgutil

    public = [m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")]
    assert public == []


_PROBE = """
import json, sys
import reactantserver.client
loaded = sorted(sys.modules)
print(json.dumps(loaded))
"""


def test_import_pulls_in_no_jax_and_no_tritonclient() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert "reactantserver.client" in loaded
    heavy = [
        m
        for m in loaded
        if m.split(".")[0] in ("jax", "jaxlib", "tritonclient")
        or m.startswith(
            ("reactantserver.worker", "reactantserver.gateway", "reactantserver.export")
        )
    ]
    assert heavy == []


_BOTH = """
import reactantserver.client
import tritonclient.grpc
import tritonclient.grpc.service_pb2 as theirs
from reactantserver.core.protocol import grpc_service_pb2 as ours
assert theirs.ModelInferRequest.DESCRIPTOR.full_name != ours.ModelInferRequest.DESCRIPTOR.full_name
print("ok")
"""


def test_shares_a_process_with_tritonclient() -> None:
    pytest.importorskip("tritonclient.grpc")
    done = subprocess.run(
        [sys.executable, "-c", _BOTH], check=False, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
