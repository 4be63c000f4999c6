"""What the ModelInfer path asks of a routing policy, and the default ``round_robin``.

A policy turns (model, its discovered replicas, the request's item count) into a
:class:`Choice`: the workers to try, in order, and a release callback the proxy calls exactly
once when the request is over. Policies that need worker state (``lpt_packing``,
``model_aware``) get every ``ModelControlStatus`` poll through :meth:`Policy.observe`::

    choice = policy.choose("resnet", ("w0:8080", "w1:8080"), units=4)
    try:
        ...forward to choice.order...
    finally:
        choice.release()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import attrs

from reactantserver.core.protocol import control_pb2

__all__ = ["Choice", "Policy", "RoundRobin", "Routes", "rotate"]

#: Model name -> the sorted URLs of the workers that list it as ready.
Routes = Mapping[str, tuple[str, ...]]


def _nothing() -> None:
    return None


@attrs.frozen
class Choice:
    """The workers to try for one request, best first, and how to give back its reservation."""

    order: tuple[str, ...]
    release: Callable[[], None] = _nothing


class Policy(Protocol):
    """A routing policy as the proxy and the prober see it."""

    @property
    def mode(self) -> str:
        """``round_robin`` | ``lpt_packing`` | ``model_aware``."""

    @property
    def needs_status(self) -> bool:
        """Whether the prober must poll ``ModelControlStatus`` for this policy."""

    def batch_locator(self, model: str) -> tuple[str, int] | None:
        """``(input name, 1-based axis)`` to count items, or ``None`` to count 1 per request."""

    def observe(self, polls: Mapping[str, control_pb2.ModelControlStatusResponse]) -> None:
        """One prober round's status polls (ready workers that answered)."""

    def choose(self, model: str, replicas: tuple[str, ...], units: int) -> Choice:
        """Candidates for a request of ``units`` items of ``model`` over ``replicas``."""


def rotate(items: Sequence[str], first: int) -> tuple[str, ...]:
    """``items`` starting at index ``first`` and wrapping around."""
    first %= len(items)
    return (*items[first:], *items[:first])


class RoundRobin:
    """Per-model cursor over the sorted replicas; the rest follow as failover order."""

    mode = "round_robin"
    needs_status = False

    def __init__(self) -> None:
        self._cursors: dict[str, int] = {}

    def batch_locator(self, model: str) -> tuple[str, int] | None:
        """Round robin never reads the body beyond the header."""
        return None

    def observe(self, polls: Mapping[str, control_pb2.ModelControlStatusResponse]) -> None:
        """Round robin keeps no worker state."""

    def choose(self, model: str, replicas: tuple[str, ...], units: int) -> Choice:
        """The next replica in turn, then the others in list order."""
        if not replicas:
            return Choice(())
        cursor = self._cursors.get(model, 0)
        self._cursors[model] = (cursor + 1) % len(replicas)
        return Choice(rotate(replicas, cursor))
