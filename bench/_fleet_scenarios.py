"""The three situations of model-aware scheduling as small deterministic traces.

Each scenario first makes chosen models resident on chosen workers (requests sent straight to
the worker), waits for the gateway's next status polls, then replays a fixed trace through the
gateway. Which policy should win depends on how a cold load compares with the work already
queued on the warm worker:

- **colocation without queuing**: one model warm on worker 0, then a burst of requests for it
  all at once. Queuing all of them behind the warm copy costs more than one load on the other
  worker, so the right move is to go cold on worker 1 for part of the burst.
- **colocation with queuing**: models warm on worker 0, then pairs of simultaneous requests for
  each. Waiting one execution behind the first of a pair is cheaper than a load, so both
  belong on worker 0.
- **registry win**: four models, each warm on exactly one of the two workers, then single
  requests cycling over them. Knowing where each model lives (a registry) means no cold load
  at all; routing without that knowledge sends half of them to a worker without the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from bench._traces import Arrival

__all__ = ["SCENARIOS", "Scenario", "scenarios"]


@attrs.frozen
class Scenario:
    """A named situation: what to make resident where, then the trace."""

    name: str
    summary: str
    #: (worker index, model) pairs made resident before the trace, in order.
    warm: tuple[tuple[int, str], ...]
    trace: tuple[Arrival, ...]


def _without_queuing(models: Sequence[str], burst: int) -> Scenario:
    m = models[0]
    return Scenario(
        "colocation without queuing",
        f"{m} warm on worker 0; {burst} requests for it at once",
        ((0, m),),
        tuple(Arrival(0.0, m) for _ in range(burst)),
    )


def _with_queuing(models: Sequence[str], gap_s: float) -> Scenario:
    chosen = models[1:4]
    return Scenario(
        "colocation with queuing",
        f"{', '.join(chosen)} warm on worker 0; two simultaneous requests for each, "
        f"{gap_s:g} s apart",
        tuple((0, m) for m in chosen),
        tuple(Arrival(i * gap_s, m) for i, m in enumerate(chosen) for _ in range(2)),
    )


def _registry(models: Sequence[str], rounds: int, gap_s: float) -> Scenario:
    chosen = models[4:8]
    seq = [chosen[i % len(chosen)] for i in range(rounds * len(chosen))]
    return Scenario(
        "registry win",
        f"{chosen[0]}, {chosen[2]} warm on worker 0 and {chosen[1]}, {chosen[3]} on worker 1; "
        f"{len(seq)} single requests cycling over them, {gap_s:g} s apart",
        tuple((i % 2, m) for i, m in enumerate(chosen)),
        tuple(Arrival(i * gap_s, m) for i, m in enumerate(seq)),
    )


SCENARIOS: tuple[Callable[[Sequence[str]], Scenario], ...] = (
    lambda models: _without_queuing(models, burst=16),
    lambda models: _with_queuing(models, gap_s=0.3),
    lambda models: _registry(models, rounds=4, gap_s=0.1),
)


def scenarios(models: Sequence[str]) -> list[Scenario]:
    """The three scenarios over the first eight of ``models`` (distinct models per scenario)."""
    if len(models) < 8:
        raise ValueError(f"the scenarios need 8 models, got {len(models)}")
    return [make(models) for make in SCENARIOS]
