"""The policy of ``scheduling.mode`` and its start-up preconditions.

``round_robin`` has none. ``lpt_packing`` waits (polling every ``health.interval_seconds``,
bounded by ``startup_wait_seconds``) until every configured worker answers
``ModelControlStatus``, checks that they all run ``fifo`` or ``edf`` and report the same
models, then places them (the ``startup`` repack). ``model_aware`` waits, within the same
bound, for one successful status poll; without one it starts routing round robin.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence

from reactantserver.gateway.config import GatewayConfig, SchedulingConfig, SchedulingMode
from reactantserver.gateway.policies.knobs import SchedulingKnobs
from reactantserver.gateway.policies.lpt.overrides import ModelOverride
from reactantserver.gateway.policies.lpt.policy import LptPolicy
from reactantserver.gateway.policies.model_aware.policy import ModelAwarePolicy
from reactantserver.gateway.policies.policy import Policy, RoundRobin
from reactantserver.gateway.views.metrics import GatewayMetrics
from reactantserver.gateway.workers.discovery import poll_status
from reactantserver.gateway.workers.link import WorkerLink

__all__ = ["StartupError", "knobs_of", "make_policy", "wait_for_preconditions"]

_log = logging.getLogger("reactantserver.gateway")

#: Consecutive all-timed-out precondition rounds after which start-up gives up (exit 1).
_TIMEOUT_ROUNDS = 3
_DISCIPLINES = frozenset({"fifo", "edf"})


class StartupError(RuntimeError):
    """A start-up precondition failed for good (the process exits 1)."""


def knobs_of(scheduling: SchedulingConfig) -> SchedulingKnobs:
    """The live knobs as configured (``generation`` 0)."""
    aware = scheduling.model_aware
    return SchedulingKnobs(
        rebalance_compute_seconds=scheduling.rebalance_compute_seconds,
        first_rebalance_compute_seconds=scheduling.first_rebalance_compute_seconds,
        hysteresis=scheduling.hysteresis,
        ema_halflife_compute_seconds=scheduling.ema_halflife_compute_seconds,
        default_replicas=scheduling.default_replicas,
        routing_policy=scheduling.routing_policy.value,
        routing_fill_factor=scheduling.routing_fill_factor,
        routing_fill_mode=scheduling.routing_fill_mode.value,
        compaction_mode=scheduling.compaction_mode.value,
        compaction_interval=scheduling.compaction_interval,
        forbid_memory_oversubscription=scheduling.forbid_memory_oversubscription,
        work_basis=scheduling.work_basis.value,
        cold_load_penalty=aware.cold_load_penalty,
        default_load_bandwidth_bytes_per_second=aware.default_load_bandwidth_bytes_per_second,
        load_overhead_seconds=aware.load_overhead_seconds,
    )


def _overrides(scheduling: SchedulingConfig) -> dict[str, ModelOverride]:
    overrides: dict[str, ModelOverride] = {}
    for name, entry in scheduling.models.items():
        mode = entry.fill_mode.value
        override = ModelOverride(
            replicas=entry.replicas,
            fill_mode=None if mode == "inherit" else mode,
            fill_factor=entry.fill_factor,
        )
        if not override.is_default:
            overrides[name] = override
    return overrides


def make_policy(
    config: GatewayConfig, links: Sequence[WorkerLink], metrics: GatewayMetrics
) -> Policy:
    """The routing policy ``config.scheduling.mode`` names."""
    scheduling = config.scheduling
    if scheduling.mode is SchedulingMode.LPT_PACKING:
        return LptPolicy(
            knobs_of(scheduling),
            _overrides(scheduling),
            links,
            metrics,
            request_timeout_seconds=config.worker_client.request_timeout_seconds,
        )
    if scheduling.mode is SchedulingMode.MODEL_AWARE:
        return ModelAwarePolicy(
            knobs_of(scheduling), scheduling.model_aware.network_seconds, links, metrics
        )
    return RoundRobin()


async def wait_for_preconditions(
    config: GatewayConfig, links: Sequence[WorkerLink], policy: Policy
) -> None:
    """Block until the mode's preconditions hold; :class:`StartupError` when they cannot."""
    if isinstance(policy, LptPolicy):
        await _lpt_preconditions(config, links, policy)
    elif isinstance(policy, ModelAwarePolicy):
        await _aware_preconditions(config, links, policy)


async def _lpt_preconditions(
    config: GatewayConfig, links: Sequence[WorkerLink], policy: LptPolicy
) -> None:
    wait = config.startup_wait_seconds
    stop_at = math.inf if math.isinf(wait) else time.monotonic() + wait
    timeouts = 0
    while True:
        polls, timed_out = await poll_status(links)
        timeouts = timeouts + 1 if len(timed_out) == len(links) else 0
        if timeouts >= _TIMEOUT_ROUNDS:
            raise StartupError(
                f"ModelControlStatus timed out on every worker {_TIMEOUT_ROUNDS} rounds in a row"
            )
        if len(polls) == len(links):
            bad = {
                url: p.discipline for url, p in polls.items() if p.discipline not in _DISCIPLINES
            }
            if bad:
                raise StartupError(
                    "lpt_packing needs every worker on discipline fifo or edf; "
                    + ", ".join(f"{url} runs {d or '?'}" for url, d in sorted(bad.items()))
                )
            sets = {url: frozenset(m.name for m in p.models) for url, p in polls.items()}
            if len(set(sets.values())) > 1:
                raise StartupError(
                    "lpt_packing needs every worker to report the same models; "
                    + "; ".join(f"{url}: {sorted(s)}" for url, s in sorted(sets.items()))
                )
            policy.startup_repack(polls)
            return
        missing = sorted({link.url for link in links} - set(polls))
        if time.monotonic() >= stop_at:
            raise StartupError(
                f"workers did not answer ModelControlStatus within startup_wait_seconds={wait}: "
                + ", ".join(missing)
            )
        _log.info("lpt_packing: waiting for ModelControlStatus from %s", ", ".join(missing))
        await asyncio.sleep(
            min(config.health.interval_seconds, max(0.0, stop_at - time.monotonic()))
        )


async def _aware_preconditions(
    config: GatewayConfig, links: Sequence[WorkerLink], policy: ModelAwarePolicy
) -> None:
    wait = config.startup_wait_seconds
    stop_at = math.inf if math.isinf(wait) else time.monotonic() + wait
    while True:
        polls, _ = await poll_status(links)
        if polls:
            policy.observe(polls)
            return
        if time.monotonic() >= stop_at:
            _log.warning("model_aware: no status poll succeeded yet; routing round robin meanwhile")
            return
        await asyncio.sleep(
            min(config.health.interval_seconds, max(0.0, stop_at - time.monotonic()))
        )
