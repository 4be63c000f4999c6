"""One generation of a meta model as the worker serves it (07-meta-models.md).

A meta has no executable and no weights: its generation is the ``run`` function its
``model.py`` registered, the sub-models it may call, and its client tensors::

    meta = MetaModel.from_manifest(manifest, hooks.run, generation=3)
    meta.gated          # False for a compute-only meta (empty meta.calls)
"""

from __future__ import annotations

import attrs

from reactantserver.core.manifest import Manifest
from reactantserver.core.types import TensorSpec
from reactantserver.worker.hooks import MetaRun

__all__ = ["MetaModel"]


@attrs.define(eq=False)
class MetaModel:
    """A meta generation: ``run``, the declared callees and the client tensors."""

    name: str
    generation: int
    calls: tuple[str, ...]
    run: MetaRun
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    warned_oversize: bool = False
    """Whether the "scratch larger than the pool" warning was logged (once per meta)."""

    @classmethod
    def from_manifest(cls, manifest: Manifest, run: MetaRun, *, generation: int) -> MetaModel:
        """The meta of ``manifest`` (``kind: meta``) running ``run``."""
        if not manifest.is_meta:
            raise ValueError(f"model '{manifest.name}' is not a meta model")
        return cls(
            name=manifest.name,
            generation=generation,
            calls=manifest.meta_calls,
            run=run,
            inputs=manifest.client_inputs,
            outputs=manifest.client_outputs,
        )

    @property
    def gated(self) -> bool:
        """Whether a request must hold a permit of the meta gate (it has sub-models)."""
        return bool(self.calls)

    def renamed(self, name: str) -> MetaModel:
        """The same generation served under another name (rename in place)."""
        return attrs.evolve(self, name=name)
