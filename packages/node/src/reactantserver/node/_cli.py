"""Command-line entry point of ``reactantserver-node``.

``reactantserver-node`` supervises the node; ``healthcheck`` exits 0 iff it is ready;
``materialize`` prints what the supervisor would run. Exit status: 0 after a graceful shutdown
(or a healthy check), 1 when start-up fails, the configuration is wrong, a crash budget is
exhausted or the check fails; 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import yaml

from reactantserver.core.config import (
    DEFAULT_NODE_FILE,
    NODE_FILE_VARIABLE,
    NodeConfig,
    add_triton_arguments,
    env_override_variables,
    load_node_config,
    node_config_from_mapping,
    port_flags,
    upgrade_env,
    worker_key_flags,
)
from reactantserver.core.errors import ConfigError
from reactantserver.node import __version__
from reactantserver.node._health import healthcheck, readiness_urls
from reactantserver.node._logmux import LogMux
from reactantserver.node._overrides import (
    GPUS_VARIABLE,
    ROLE_VARIABLE,
    apply_flags,
    apply_overrides,
)
from reactantserver.node._plan import NodePlan, materialized_documents, plan_node
from reactantserver.node._supervisor import Supervisor

__all__ = ["main"]

_PROG: Final = "reactantserver-node"
_COMMANDS: Final = ("run", "healthcheck", "materialize")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="Run a ReactantServer node: one worker per device plus an embedded gateway.",
    )
    parser.add_argument(
        "command",
        nargs="?",
        default="run",
        choices=_COMMANDS,
        help="run (default): supervise the node; healthcheck: exit 0 iff ready; "
        "materialize: print the resolved node file and children",
    )
    parser.add_argument(
        "--node-file",
        type=Path,
        help=f"node file (default ${NODE_FILE_VARIABLE}, else {DEFAULT_NODE_FILE})",
    )
    add_triton_arguments(parser)
    parser.add_argument("--role", help=f"all | workers | gateway (overrides {ROLE_VARIABLE})")
    parser.add_argument("--gpus", help=f"device count or comma list (overrides {GPUS_VARIABLE})")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _node_file(flag: Path | None, env: Mapping[str, str]) -> Path | None:
    """The node file to read; ``None`` when there is none to read and none was named.

    Without ``--node-file`` and ``$REACTANTSERVER_NODE_FILE``, the default file is optional when
    ``--model-repository`` says what to serve (then the node runs on the defaults).
    """
    if flag is not None:
        return flag
    named = env.get(NODE_FILE_VARIABLE, "").strip()
    if named:
        return Path(named)
    return DEFAULT_NODE_FILE if DEFAULT_NODE_FILE.is_file() else None


def _load(args: argparse.Namespace, env: Mapping[str, str]) -> NodeConfig:
    repositories = args.model_repository or []
    for directory in repositories:
        if not directory.is_dir():
            raise ConfigError(f"--model-repository: {directory} is not a directory")
    path = _node_file(args.node_file, env)
    if path is None and not repositories:
        raise ConfigError(
            f"no node file ({DEFAULT_NODE_FILE} does not exist): give --model-repository DIR, "
            f"--node-file or ${NODE_FILE_VARIABLE}"
        )
    if path is None:
        data = {"model_repo": [str(directory) for directory in repositories]}
        node = node_config_from_mapping(data, env)
    else:
        node = load_node_config(path, env)
    node = apply_overrides(node, env, role=args.role, gpus=args.gpus)
    # Worker keys set by flags are checked when the plan resolves each worker.
    return apply_flags(
        node,
        model_repository=repositories,
        ports=port_flags(args),
        worker_flags=worker_key_flags(args),
    )


def _plan(args: argparse.Namespace, env: Mapping[str, str], *, write: bool) -> NodePlan:
    return plan_node(_load(args, env), env, write=write)


#: The environment variable of ``logging.format`` (the one the children read too).
LOGGING_FORMAT_VARIABLE: Final = next(
    name for name, key in env_override_variables().items() if key == "logging.format"
)


def _json_logs(plan: NodePlan, env: Mapping[str, str]) -> bool:
    """Whether the children log JSON: ``REACTANTSERVER_WORKER_LOGGING_FORMAT``, else ``global:``."""
    logging_block = plan.node.global_settings.get("logging")
    configured = logging_block.get("format") if isinstance(logging_block, Mapping) else None
    chosen = env.get(LOGGING_FORMAT_VARIABLE, "").strip() or configured or "text"
    return str(chosen).lower() == "json"


def _supervise(plan: NodePlan, env: Mapping[str, str], deprecated: Sequence[str]) -> int:
    mux = LogMux(sys.stdout.buffer, json_lines=_json_logs(plan, env))
    notes = (*deprecated, *plan.notes)
    supervisor = Supervisor(
        plan.children, plan.node.supervisor, mux, role=plan.node.role.value, notes=notes
    )
    if plan.public_grpc is not None:
        mux.supervisor(
            f"public REST {plan.public_http}, gRPC {plan.public_grpc}, "
            f"metrics {plan.public_metrics}"
        )
    return asyncio.run(supervisor.run())


def _print_warnings(messages: Sequence[str]) -> None:
    for message in messages:
        print(f"{_PROG}: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run ``reactantserver-node``; returns the process exit status."""
    args = _parser().parse_args(argv)
    # Older variable names become the new ones here, once: the children get only new names.
    # (the supervisor logs the warnings when it runs; otherwise they go to stderr).
    upgrade = upgrade_env(os.environ)
    env = dict(upgrade.env)
    if args.command != "run":
        _print_warnings(upgrade.messages)
    try:
        plan = _plan(args, env, write=args.command == "run")
    except ConfigError as error:
        _print_warnings(upgrade.messages if args.command == "run" else ())
        print(f"{_PROG}: configuration error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        _print_warnings(upgrade.messages if args.command == "run" else ())
        print(f"{_PROG}: start-up failed: {error}", file=sys.stderr)
        return 1
    if args.command == "materialize":
        yaml.safe_dump(materialized_documents(plan), sys.stdout, sort_keys=False)
        return 0
    if args.command == "healthcheck":
        try:
            failures = healthcheck(readiness_urls(plan, plan.node.role))
        except ValueError as error:
            failures = [str(error)]
        for failure in failures:
            print(f"{_PROG}: not healthy: {failure}", file=sys.stderr)
        return 1 if failures else 0
    return _supervise(plan, env, upgrade.messages)


if __name__ == "__main__":
    raise SystemExit(main())
