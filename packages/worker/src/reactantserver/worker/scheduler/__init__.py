"""The worker's scheduler: per-model queues, one dispatch thread, fair / fifo / edf.

:class:`Scheduler` admits requests into per-model queues and runs one execution at a time on
its dispatch thread, coalescing queued requests of one model into the compiled batch sizes.
The pure parts (fair arithmetic, planning, assembly) are separate modules, tested against the
spec's formulas and tables.
"""

from __future__ import annotations

from reactantserver.worker.scheduler.adaptive import ADAPTIVE_MAX_HOLD_NS
from reactantserver.worker.scheduler.assembly import assemble, split
from reactantserver.worker.scheduler.costs import CostTable
from reactantserver.worker.scheduler.disciplines import (
    PlannedBatch,
    select_edf,
    select_fair,
    select_fifo,
)
from reactantserver.worker.scheduler.fair import (
    DEFAULT_COST_S,
    RecentLoad,
    decay,
    fair_priority,
    shares,
)
from reactantserver.worker.scheduler.limits import InflightLimiter
from reactantserver.worker.scheduler.model import ProgramKey, ScheduledModel
from reactantserver.worker.scheduler.planning import Plan, fit_batch, plan_batch, take_count
from reactantserver.worker.scheduler.queue import (
    Completion,
    FutureCompletion,
    LoopCompletion,
    ModelQueue,
    Pending,
    State,
    TraceMarks,
    resolve_all,
)
from reactantserver.worker.scheduler.scheduler import SHUTTING_DOWN, Scheduler
from reactantserver.worker.scheduler.stage_clock import SAMPLE_EVERY, StageClock
from reactantserver.worker.scheduler.stats import (
    QUEUE_WAIT_SAMPLES,
    BatchStats,
    ModelStats,
    StatsSnapshot,
    nearest_rank,
)

__all__ = [
    "ADAPTIVE_MAX_HOLD_NS",
    "DEFAULT_COST_S",
    "QUEUE_WAIT_SAMPLES",
    "SAMPLE_EVERY",
    "SHUTTING_DOWN",
    "BatchStats",
    "Completion",
    "CostTable",
    "FutureCompletion",
    "InflightLimiter",
    "LoopCompletion",
    "ModelQueue",
    "ModelStats",
    "Pending",
    "Plan",
    "PlannedBatch",
    "ProgramKey",
    "RecentLoad",
    "ScheduledModel",
    "Scheduler",
    "StageClock",
    "State",
    "StatsSnapshot",
    "TraceMarks",
    "assemble",
    "decay",
    "fair_priority",
    "fit_batch",
    "nearest_rank",
    "plan_batch",
    "resolve_all",
    "select_edf",
    "select_fair",
    "select_fifo",
    "shares",
    "split",
    "take_count",
]
