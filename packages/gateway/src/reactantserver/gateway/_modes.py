"""The policy of ``scheduling.mode`` and its start-up preconditions (08 §Policy ...).

``round_robin`` has no preconditions. ``lpt_packing`` and ``model_aware`` wait (bounded by
``startup_wait_seconds``) for worker status before the gateway serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from reactantserver.gateway._metrics import GatewayMetrics
from reactantserver.gateway._policy import Policy, RoundRobin
from reactantserver.gateway._workers import WorkerLink
from reactantserver.gateway.config import GatewayConfig, SchedulingMode

__all__ = ["make_policy", "wait_for_preconditions"]


def make_policy(
    config: GatewayConfig, links: Sequence[WorkerLink], metrics: GatewayMetrics
) -> Policy:
    """The routing policy ``config.scheduling.mode`` names."""
    if config.scheduling.mode is SchedulingMode.ROUND_ROBIN:
        return RoundRobin()
    raise NotImplementedError(config.scheduling.mode.value)


async def wait_for_preconditions(
    config: GatewayConfig, links: Sequence[WorkerLink], policy: Policy, wedged: asyncio.Event
) -> None:
    """Block until the mode's preconditions hold (none for ``round_robin``)."""
    del config, links, policy, wedged
