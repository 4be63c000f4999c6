"""docs/reference/configuration.md is what tools/config_reference.py generates from the schema."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from reactantserver.core.config import NodeConfig, WorkerConfig, env_override_variables
from reactantserver.core.config.reference import key_rows
from reactantserver.gateway.config import GatewayConfig, gateway_env_variables

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


def test_the_committed_reference_is_current() -> None:
    tool = _tool()
    committed = tool.PAGE.read_text()
    assert committed == tool.render(), (
        "docs/reference/configuration.md is stale: run python tools/config_reference.py"
    )


def test_every_key_has_a_description_and_every_override_is_listed() -> None:
    page = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    for cls in (WorkerConfig, NodeConfig, GatewayConfig):
        rows = key_rows(cls, variable=lambda path: "", skip=("source",))
        assert rows
        undocumented = [row.key for row in rows if not row.description]
        assert not undocumented, f"{cls.__name__}: write a docstring under {undocumented}"
    for variable in [*env_override_variables(), *gateway_env_variables()]:
        assert f"`{variable}`" in page, variable


def test_rows_follow_the_schema() -> None:
    rows = {row.key: row for row in key_rows(WorkerConfig, variable=lambda path: "V")}
    depth = rows["scheduler.max_queue_depth"]
    assert depth.type == "int"
    assert depth.default == f"`{WorkerConfig().scheduler.max_queue_depth}`"
    assert depth.variable == "V"
    assert "scheduler.models.<name>.weight" in rows
    assert not [key for key in rows if key.startswith(("worker_name", "hook_threads"))]
