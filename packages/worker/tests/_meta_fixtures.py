"""Shared fixtures and helpers for the meta-model server tests.

Real bundles throughout: the pipeline example's jax sub-models, metas written with
``reactantserver.export.write_bundle(kind="meta")``, loaded by ``boot.load_model`` /
``ModelLifecycle`` on a started runtime. The ``test_meta_*`` modules import the fixtures by
name and list them in their ``__all__`` (so the imports count as used); module-scoped ones are
built once per importing module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from packages.worker.tests.meta._metaworld import (
    EMBED,
    META,
    Exported,
    export_bundles,
    meta_config,
    start_meta_world,
    write_meta,
)
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.types import InferRequest, InferResponse
from reactantserver.worker.registry import ModelEntry, ModelRegistry
from reactantserver.worker.repository.boot import load_model

from ._world import World

EMBED_ONLY = "embed_only"
GHOSTLY = "ghostly"
NESTED = "nested"

CONSTANT_SOURCE = """\
import numpy as np


def run(inputs, call):
    (items,) = inputs
    (emb,) = call("pipeline_embed", [NamedTensor("x", items.data)])
    rows = emb.shape[0]
    return [
        NamedTensor("scores", np.full(rows, {value}, np.float32)),
        NamedTensor("indices", np.arange(rows, dtype=np.int64)),
    ]


register_meta_model("{name}", run=run)
"""
"""A meta calling ``pipeline_embed`` and answering ``value`` for every row."""


def constant_source(name: str, value: float) -> str:
    return CONSTANT_SOURCE.replace("{value}", repr(value)).replace("{name}", name)


def fixed_source(name: str) -> str:
    """A meta that never calls its callees (enough to load it)."""
    return (
        "import numpy as np\n\n\n"
        "def run(inputs, call):\n"
        '    return [NamedTensor("scores", np.zeros(1, np.float32)),\n'
        '            NamedTensor("indices", np.zeros(1, np.int64))]\n\n\n'
        f'register_meta_model("{name}", run=run)\n'
    )


@attrs.frozen
class Metas:
    """The exported bundles plus this module's extra metas (in a directory of their own)."""

    exported: Exported
    embed_only: Path
    ghostly: Path
    nested: Path


@pytest.fixture(scope="module")
def metas(tmp_path_factory: pytest.TempPathFactory) -> Metas:
    exported = export_bundles(tmp_path_factory.mktemp("models"))
    extra = tmp_path_factory.mktemp("metas")
    return Metas(
        exported,
        write_meta(extra, EMBED_ONLY, [EMBED], constant_source(EMBED_ONLY, 7.0)),
        write_meta(extra, GHOSTLY, ["ghost"], fixed_source(GHOSTLY)),
        write_meta(extra, NESTED, [META], fixed_source(NESTED)),
    )


@pytest.fixture
def make_world(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., World]]:
    worlds: list[World] = []

    def make(bundles: Sequence[Path], **settings: Any) -> World:
        config = meta_config(tmp_path_factory.getbasetemp() / "meta-cache", **settings)
        world = start_meta_world(config, bundles)
        worlds.append(world)
        return world

    try:
        yield make
    finally:
        for world in worlds:
            world.close()


@pytest.fixture(scope="module")
def loaded(metas: Metas, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One world with every bundle loaded (``nested`` compiled while no meta was loaded)."""
    config = meta_config(tmp_path_factory.getbasetemp() / "meta-cache")
    exported = metas.exported
    world = start_meta_world(config, [exported.embed, exported.score, exported.hooked])
    try:
        for path in (metas.nested, exported.pipeline, metas.embed_only, metas.ghostly):
            world.bundles.append(load_model(world.state, world.runtime, path))
        yield world
    finally:
        world.close()


def entry(world: World, name: str) -> ModelEntry:
    """The compiled entry of ``name`` in ``world`` (registered or not)."""
    for bundle in world.bundles:
        if bundle.entry.name == name:
            return bundle.entry
    raise AssertionError(f"{name} was not loaded")


def registry_of(world: World, *names: str, expose: bool = False) -> ModelRegistry:
    registry = ModelRegistry(expose_sub_models=expose)
    for name in names:
        registry.put(entry(world, name))
    return registry


def is_hidden(registry: ModelRegistry, name: str) -> bool:
    """Whether ``name``'s entry (which must exist) is hidden from clients."""
    found = registry.get(name)
    assert found is not None, name
    return found.hidden


def infer(world: World, name: str, x: np.ndarray[Any, Any]) -> InferResponse:
    request = InferRequest(model_name=name, inputs=[NamedTensor("items", x)])
    return asyncio.run(world.runtime.dataplane.infer(request))
