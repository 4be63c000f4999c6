"""Triton's command-line flags, shared by ``reactantserver-worker`` and ``reactantserver-node``.

Both commands accept the flags a Triton user types (``--model-repository`` repeatable,
``--grpc-port``, ``--http-port``, ``--metrics-port``, ``--model-control-mode``, ``--load-model``,
``--log-format``). :func:`add_triton_arguments` declares them on a parser;
:func:`worker_key_flags` turns the ones that set worker keys into :class:`FlagValue` items,
which the loader applies after the file and the environment (a flag wins over both)::

    parser = argparse.ArgumentParser()
    add_triton_arguments(parser)
    args = parser.parse_args(["--model-control-mode", "explicit", "--load-model", "mlp"])
    worker_key_flags(args)
    # [FlagValue("--model-control-mode", ("model_control_mode",), "explicit"),
    #  FlagValue("--load-model", ("scheduler", "models", "mlp", "residency"), "device")]

The ports are left to each command: a worker's are ``endpoints.*`` keys, a node's are the
``listen.*`` addresses (see :func:`port_flags`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from reactantserver.core.config.rules import MAX_PORT
from reactantserver.core.errors import ConfigError

__all__ = [
    "CONTROL_MODES",
    "FlagValue",
    "add_triton_arguments",
    "port_flags",
    "worker_key_flags",
]

#: ``--model-control-mode`` spellings: Triton's three, then ours (the config's values).
CONTROL_MODES: Final[Mapping[str, str]] = {
    "none": "static",
    "poll": "dynamic",
    "explicit": "explicit",
    "static": "static",
    "dynamic": "dynamic",
}


@attrs.frozen
class FlagValue:
    """One command-line flag's value for one key (``value`` as written; the loader checks it)."""

    flag: str
    path: tuple[str, ...]
    value: Any


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"must be in [0, {MAX_PORT}], got {port}")
    return port


def add_triton_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare Triton's serving flags on ``parser`` (destinations named after the flags)."""
    group = parser.add_argument_group("Triton-compatible flags")
    group.add_argument(
        "--model-repository",
        "--model-repo",
        dest="model_repository",
        type=Path,
        action="append",
        metavar="DIR",
        help="a model repository (one bundle directory per model); repeat for several",
    )
    group.add_argument("--http-port", type=_port, metavar="PORT", help="KServe REST (8000)")
    group.add_argument("--grpc-port", type=_port, metavar="PORT", help="gRPC (8001)")
    group.add_argument(
        "--metrics-port", type=_port, metavar="PORT", help="/metrics and the status page (8002)"
    )
    group.add_argument(
        "--model-control-mode",
        choices=sorted(CONTROL_MODES),
        help="none (read once), poll (follow the repository) or explicit (load/unload calls); "
        "static and dynamic are this server's names for none and poll",
    )
    group.add_argument(
        "--load-model",
        action="append",
        metavar="NAME",
        help="in explicit mode, a model to serve from start-up; repeat for several",
    )
    group.add_argument("--log-format", choices=("text", "json"), help="log line format")


def worker_key_flags(args: argparse.Namespace) -> list[FlagValue]:
    """The worker keys ``args`` sets: control mode, start-up models, log format.

    ``--load-model`` follows Triton's rule: it needs ``--model-control-mode explicit`` on the
    same command line. Each named model is pinned on the device, which in explicit mode is
    what makes it serve from start-up; ``*`` is refused (name the models).
    """
    flags: list[FlagValue] = []
    mode = CONTROL_MODES[args.model_control_mode] if args.model_control_mode else None
    if mode is not None:
        flags.append(FlagValue("--model-control-mode", ("model_control_mode",), mode))
    for name in args.load_model or ():
        if mode != "explicit":
            raise ConfigError("--load-model needs --model-control-mode explicit")
        if not name or name == "*":
            raise ConfigError(
                f"--load-model: name a model, got {name!r} (in explicit mode every model "
                "in the repository is loaded; --load-model chooses the ones that serve)"
            )
        path = ("scheduler", "models", name, "residency")
        flags.append(FlagValue("--load-model", path, "device"))
    if args.log_format:
        flags.append(FlagValue("--log-format", ("logging", "format"), args.log_format))
    return flags


def port_flags(args: argparse.Namespace) -> dict[str, int]:
    """The ports ``args`` sets, by role: ``{"http": 8000, "grpc": ..., "metrics": ...}``."""
    ports = {"http": args.http_port, "grpc": args.grpc_port, "metrics": args.metrics_port}
    return {role: port for role, port in ports.items() if port is not None}
