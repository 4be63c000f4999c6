"""Our inference-protocol descriptors equal the installed tritonclient's, message by message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

DUMPER = Path(__file__).with_name("_descriptor_dump.py")
# Methods we serve beyond Triton's service (docs/reference/protocol.md).
EXTRA_METHODS = {"IsSameIPCNamespace"}
EXTRA_MESSAGES = {"IsSameIPCNamespaceRequest", "IsSameIPCNamespaceResponse"}


def _dump(side: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(DUMPER), side], capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.fixture(scope="module")
def triton() -> dict[str, Any]:
    result = _dump("tritonclient")
    # The separate process really is separate: it never loaded our package.
    assert not [m for m in result["loaded"] if m.startswith("reactantserver")]
    dump: dict[str, Any] = result["dump"]
    return dump


@pytest.fixture(scope="module")
def ours() -> dict[str, Any]:
    result = _dump("ours")
    assert not [m for m in result["loaded"] if m.startswith("tritonclient")]
    dump: dict[str, Any] = result["dump"]
    return dump


def test_reference_is_not_vacuous(triton: dict[str, Any]) -> None:
    assert len(triton["messages"]) > 100
    assert "ModelInferRequest.InferInputTensor" in triton["messages"]
    assert "ModelConfig" in triton["messages"]
    assert "ModelInfer" in triton["methods"]


@pytest.mark.parametrize("kind", ["messages", "enums"])
def test_every_triton_type_is_identical_in_ours(
    kind: str, triton: dict[str, Any], ours: dict[str, Any]
) -> None:
    missing = sorted(set(triton[kind]) - set(ours[kind]))
    assert not missing, f"{kind} missing from our protos: {missing}"
    differing = {
        name: (spec, ours[kind][name])
        for name, spec in triton[kind].items()
        if ours[kind][name] != spec
    }
    assert not differing, f"{kind} that differ (triton, ours): {differing}"


def test_only_declared_extras(triton: dict[str, Any], ours: dict[str, Any]) -> None:
    assert set(ours["messages"]) - set(triton["messages"]) == EXTRA_MESSAGES
    assert set(ours["enums"]) == set(triton["enums"])
    assert set(ours["methods"]) - set(triton["methods"]) == EXTRA_METHODS


def test_every_method_identical_with_public_path(
    triton: dict[str, Any], ours: dict[str, Any]
) -> None:
    for name, spec in triton["methods"].items():
        assert spec["path"] == f"/inference.GRPCInferenceService/{name}"
        assert ours["methods"][name] == spec, name
    extra = ours["methods"]["IsSameIPCNamespace"]
    assert extra["path"] == "/inference.GRPCInferenceService/IsSameIPCNamespace"
