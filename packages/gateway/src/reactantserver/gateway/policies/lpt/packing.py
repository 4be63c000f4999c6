"""Greedy two-dimensional LPT packing of models onto workers.

Pure: no I/O, no clocks. The repack loop feeds it the models' compute shares and footprints,
the workers' weight-cache budgets and the previous placement, and installs what comes back::

    assignment = compute_assignment(
        [ModelDemand("a", u=0.5, mem=0), ModelDemand("b", u=0.4, mem=0)],
        [WorkerBudget("w0:8001", cap=0), WorkerBudget("w1:8001", cap=0)],
    )
    change = placement_change(previous, assignment.worker_sets)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Literal, TypeAlias

import attrs

__all__ = [
    "Assignment",
    "ModelDemand",
    "ModelPlacement",
    "PlacementChange",
    "PlacementInputError",
    "Replicas",
    "WorkerBudget",
    "compute_assignment",
    "placement_change",
]

Replicas: TypeAlias = int | Literal["all"]
"""A replica count: an int (clamped to 1..#workers) or ``"all"`` (every worker)."""


class PlacementInputError(ValueError):
    """The inputs of :func:`compute_assignment` cannot be packed (no workers, duplicates)."""


@attrs.frozen
class ModelDemand:
    """One model to place: ``u`` its compute share of one worker, ``mem`` its footprint (bytes)."""

    name: str
    u: float = attrs.field(validator=attrs.validators.ge(0.0))
    mem: int = attrs.field(validator=attrs.validators.ge(0))


@attrs.frozen
class WorkerBudget:
    """One worker: ``cap`` its ``weight_cache_max_bytes`` (``cap <= 0`` = unconstrained)."""

    url: str
    cap: int


@attrs.frozen
class ModelPlacement:
    """Where one model runs: worker URLs in ascending order, with aligned routing weights."""

    workers: tuple[str, ...]
    weights: tuple[float, ...]


@attrs.frozen
class Assignment:
    """The result of one packing.

    ``placement`` maps each model (by name) to its :class:`ModelPlacement`; ``compute_load`` and
    ``memory_load`` map every worker URL to the compute share (capacity 1.0) and bytes charged to
    it; ``held`` counts models kept on their previous worker by hysteresis although another was
    better; ``max_improvement`` is the largest ``score(previous)/score(best) - 1`` seen among
    single-replica models whose previous worker was still a candidate (0.0 when none).
    """

    placement: Mapping[str, ModelPlacement]
    compute_load: Mapping[str, float]
    memory_load: Mapping[str, int]
    held: int
    max_improvement: float

    @property
    def worker_sets(self) -> dict[str, frozenset[str]]:
        """Each model's worker URLs, as ``previous`` and :func:`placement_change` take them."""
        return {name: frozenset(p.workers) for name, p in self.placement.items()}


@attrs.frozen
class PlacementChange:
    """What a repack changed; both tuples sorted."""

    moved: tuple[str, ...]
    changed_workers: tuple[str, ...]


class _Loads:
    """Per-worker compute and memory loads while packing, indexed like the sorted workers."""

    def __init__(self, workers: Sequence[WorkerBudget]) -> None:
        self.caps = [w.cap for w in workers]
        self.compute = [0.0] * len(workers)
        self.memory = [0] * len(workers)

    def score(self, i: int, uc: float, mem: int) -> float:
        """``max(c_w + uc, (b_w + mem)/cap_w)``; the memory term is 0 when unconstrained."""
        cap = self.caps[i]
        memory_term = (self.memory[i] + mem) / cap if cap > 0 else 0.0
        return max(self.compute[i] + uc, memory_term)

    def fits(self, i: int, mem: int) -> bool:
        """Whether ``mem`` more bytes stay within the budget (always when unconstrained)."""
        cap = self.caps[i]
        return cap <= 0 or self.memory[i] + mem <= cap

    def charge(self, i: int, uc: float, mem: int) -> None:
        """Add one replica's compute share and the model's full footprint to worker ``i``."""
        self.compute[i] += uc
        self.memory[i] += mem


def _replica_count(replicas: Replicas, n_workers: int) -> int:
    if replicas == "all":
        return n_workers
    return min(max(replicas, 1), n_workers)


def compute_assignment(
    models: Sequence[ModelDemand],
    workers: Sequence[WorkerBudget],
    *,
    default_replicas: Replicas = 1,
    replicas: Mapping[str, Replicas] | None = None,
    forbid_memory_oversubscription: bool = True,
    hysteresis: float = 0.0,
    previous: Mapping[str, Collection[str]] | None = None,
) -> Assignment:
    """Pack ``models`` onto ``workers``.

    Workers are considered in URL order (ties go to the smaller URL); models are visited by
    descending ``u``, then descending ``mem``, then name. ``replicas`` overrides
    ``default_replicas`` per model (entries for absent models are ignored); ``previous`` maps a
    model to the worker URLs it ran on before (unknown URLs are ignored). A model too big for
    every budget is still placed.

    Raises:
        PlacementInputError: no workers, duplicate worker URLs or duplicate model names.
    """
    if not workers:
        raise PlacementInputError("compute_assignment needs at least one worker")
    ordered = sorted(workers, key=lambda w: w.url)
    urls = [w.url for w in ordered]
    if len(set(urls)) != len(urls):
        raise PlacementInputError(f"duplicate worker URLs in {urls}")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise PlacementInputError(f"duplicate model names in {sorted(names)}")
    overrides = replicas or {}
    before = previous or {}
    loads = _Loads(ordered)
    placement: dict[str, ModelPlacement] = {}
    held = 0
    max_improvement = 0.0

    for model in sorted(models, key=lambda m: (-m.u, -m.mem, m.name)):
        k = _replica_count(overrides.get(model.name, default_replicas), len(ordered))
        prev = set(before.get(model.name, ()))
        if k == 1:
            chosen, was_held, improvement = _place_single(
                loads,
                urls,
                model,
                prev=prev,
                forbid=forbid_memory_oversubscription,
                hysteresis=hysteresis,
            )
            held += was_held
            max_improvement = max(max_improvement, improvement)
            loads.charge(chosen, model.u, model.mem)
            placement[model.name] = ModelPlacement((urls[chosen],), (1.0,))
        else:
            chosen_many = _place_many(
                loads, urls, model, k, prev=prev, forbid=forbid_memory_oversubscription
            )
            for i in chosen_many:
                loads.charge(i, model.u / k, model.mem)
            placement[model.name] = ModelPlacement(
                tuple(sorted(urls[i] for i in chosen_many)), (1.0 / k,) * k
            )

    return Assignment(
        placement=dict(sorted(placement.items())),
        compute_load=dict(zip(urls, loads.compute, strict=True)),
        memory_load=dict(zip(urls, loads.memory, strict=True)),
        held=held,
        max_improvement=max_improvement,
    )


def _place_single(
    loads: _Loads,
    urls: Sequence[str],
    model: ModelDemand,
    *,
    prev: Collection[str],
    forbid: bool,
    hysteresis: float,
) -> tuple[int, bool, float]:
    """The worker for a one-replica model, whether hysteresis held it, and the improvement seen."""
    everyone = range(len(urls))
    candidates = list(everyone)
    if forbid:
        fitting = [i for i in everyone if loads.fits(i, model.mem)]
        if fitting:
            candidates = fitting
    scores = {i: loads.score(i, model.u, model.mem) for i in candidates}
    best = min(candidates, key=lambda i: scores[i])  # min keeps the first (smallest URL) on ties
    if len(prev) != 1:
        return best, False, 0.0
    (prev_url,) = prev
    previous = next((i for i in candidates if urls[i] == prev_url), None)
    if previous is None:
        return best, False, 0.0
    # A zero best score means a weightless model onto an empty worker: nothing to gain.
    improvement = scores[previous] / scores[best] - 1.0 if scores[best] > 0 else 0.0
    if scores[previous] <= scores[best] * (1.0 + hysteresis):
        return previous, previous != best, improvement
    return best, False, improvement


def _place_many(
    loads: _Loads,
    urls: Sequence[str],
    model: ModelDemand,
    k: int,
    *,
    prev: Collection[str],
    forbid: bool,
) -> list[int]:
    """The ``k`` workers for a multi-replica model: refused last, then score, stickiness, URL."""
    share = model.u / k

    def rank(i: int) -> tuple[int, float, int, str]:
        refused = forbid and not loads.fits(i, model.mem)
        in_previous = urls[i] in prev
        return (
            1 if refused else 0,
            loads.score(i, share, model.mem),
            0 if in_previous else 1,
            urls[i],
        )

    return sorted(range(len(urls)), key=rank)[:k]


def placement_change(
    before: Mapping[str, Collection[str]], after: Mapping[str, Collection[str]]
) -> PlacementChange:
    """Models whose worker set changed and the workers those changes touch.

    A model only in ``after`` is new, not a move, and touches no worker; a model only in
    ``before`` was dropped and touches every worker it was on; a model in both whose set differs
    moved and touches the symmetric difference of its two sets.
    """
    moved: list[str] = []
    touched: set[str] = set()
    for name, old in before.items():
        old_set = frozenset(old)
        if name not in after:
            touched |= old_set
            continue
        new_set = frozenset(after[name])
        if new_set != old_set:
            moved.append(name)
            touched |= old_set ^ new_set
    return PlacementChange(moved=tuple(sorted(moved)), changed_workers=tuple(sorted(touched)))
