"""The model function every peer serves: the jitted MLP, counting its executions and rows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench._peers.counters import Counter, counter_path
from bench._peers.models import MODELS, Array, compiled
from bench._peers.spec import PeerSpec

__all__ = ["model_function"]


def model_function(spec: PeerSpec, model: str) -> Callable[[Array], Array]:
    """``x -> y`` for ``model``, every batch size up to ``spec.max_batch`` compiled already."""
    run = compiled(MODELS[model], warm=range(1, spec.max_batch + 1))
    counter = Counter.open(counter_path(Path(spec.workdir), spec.server, model))

    def infer(x: Array) -> Array:
        counter.add(len(x))
        return run(x)

    return infer
