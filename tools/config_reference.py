"""Write docs/reference/configuration.md from the configuration schemas.

Usage: ``python tools/config_reference.py`` (rewrites the file) or ``--check`` (exit 1 when the
committed file differs from a fresh rendering; ``tests/test_config_reference.py`` does the same).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from reactantserver.core.config import (
    CACHE_DIR_VARIABLE,
    NODE_FILE_VARIABLE,
    WORKER_NAME_VARIABLE,
    WORKER_THREADS_VARIABLE,
    NodeConfig,
    WorkerConfig,
    env_alias_variables,
    env_override_variables,
)
from reactantserver.core.config.reference import ReferenceSection, render_reference
from reactantserver.gateway.config import FILE_VARIABLE, GatewayConfig, gateway_env_variables
from reactantserver.node._overrides import (
    CPU_WORKERS_VARIABLE,
    GPUS_VARIABLE,
    LISTEN_GRPC_VARIABLE,
    LISTEN_METRICS_VARIABLE,
    MAX_RESTARTS_VARIABLE,
    ROLE_VARIABLE,
)

ROOT: Final = Path(__file__).resolve().parent.parent
REFERENCE: Final = ROOT / "docs" / "reference" / "configuration.md"
COMMAND: Final = "python tools/config_reference.py"

_INTRO: Final = f"""\
Generated from the configuration classes by `{COMMAND}` (or `make reference`); do not edit it
by hand: a test fails when it is stale. A key's description is its field's docstring in
`reactantserver.core.config` (worker and node files) or `reactantserver.gateway.config`
(gateway file). Environment variables win over the file; `<name>` in a key stands for any model
name."""

_WORKER_INTRO: Final = f"""\
The keys of one worker: a node file's `global:` block and its worker entries, or a mapping
handed to `worker_config_from_mapping`. Every scalar key has an `INFERENCE_SERVER_*` variable;
per-model keys have none. Not keys: `{NODE_FILE_VARIABLE}` (the node file),
`{WORKER_NAME_VARIABLE}` (the entry this worker serves), `{WORKER_THREADS_VARIABLE}` (the hook
pool) and `{CACHE_DIR_VARIABLE}` (the cache root when `cache_dir` is empty)."""

_NODE_INTRO: Final = """\
The node supervisor's file (`reactantserver-node --node-file`). Command-line flags win over the
variables listed here, and the variables over the file."""

_GATEWAY_INTRO: Final = f"""\
The gateway's file (`reactantserver-gateway --config`, else `${FILE_VARIABLE}`, else
`/etc/reactantserver/gateway.yml` when it exists); without one, defaults and variables only.
Unknown `REACTANT_GATEWAY_*` variables are ignored."""


def _by_key(variables: Mapping[str, str]) -> dict[str, list[str]]:
    table: dict[str, list[str]] = {}
    for variable, key in sorted(variables.items()):
        table.setdefault(key, []).append(variable)
    return table


def render() -> str:
    """The reference as it should be committed."""
    node_variables = {
        "role": [ROLE_VARIABLE],
        "gpus": [GPUS_VARIABLE],
        "cpu_workers": [CPU_WORKERS_VARIABLE],
        "listen.grpc": [LISTEN_GRPC_VARIABLE],
        "listen.metrics": [LISTEN_METRICS_VARIABLE],
        "supervisor.max_restarts": [MAX_RESTARTS_VARIABLE],
    }
    sections = [
        ReferenceSection(
            "Worker keys",
            _WORKER_INTRO,
            WorkerConfig,
            _by_key({**env_override_variables(), **env_alias_variables()}),
        ),
        ReferenceSection("Node file", _NODE_INTRO, NodeConfig, node_variables),
        ReferenceSection(
            "Gateway file", _GATEWAY_INTRO, GatewayConfig, _by_key(gateway_env_variables())
        ),
    ]
    return render_reference("Configuration reference", _INTRO, sections)


def main(argv: list[str]) -> int:
    """Write the reference, or with ``--check`` report whether the committed one is current."""
    text = render()
    if argv == ["--check"]:
        current = REFERENCE.read_text(encoding="utf-8") if REFERENCE.is_file() else ""
        if current != text:
            print(f"{REFERENCE.relative_to(ROOT)} is stale; regenerate it with `{COMMAND}`")
            return 1
        return 0
    if argv:
        print(__doc__)
        return 2
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
