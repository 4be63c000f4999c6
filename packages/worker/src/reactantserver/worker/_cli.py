"""Command-line entry point of ``reactantserver-worker`` (also ``python -m reactantserver.worker``).

``--model-repository DIR`` (repeatable) serves directories standalone on Triton's ports (REST
8000, gRPC 8001, metrics 8002); ``--node-file F --worker NAME`` serves one entry of a node file.
Every key can be overridden from the environment, and Triton's flags (``--grpc-port``,
``--http-port``, ``--metrics-port``, ``--model-control-mode``, ``--load-model``,
``--log-format``) win over both. Exit status: 0 after a clean shutdown, 1 when the device
cannot be used or start-up fails, 2 for a configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import uvloop

from reactantserver.core.config import (
    WorkerConfig,
    add_triton_arguments,
    load_worker_config,
    port_flags,
    worker_key_flags,
)
from reactantserver.core.errors import ConfigError
from reactantserver.core.logs import configure_logging, die_with_parent, hold_records, print_held
from reactantserver.worker import __version__
from reactantserver.worker.runtime.xla_env import apply_xla_environment
from reactantserver.worker.server import WorkerServer

__all__ = ["main"]

_PROG = "reactantserver-worker"

_log = logging.getLogger("reactantserver.worker")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=_PROG, description="Serve StableHLO model bundles.")
    add_triton_arguments(parser)
    parser.add_argument(
        "--node-file", type=Path, help="node file (default $REACTANTSERVER_NODE_FILE)"
    )
    parser.add_argument(
        "--worker", help="the node-file worker to serve ($REACTANTSERVER_WORKER_NAME)"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _config(args: argparse.Namespace) -> WorkerConfig:
    config = load_worker_config(
        node_file=args.node_file,
        worker=args.worker,
        model_repo=args.model_repository,
        ports=port_flags(args),
        flags=worker_key_flags(args),
        env=os.environ,
    )
    for directory in config.model_dirs:
        if not Path(directory).is_dir():
            raise ConfigError(f"model_dirs: {directory} is not a directory")
    return config


async def _serve(config: WorkerConfig) -> int:
    server = WorkerServer(config, version=__version__)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await server.start()
    except (OSError, RuntimeError) as exc:
        _log.error("cannot open the listeners: %s", exc)
        await server.shut_down()
        return 1
    booted = asyncio.ensure_future(server.wait_booted())
    stopping = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({booted, stopping}, return_when=asyncio.FIRST_COMPLETED)
    status = 0
    if booted in done and booted.exception() is not None:
        error = booted.exception()
        _log.error("start-up failed: %s", error, exc_info=error)
        status = 1
    elif stopping not in done:
        await stopping
    for task in (booted, stopping):
        task.cancel()
    await server.shut_down()
    return status


def main(argv: list[str] | None = None) -> int:
    """Run ``reactantserver-worker``; returns the process exit status."""
    args = _parser().parse_args(argv)
    error: ConfigError | None = None
    with hold_records() as held:
        try:
            config = _config(args)
        except ConfigError as exc:
            error = exc
    if error is not None:
        print_held(held.records)
        print(f"{_PROG}: configuration error: {error}", file=sys.stderr)
        return 2
    configure_logging(config.logging, held.records)
    _log.info(
        "config loaded worker=%s overrides=%s",
        config.worker_name or "-",
        [f"{o.variable}->{o.path}" for o in config.env_overrides],
    )
    autotune_dir = (
        Path(config.runtime.autotune_cache_dir) if config.runtime.autotune_cache else None
    )
    for note in apply_xla_environment(config.runtime, os.environ, autotune_cache_dir=autotune_dir):
        _log.info("xla environment %s", note)
    die_with_parent()
    return uvloop.run(_serve(config))


if __name__ == "__main__":
    raise SystemExit(main())
