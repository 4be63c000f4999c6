"""Command-line entry point of ``reactantserver-gateway`` (``python -m reactantserver.gateway``).

``reactantserver-gateway [--config PATH]`` serves; ``reactantserver-gateway ctl ...`` is the
operator CLI for ``GatewayControl``. Exit status: 0 after a clean shutdown (SIGTERM/SIGINT),
1 when start-up fails or the fleet is wedged, 2 for a configuration error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

import uvloop

from reactantserver.core.errors import ConfigError
from reactantserver.core.logs import configure_logging, die_with_parent, hold_records, print_held
from reactantserver.gateway import __version__
from reactantserver.gateway._ctl import ctl_main
from reactantserver.gateway.config import GatewayConfig, load_gateway_config
from reactantserver.gateway.server import GatewayServer

__all__ = ["main"]

_PROG = "reactantserver-gateway"

_log = logging.getLogger("reactantserver.gateway")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="One gRPC endpoint over many ReactantServer workers "
        "(`reactantserver-gateway ctl --help` for the operator CLI).",
    )
    parser.add_argument(
        "--config", type=Path, help="gateway.yml (default $REACTANTSERVER_GATEWAY_FILE)"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


async def _serve(config: GatewayConfig) -> int:
    server = GatewayServer(config, version=__version__)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    starting = asyncio.ensure_future(server.start())
    stopping = asyncio.ensure_future(stop.wait())
    wedged = asyncio.ensure_future(server.wedged.wait())
    status = 0
    try:
        done, _ = await asyncio.wait(
            {starting, stopping, wedged}, return_when=asyncio.FIRST_COMPLETED
        )
        if starting in done and starting.exception() is not None:
            error = starting.exception()
            _log.error("start-up failed: %s", error)
            status = 1
        elif starting not in done:
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
            status = 1 if wedged in done else 0
        else:
            done, _ = await asyncio.wait({stopping, wedged}, return_when=asyncio.FIRST_COMPLETED)
            if wedged in done:
                _log.error("every worker probe timed out; exiting so the supervisor restarts us")
                status = 1
    finally:
        for task in (stopping, wedged):
            task.cancel()
        await server.shut_down()
    return status


def main(argv: list[str] | None = None) -> int:
    """Run ``reactantserver-gateway``; returns the process exit status."""
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["ctl"]:
        return ctl_main(args_list[1:])
    args = _parser().parse_args(args_list)
    error: ConfigError | None = None
    with hold_records() as held:
        try:
            config = load_gateway_config(args.config, os.environ)
        except ConfigError as exc:
            error = exc
    if error is not None:
        print_held(held.records)
        print(f"{_PROG}: configuration error: {error}", file=sys.stderr)
        return 2
    configure_logging(config.logging, held.records)
    die_with_parent()
    return uvloop.run(_serve(config))


if __name__ == "__main__":
    raise SystemExit(main())
