"""What the repository watcher does after a poll: a pure plan of actions.

The watcher thread observes every bundle once per poll (name -> :class:`Seen`) and hands that,
with what the worker has now (name -> :class:`Known`), to :meth:`Reconciler.plan`. A change is
acted on only once the same desired state (same digest, or absence) has been seen on two
consecutive polls; a renamed directory with unchanged content becomes a :class:`Rename`, and
promotion chains are ordered so each target name is vacated before it is reused::

    reconciler = Reconciler(seed=startup_observation)
    for action in reconciler.plan(known, observation):
        apply(action)   # Unload / Rename / Reload / Load, in list order
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from pathlib import Path
from typing import TypeAlias

import attrs

from reactantserver.worker.repository.digest import DirIdentity

__all__ = ["Action", "Known", "Load", "Reconciler", "Reload", "Rename", "Seen", "Unload"]


@attrs.frozen
class Seen:
    """One bundle as one poll observed it."""

    path: Path
    identity: DirIdentity
    digest: str


@attrs.frozen
class Known:
    """What the worker has for a model name right now.

    ``digest`` is that of the generation serving now, or of the failed attempt when ``failed``
    (the old generation may still serve); ``serving`` is false when a failed first load left
    the name listed ``UNAVAILABLE`` with no generation installed.
    """

    path: Path
    identity: DirIdentity
    digest: str
    failed: bool = False
    serving: bool = True


@attrs.frozen
class Load:
    """Compile and install a new model ``name`` from ``seen``."""

    name: str
    seen: Seen


@attrs.frozen
class Reload:
    """Compile a new generation of known model ``name`` from ``seen`` and swap it in."""

    name: str
    seen: Seen


@attrs.frozen
class Unload:
    """Retire model ``name`` (queued requests drain, new ones get ``NOT_FOUND``)."""

    name: str


@attrs.frozen
class Rename:
    """Re-key model ``old`` as ``new`` in place (no recompile); ``seen`` is its new bundle."""

    old: str
    new: str
    seen: Seen


Action: TypeAlias = Load | Reload | Unload | Rename


class Reconciler:
    """The watcher's debounce memory: the previous poll's observation of every bundle.

    ``seed`` is the start-up scan's observation, so a first poll that sees the same content
    plans nothing. Not thread-safe: the watcher thread owns it.
    """

    def __init__(self, seed: Mapping[str, Seen]) -> None:
        self._previous: dict[str, Seen] = dict(seed)

    def plan(self, known: Mapping[str, Known], seen: Mapping[str, Seen]) -> list[Action]:
        """The actions for one poll; ``seen`` (every bundle observed now) becomes "previous".

        Output order: unloads of vacated rename targets and of rename-cycle members, renames
        in dependency order, reloads, loads, then the remaining unloads; by name within a group.
        """
        previous, self._previous = self._previous, dict(seen)
        present = {n for n, s in seen.items() if n in previous and previous[n].digest == s.digest}
        absent = {n for n in known if n not in seen and n not in previous}

        renames, waiting = _rename_pairs(known, seen, present, absent)
        ordered, cycle = _order_renames(renames, seen)
        # Cycle members, and targets whose occupant's directory vanished, are unloaded first.
        first_unloads = cycle | {
            new for new in renames.values() if new in known and new not in renames
        }
        after = {n: k for n, k in known.items() if n not in first_unloads}
        for rename in ordered:
            del after[rename.old]
            after[rename.new] = Known(rename.seen.path, rename.seen.identity, rename.seen.digest)

        reloads: list[Action] = []
        loads: list[Action] = []
        for name in sorted(present - waiting):
            current = after.get(name)
            if current is None:
                loads.append(Load(name, seen[name]))
            elif seen[name].digest != current.digest:
                reloads.append(Reload(name, seen[name]))
        last_unloads: list[Action] = [Unload(n) for n in sorted(absent) if n in after]
        return [
            *(Unload(n) for n in sorted(first_unloads)),
            *ordered,
            *reloads,
            *loads,
            *last_unloads,
        ]

    def forced(
        self, name: str, known: Mapping[str, Known], seen: Mapping[str, Seen]
    ) -> list[Action]:
        """Act on ``name`` now, without debounce (``RepositoryModelLoad`` in dynamic mode).

        Load if new; Reload if its digest differs from the known one or the known attempt
        failed (a retry); nothing if unchanged. Raises :class:`LookupError` when no bundle named
        ``name`` is in ``seen``. Other names' debounce is left as it was.
        """
        observed = seen.get(name)
        if observed is None:
            raise LookupError(f"no bundle named {name!r} in the model repository")
        # This observation counts towards the name's own debounce, and only its own.
        self._previous[name] = observed
        current = known.get(name)
        if current is None:
            return [Load(name, observed)]
        if current.failed or observed.digest != current.digest:
            return [Reload(name, observed)]
        return []


def _moved_away(name: str, model: Known, seen: Mapping[str, Seen]) -> bool:
    """Whether ``model``'s directory is no longer at ``name`` (gone, or replaced by another)."""
    now = seen.get(name)
    return now is None or now.identity != model.identity


def _rename_pairs(
    known: Mapping[str, Known],
    seen: Mapping[str, Seen],
    present: set[str],
    absent: set[str],
) -> tuple[dict[str, str], set[str]]:
    """Confirmed in-place renames (old -> new), and new names waiting on their source.

    A confirmed new name whose directory identity and digest match a known model that left
    its name (confirmed absent, or replaced by another directory) is a rename of it. When that
    model's name is gone for one poll only, its absence is not confirmed yet: the new name
    waits a poll rather than loading a copy. Only a healthy model moves: a failed or
    never-installed one has no generation worth keeping, so its new name is loaded instead.
    """
    sources: dict[tuple[DirIdentity, str], list[str]] = {}
    for name in sorted(known):
        model = known[name]
        if model.serving and not model.failed and _moved_away(name, model, seen):
            sources.setdefault((model.identity, model.digest), []).append(name)
    pairs: dict[str, str] = {}
    waiting: set[str] = set()
    for new in sorted(present):
        target = seen[new]
        occupant = known.get(new)
        if occupant is not None and occupant.identity == target.identity:
            continue  # the same directory is still there: not a new name
        candidates = [
            c for c in sources.get((target.identity, target.digest), []) if c not in pairs
        ]
        old = next((c for c in candidates if c in absent or c in seen), None)
        if old is not None:
            pairs[old] = new
        elif candidates:
            waiting.add(new)
    return pairs, waiting


def _order_renames(
    pairs: dict[str, str], seen: Mapping[str, Seen]
) -> tuple[list[Rename], set[str]]:
    """Renames ordered so each target is vacated before reuse, and the names left in cycles.

    Each name is the source of at most one rename and the target of at most one, so the pairs
    form simple chains and cycles. A rename is ready once its target is no longer waiting to be
    renamed away; the members of a cycle never become ready.
    """
    by_target = {new: old for old, new in pairs.items()}
    ready = [(old, new) for old, new in pairs.items() if new not in pairs]
    heapq.heapify(ready)
    ordered: list[Rename] = []
    while ready:
        old, new = heapq.heappop(ready)
        ordered.append(Rename(old, new, seen[new]))
        follower = by_target.get(old)
        if follower is not None:
            heapq.heappush(ready, (follower, old))
    done = {r.old for r in ordered}
    return ordered, {old for old in pairs if old not in done}
