"""docs/reference/configuration.md is what the configuration schemas generate today."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from reactantserver.core.config.reference import strip_citations

ROOT = Path(__file__).resolve().parent.parent


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "config_reference", ROOT / "tools" / "config_reference.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_reference_is_current() -> None:
    tool = _tool()
    committed = tool.REFERENCE.read_text(encoding="utf-8") if tool.REFERENCE.is_file() else ""
    assert committed == tool.render(), (
        f"{tool.REFERENCE.relative_to(ROOT)} is stale: regenerate it with `{tool.COMMAND}` "
        "(or `make reference`) and commit the result"
    )


def test_every_key_is_listed_once_per_file() -> None:
    text = _tool().render()
    for key in (
        "`runtime.mem_fraction`",
        "`scheduler.models.<name>.weight`",
        "`workers[].gpu`",
        "`supervisor.liveness_failures`",
        "`scheduling.model_aware.network_seconds`",
        "`REACTANT_GATEWAY_WEDGE_EXIT_ROUNDS`",
        "`REACTANT_FANOUT_BYTES`",
    ):
        assert key in text
    assert "§" not in text
    assert "(beyond" not in text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("waits (beyond, 04); 0 never", "waits; 0 never"),
        ("a budget (04 §Request admission).", "a budget."),
        ("shared (09 beyond) by name", "shared by name"),
        ("keepalive (as the worker's, 02)", "keepalive (as the worker's)"),
        ("a cap (0: off) stays", "a cap (0: off) stays"),
        ("the default (02: empty means default)", "the default (empty means default)"),
        ("level (12 §Logs)", "level"),
    ],
)
def test_strip_citations(text: str, expected: str) -> None:
    assert strip_citations(text) == expected
