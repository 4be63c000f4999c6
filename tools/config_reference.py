"""Write docs/reference/configuration.md from the configuration schema.

Usage: ``python tools/config_reference.py`` (``--check``: exit 1 when the page is stale).
Every table row comes from the attrs classes of ``reactantserver.core.config`` (worker and
node files) and ``reactantserver.gateway.config`` (gateway file): key, type, default, the
environment variable that overrides it, and the docstring under the field; the table of
process variables and of the older names comes from core's variable scheme. The prose around
the tables is written here. ``tests/test_config_reference.py`` fails when the committed page
differs from what this prints.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path

from reactantserver.core.config import (
    NODE_KEY_VARIABLES,
    PROCESS_VARIABLES,
    RENAMED_PREFIXES,
    NodeConfig,
    WorkerConfig,
    env_override_variables,
    renamed_variables,
)
from reactantserver.core.config.reference import key_rows, markdown_table
from reactantserver.gateway.config import GatewayConfig, gateway_env_variables

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "configuration.md"

# Node-file keys with a variable of their own (read by reactantserver-node, not the schema);
# the node's listen.* addresses are its gateway's, so they share the gateway's variables.
_NODE_VARIABLES = {
    **{".".join(path): name for name, path in NODE_KEY_VARIABLES.items()},
    **{
        key: name
        for name, key in gateway_env_variables().items()
        if key in ("listen.http", "listen.grpc", "listen.metrics")
    },
}
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
3. the environment: `REACTANTSERVER_WORKER_<KEY>` for worker keys (dots and nesting become
   `_`, e.g. `scheduler.max_queue_depth` is `REACTANTSERVER_WORKER_SCHEDULER_MAX_QUEUE_DEPTH`),
   `REACTANTSERVER_GATEWAY_<KEY>` for gateway keys and `REACTANTSERVER_NODE_<KEY>` for the
   node keys that have one (see [Environment variables](#environment-variables) below);
4. command-line flags, where a program has them.

A bad value anywhere stops the process at start-up with one line per problem, naming the key
path (`scheduler.max_queue_depth: must be >= 1, got 0`). Boolean variables accept
`1/true/yes/on` and `0/false/no/off`; list variables separate items with `:` (worker) or `,`
(gateway). For a runnable node file, see [deployment.md](../deployment.md).
"""

_SCHEME = """\
## Environment variables

Every variable starts with `REACTANTSERVER_`, then names the component it configures:

| Variable | What it sets |
|---|---|
| `REACTANTSERVER_WORKER_<KEY_PATH>` | a worker key (table above) |
| `REACTANTSERVER_GATEWAY_<KEY_PATH>` | a gateway key (table above); `_WORKERS`, \
`_WORKER_METRICS`, `_WORKER_NAMES` set the worker lists |
| `REACTANTSERVER_NODE_<KEY_PATH>` | a node-file key that has a variable (table above) |
| the fixed list below | process settings that are not keys |

`<KEY_PATH>` is the dotted key with dots and nesting as `_`, in capitals:
`scheduler.discipline` is `REACTANTSERVER_WORKER_SCHEDULER_DISCIPLINE`. Per-model and
per-endpoint maps have no variables. A variable of the component's prefix that names no key
is reported at start-up with the closest name (`ignoring unknown variable
REACTANTSERVER_WORKER_SCHEDULER_DISCIPLIN (did you mean
REACTANTSERVER_WORKER_SCHEDULER_DISCIPLINE?)`).

The process variables are a fixed list; no key may have one of these names (the key tables
refuse to build, and a test checks every key-derived name against the list):

| Variable | Meaning |
|---|---|
{process}

### Older names (deprecated)

The names before this scheme still work. At start-up each older name found is reported once
(`REACTANT_ROLE is deprecated; use REACTANTSERVER_NODE_ROLE`); when the new name is set too,
the new name wins and the report says so. Under a node only the supervisor reports them: its
children are started with the new names only. Removed variables
(`INFERENCE_SERVER_RUNTIME_RESIDENCY_MODE`, `INFERENCE_SERVER_BATCH_POLICY_*`, ...) stay errors
with their hint, under either spelling.

| Older name | New name |
|---|---|
{renamed}
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
    process = "\n".join(f"| `{name}` | {meaning} |" for name, meaning in PROCESS_VARIABLES.items())
    renamed = [(f"{old}<KEY_PATH>", f"{new}<KEY_PATH>") for old, new in RENAMED_PREFIXES.items()]
    renamed += sorted(renamed_variables().items())
    scheme = _SCHEME.format(
        process=process, renamed="\n".join(f"| `{old}` | `{new}` |" for old, new in renamed)
    )
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
            scheme,
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
