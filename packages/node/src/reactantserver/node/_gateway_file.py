"""The embedded gateway's configuration, materialized from the node file.

The node's ``gateway:`` block plus what only the supervisor knows: the public ``listen``
addresses, the workers' ``endpoints``, ``metrics_endpoints`` and ``worker_names``, and the gRPC
message limits mirrored from the workers. The result is checked with the gateway's own parser, so
a bad ``gateway:`` block fails when the node is planned, not when the gateway starts.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import yaml

from reactantserver.core.config import NodeConfig, WorkerConfig
from reactantserver.core.errors import ConfigError
from reactantserver.gateway.config import GatewayConfig, gateway_config_from_mapping

__all__ = [
    "GRPC_LIMIT_KEYS",
    "WorkerAddress",
    "format_address",
    "materialize_gateway",
    "split_address",
    "validate_gateway",
    "write_yaml_atomically",
]

#: The gRPC limits the gateway mirrors from the workers unless its block sets them.
GRPC_LIMIT_KEYS: Final = ("max_recv_msg_bytes", "max_send_msg_bytes")


@attrs.frozen
class WorkerAddress:
    """Where the gateway reaches one worker: its name, host, gRPC port and HTTP port (0 = off)."""

    name: str
    host: str
    grpc_port: int
    http_port: int


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` → ``(host, port)``; brackets around an IPv6 host are removed."""
    host, _, port = address.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def format_address(host: str, port: int) -> str:
    """``(host, port)`` → ``"host:port"`` (IPv6 hosts in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def materialize_gateway(
    node: NodeConfig,
    workers: Sequence[WorkerAddress],
    configs: Sequence[WorkerConfig],
) -> dict[str, Any]:
    """The ``gateway.yml`` mapping of ``node``'s embedded gateway in front of ``workers``.

    ``metrics_endpoints`` is written only when every worker serves HTTP (the gateway pairs them
    with ``endpoints`` one to one). Message limits not set in the ``gateway:`` block are the
    smallest of the workers' ``grpc.*`` limits, so the gateway never accepts a message a worker
    would refuse.
    """
    data: dict[str, Any] = _plain(node.gateway)
    listen = node.listen
    data["listen"] = {"http": listen.http, "grpc": listen.grpc, "metrics": listen.metrics}
    data["endpoints"] = [format_address(w.host, w.grpc_port) for w in workers]
    if workers and all(w.http_port for w in workers):
        data["metrics_endpoints"] = [format_address(w.host, w.http_port) for w in workers]
    data["worker_names"] = [w.name for w in workers]
    grpc = data.setdefault("grpc", {})
    if isinstance(grpc, dict) and configs:
        for key in GRPC_LIMIT_KEYS:
            if key not in grpc:
                grpc[key] = min(getattr(config.grpc, key) for config in configs)
    return data


def validate_gateway(
    data: Mapping[str, Any], env: Mapping[str, str], *, source: Path | None
) -> GatewayConfig:
    """``data`` parsed by the gateway itself; its errors are re-raised as the node file's.

    Every line of the gateway parser's message gets the ``gateway.`` prefix, so it reads as the
    key path of the node file's ``gateway:`` block.
    """
    try:
        return gateway_config_from_mapping(data, env)
    except ConfigError as exc:
        lines = [f"gateway.{line}" for line in str(exc).splitlines()]
        if source is not None:
            lines.append(f"(in {source})")
        raise ConfigError("\n".join(lines)) from None


def write_yaml_atomically(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as YAML to ``path`` via a temporary file and a rename (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(_plain(data), sort_keys=False)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
