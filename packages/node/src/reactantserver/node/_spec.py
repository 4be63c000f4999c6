"""What the supervisor runs: one :class:`ChildSpec` per child process.

The planner (``_plan``) turns a node file into child specs; the supervisor (``_supervisor``)
runs them. Nothing here starts a process or reads the environment.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

import attrs

__all__ = ["LOOPBACK", "ChildKind", "ChildSpec", "probe_host"]

#: Where the supervisor probes a child that listens on a wildcard address.
LOOPBACK: Final = "127.0.0.1"
_WILDCARDS: Final = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


class ChildKind(enum.StrEnum):
    """The two kinds of children a node runs."""

    WORKER = "worker"
    GATEWAY = "gateway"


@attrs.frozen(kw_only=True)
class ChildSpec:
    """One child process: how to start it, stop it and probe it.

    ``env`` is the child's whole environment (the planner starts from the supervisor's own and
    adds the child's variables). ``http_port`` is the child's HTTP port (``/healthz`` for
    liveness, ``/readyz`` for the healthcheck) on ``http_host``; ``None`` when it serves none.
    """

    name: str
    kind: ChildKind
    argv: tuple[str, ...]
    env: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    grace_seconds: float
    http_host: str = LOOPBACK
    http_port: int | None = None

    def url(self, path: str) -> str | None:
        """``http://host:port/path`` of the child's HTTP port, or ``None`` without one."""
        if self.http_port is None:
            return None
        host = f"[{self.http_host}]" if ":" in self.http_host else self.http_host
        return f"http://{host}:{self.http_port}{path}"


def probe_host(host: str) -> str:
    """The address to probe a server listening on ``host`` at (wildcards → loopback)."""
    host = host.strip()
    if host in _WILDCARDS:
        return LOOPBACK
    return host.removeprefix("[").removesuffix("]")
