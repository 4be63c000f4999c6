"""The node and the older variable names: they work, are reported once, and never reach a child."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from pathlib import Path

import attrs
import yaml

from reactantserver.core.config import Role, node_config_from_mapping
from reactantserver.node._child import Child
from reactantserver.node._logmux import LogMux
from reactantserver.node._overrides import apply_overrides
from reactantserver.node._plan import plan_node
from reactantserver.node._spec import ChildKind

from ._nvml import must_not_ask

OLDER = {
    "REACTANT_ROLE": "all",
    "REACTANT_GPUS": "2",
    "REACTANT_WORKER_THREADS": "3",
    "REACTANT_GATEWAY_LISTEN_GRPC": "127.0.0.1:18001",
    "INFERENCE_SERVER_RUNTIME_BACKEND": "cpu",
}
_PRINT_NAMES = (
    "import os; print(' '.join(sorted(n for n in os.environ "
    "if n.startswith(('REACTANT', 'INFERENCE_SERVER')))))"
)


def _base(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")}


def test_older_node_variables_still_apply(tmp_path: Path) -> None:
    node = node_config_from_mapping({"model_repo": str(tmp_path)}, {})
    env = {"REACTANT_ROLE": "workers", "REACTANT_CPU_WORKERS": "2", "REACTANT_GPUS": "0,1"}
    node = apply_overrides(node, env)
    assert (node.role, node.cpu_workers, node.gpus) == (Role.WORKERS, 2, ("0", "1"))


def test_the_children_get_only_the_new_names(tmp_path: Path) -> None:
    env = {**_base(tmp_path), **OLDER}
    node = apply_overrides(node_config_from_mapping({"model_repo": str(tmp_path)}, env), env)
    plan = plan_node(
        node, env, nvml_count=must_not_ask, cores=8, directory=tmp_path / "run", write=False
    )
    assert [child.name for child in plan.children] == ["worker0", "worker1", "gateway"]
    assert plan.devices.source == "REACTANTSERVER_NODE_GPUS"
    for child in plan.children:
        assert not [n for n in child.env if n.startswith(("REACTANT_", "INFERENCE_SERVER_"))]
        assert child.env["REACTANTSERVER_WORKER_RUNTIME_BACKEND"] == "cpu"
        assert child.env["REACTANTSERVER_GATEWAY_LISTEN_GRPC"] == "127.0.0.1:18001"
    worker = plan.children[0]
    assert worker.env["REACTANTSERVER_WORKER_NAME"] == "worker0"
    assert worker.env["REACTANTSERVER_WORKER_THREADS"] == "3"
    assert "REACTANTSERVER_SUPERVISOR_PID" in worker.env
    assert "REACTANTSERVER_GATEWAY_STARTUP_WAIT_SECONDS" in plan.children[2].env

    # A real child process started from the spec sees the same names.
    out = io.BytesIO()
    spec = attrs.evolve(worker, argv=(sys.executable, "-c", _PRINT_NAMES))

    async def main() -> None:
        child = Child(spec, LogMux(out))
        await child.start()
        assert await child.wait() == 0

    asyncio.run(main())
    names = out.getvalue().decode().removeprefix("[worker0] ").split()
    assert all(name.startswith("REACTANTSERVER_") for name in names)
    assert "REACTANTSERVER_WORKER_NAME" in names
    assert spec.kind is ChildKind.WORKER


def test_the_node_command_reports_each_older_name_once(tmp_path: Path) -> None:
    env = {**os.environ, **_base(tmp_path), **OLDER}
    for name in [n for n in env if n.startswith("REACTANTSERVER_")]:
        del env[name]
    node_file = tmp_path / "node.yaml"
    node_file.write_text(f"model_repo: {tmp_path}\n")
    env["REACTANT_NODE_FILE"] = str(node_file)
    done = subprocess.run(
        [sys.executable, "-m", "reactantserver.node", "materialize"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "deprecated" in line]
    assert sorted(warnings) == sorted(
        f"reactantserver-node: warning: {old} is deprecated; use {new}"
        for old, new in [
            ("REACTANT_ROLE", "REACTANTSERVER_NODE_ROLE"),
            ("REACTANT_GPUS", "REACTANTSERVER_NODE_GPUS"),
            ("REACTANT_WORKER_THREADS", "REACTANTSERVER_WORKER_THREADS"),
            ("REACTANT_GATEWAY_LISTEN_GRPC", "REACTANTSERVER_GATEWAY_LISTEN_GRPC"),
            ("INFERENCE_SERVER_RUNTIME_BACKEND", "REACTANTSERVER_WORKER_RUNTIME_BACKEND"),
            ("REACTANT_NODE_FILE", "REACTANTSERVER_NODE_FILE"),
        ]
    )
    shown = yaml.safe_load(done.stdout)
    assert shown["devices"]["source"] == "REACTANTSERVER_NODE_GPUS"
    workers = [c for c in shown["children"] if c["kind"] == "worker"]
    assert [c["REACTANTSERVER_WORKER_THREADS"] for c in workers] == ["3", "3"]
    assert shown["node"]["listen"]["grpc"] == "127.0.0.1:18001"
