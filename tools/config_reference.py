"""Write docs/reference/configuration.md from the configuration schema.

Usage: ``python tools/config_reference.py`` (``--check``: exit 1 when the page is stale).
Every table row comes from the attrs classes of ``reactantserver.core.config`` (worker and
node files) and ``reactantserver.gateway.config`` (gateway file): key, type, default, the
environment variable that overrides it, and the docstring under the field. The prose around
the tables is written here. ``tests/test_config_reference.py`` fails when the committed page
differs from what this prints.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

from reactantserver.core.config import NodeConfig, WorkerConfig, env_override_variables
from reactantserver.core.config.reference import key_rows, markdown_table
from reactantserver.gateway.config import GatewayConfig, gateway_env_variables

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "configuration.md"

# Node-file keys with a variable of their own (read by reactantserver-node, not the schema).
_NODE_VARIABLES = {
    "role": "REACTANT_ROLE",
    "gpus": "REACTANT_GPUS",
    "cpu_workers": "REACTANT_CPU_WORKERS",
    "supervisor.max_restarts": "REACTANT_SUPERVISOR_MAX_RESTARTS",
    "listen.http": "REACTANT_GATEWAY_LISTEN_HTTP",
    "listen.grpc": "REACTANT_GATEWAY_LISTEN_GRPC",
    "listen.metrics": "REACTANT_GATEWAY_LISTEN_METRICS",
}

_OTHER_VARIABLES = (
    (
        "REACTANT_NODE_FILE",
        "The node file `reactantserver-node` reads (default `/etc/reactantserver/node.yaml`).",
    ),
    (
        "REACTANT_GATEWAY_FILE",
        "The gateway file `reactantserver-gateway` reads, when `--config` is not given.",
    ),
    (
        "REACTANT_CACHE_DIR",
        "Where caches live when `cache_dir` is empty (default "
        "`$XDG_CACHE_HOME/reactantserver`, else `~/.cache/reactantserver`).",
    ),
    (
        "REACTANT_WORKER_NAME",
        "The worker's name (its `worker` metric label); the node sets it for each child.",
    ),
    ("REACTANT_WORKER_THREADS", "Threads of a worker's hook pool (default `min(cpu_count, 16)`)."),
)

_INTRO = """\
# Configuration reference

This page lists every configuration key of the worker, the node file and the gateway: its
type, its default, the environment variable that overrides it, and what it does. It is
generated from the configuration classes (`python tools/config_reference.py`), so it cannot
drift from the code; a test fails when it does.

How values combine, lowest to highest precedence:

1. the default below;
2. the file: a worker's keys come from the node file's `global:` block, then its entry under
   `workers:` (a standalone `reactantserver-worker --model-repo DIR` uses the defaults); the
   gateway reads its own YAML file;
3. the environment: `INFERENCE_SERVER_<KEY>` for worker keys (dots and nesting become `_`,
   e.g. `scheduler.max_queue_depth` is `INFERENCE_SERVER_SCHEDULER_MAX_QUEUE_DEPTH`),
   `REACTANT_GATEWAY_<KEY>` for gateway keys, and the `REACTANT_*` variables of the node.

A bad value anywhere stops the process at start-up with one line per problem, naming the key
path (`scheduler.max_queue_depth: must be >= 1, got 0`). Boolean variables accept
`1/true/yes/on` and `0/false/no/off`; list variables separate items with `:` (worker) or `,`
(gateway). For a runnable node file, see [deployment.md](../deployment.md).
"""


def _inverse(table: Mapping[str, str]) -> dict[str, str]:
    """Dotted key -> its variables, ", "-separated (a key may have an alias)."""
    inverse: dict[str, list[str]] = {}
    for variable, key in sorted(table.items()):
        inverse.setdefault(key, []).append(variable)
    return {key: ", ".join(names) for key, names in inverse.items()}


def render() -> str:
    """The whole page."""
    worker_vars = _inverse(env_override_variables())
    gateway_vars = _inverse(gateway_env_variables())
    worker = key_rows(WorkerConfig, variable=lambda p: worker_vars.get(".".join(p), ""))
    node = key_rows(
        NodeConfig,
        variable=lambda p: _NODE_VARIABLES.get(".".join(p), ""),
        skip=("source",),
        rename={"global_settings": "global"},
    )
    gateway = key_rows(GatewayConfig, variable=lambda p: gateway_vars.get(".".join(p), ""))
    others = "\n".join(f"| `{name}` | {meaning} |" for name, meaning in _OTHER_VARIABLES)
    return "\n".join(
        [
            _INTRO,
            "## Worker keys",
            "",
            "In the node file's `global:` block or a worker's entry; each also as its variable.",
            "",
            markdown_table(worker),
            "## Node file",
            "",
            "The top level of the node file `reactantserver-node` reads (`--node-file`).",
            "",
            markdown_table(node),
            "## Gateway file",
            "",
            "The file `reactantserver-gateway --config FILE` reads; the node writes one for its",
            "embedded gateway from the node file's `gateway:` block.",
            "",
            markdown_table(gateway),
            "## Other environment variables",
            "",
            "| Variable | Meaning |",
            "|---|---|",
            others,
            "",
        ]
    )


def main(argv: list[str]) -> int:
    """Write the page, or with ``--check`` report whether it is current."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = PAGE.read_text() if PAGE.exists() else ""
        if current != text:
            print(f"{PAGE} is stale: run python tools/config_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
