"""``reactantserver-node healthcheck``: is this node ready to serve?."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Final

from reactantserver.core.config import Role
from reactantserver.node._plan import NodePlan
from reactantserver.node._spec import ChildKind, probe_host

__all__ = ["HEALTHCHECK_TIMEOUT_SECONDS", "healthcheck", "readiness_urls"]

#: Every probe of one healthcheck must answer within this budget.
HEALTHCHECK_TIMEOUT_SECONDS: Final = 5.0


def readiness_urls(plan: NodePlan, role: Role) -> list[str]:
    """The ``/readyz`` URLs that must all answer 200 for the node to be healthy.

    Role ``all``: the public HTTP address (the sole worker or the embedded gateway). Role
    ``workers``: every worker's HTTP port. Role ``gateway``: the gateway's.
    """
    if role is Role.WORKERS:
        children = [child for child in plan.children if child.kind is ChildKind.WORKER]
        urls = [child.url("/readyz") for child in children]
        if None in urls:
            missing = [child.name for child in children if child.http_port is None]
            raise ValueError(f"workers without an HTTP port cannot be checked: {missing}")
        return [url for url in urls if url is not None]
    if plan.public_metrics is None:
        raise ValueError("this node serves no public HTTP address")
    host, _, port = plan.public_metrics.rpartition(":")
    target = probe_host(host)
    if ":" in target:
        target = f"[{target}]"
    return [f"http://{target}:{port}/readyz"]


def healthcheck(urls: Sequence[str], timeout: float = HEALTHCHECK_TIMEOUT_SECONDS) -> list[str]:
    """Probe every URL within ``timeout`` seconds in all; the failures (empty = healthy)."""
    failures = []
    deadline = time.monotonic() + timeout
    for url in urls:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            failures.append(f"{url}: no time left")
            continue
        try:
            with urllib.request.urlopen(url, timeout=remaining) as response:
                if response.status != 200:
                    failures.append(f"{url}: HTTP {response.status}")
        except urllib.error.HTTPError as error:
            with error:
                failures.append(f"{url}: HTTP {error.code}")
        except (OSError, ValueError) as error:
            failures.append(f"{url}: {error}")
    return failures
