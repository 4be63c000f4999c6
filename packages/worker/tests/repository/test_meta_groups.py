"""Meta models in the server: registry groups and readiness.

Real bundles throughout (see ``_meta_fixtures``): registries and worker states are built from
the compiled entries of one world with every bundle loaded.
"""

from __future__ import annotations

import attrs
import grpc
import pytest

from packages.worker.tests._meta_fixtures import (
    EMBED_ONLY,
    GHOSTLY,
    NESTED,
    entry,
    is_hidden,
    loaded,
    metas,
    registry_of,
)
from packages.worker.tests._world import World
from packages.worker.tests.meta._metaworld import EMBED, HOOKED, META, SCORE
from reactantserver.core.errors import ModelNotFoundError, ModelUnavailableError, status_of
from reactantserver.worker.registry import ModelEntry
from reactantserver.worker.state import WorkerState

__all__ = ["loaded", "metas"]  # fixtures, imported by name for pytest


# -- registry groups -------------------------------------------------------------------------


def test_a_loaded_meta_owns_its_callees(loaded: World) -> None:
    registry = registry_of(loaded, EMBED, SCORE, HOOKED, META, EMBED_ONLY)
    assert registry.owners(EMBED) == (EMBED_ONLY, META)
    assert registry.owners(SCORE) == (META,)
    assert registry.owners(HOOKED) == ()
    assert registry.owners(META) == ()
    assert [e.name for e in registry.metas()] == [EMBED_ONLY, META]
    assert entry(loaded, META).is_meta
    assert entry(loaded, META).installed
    assert entry(loaded, META).scheduled is None
    assert not entry(loaded, EMBED).is_meta


def test_hidden_flags_follow_every_put_and_remove(loaded: World) -> None:
    registry = registry_of(loaded, EMBED, SCORE, HOOKED)
    assert [e.name for e in registry.visible()] == [HOOKED, EMBED, SCORE]
    registry.put(entry(loaded, META))
    hidden = {name: is_hidden(registry, name) for name in (EMBED, SCORE, HOOKED, META)}
    assert hidden == {EMBED: True, SCORE: True, HOOKED: False, META: False}
    assert [e.name for e in registry.visible()] == [HOOKED, META]
    registry.put(entry(loaded, EMBED_ONLY))
    registry.remove(META)  # embed_only still owns pipeline_embed
    assert [e.name for e in registry.visible()] == [EMBED_ONLY, HOOKED, SCORE]
    assert is_hidden(registry, EMBED)
    registry.remove(EMBED_ONLY)
    assert [e.name for e in registry.visible()] == [HOOKED, EMBED, SCORE]
    assert registry.owners(EMBED) == ()


def test_a_sub_model_put_after_its_meta_is_hidden_on_arrival(loaded: World) -> None:
    registry = registry_of(loaded, META)
    registry.put(entry(loaded, EMBED))
    assert is_hidden(registry, EMBED)
    # A reload replaces the entry whole: the new one is hidden too.
    registry.put(attrs.evolve(entry(loaded, EMBED), reason="reloaded"))
    assert is_hidden(registry, EMBED)


def test_a_hidden_sub_model_is_not_found_to_clients(loaded: World) -> None:
    registry = registry_of(loaded, EMBED, SCORE, META, EMBED_ONLY)
    for lookup in (registry.find, registry.resolve):
        with pytest.raises(ModelNotFoundError) as caught:
            lookup(SCORE)
        assert str(caught.value) == "model 'pipeline_score' is internal to meta 'pipeline'"
        assert status_of(caught.value) is grpc.StatusCode.NOT_FOUND
    with pytest.raises(ModelNotFoundError, match="internal to meta 'embed_only' or 'pipeline'"):
        registry.find(EMBED)
    assert registry.get(EMBED) is not None  # the worker itself still reaches it
    assert registry.resolve(META).name == META


def test_expose_sub_models_hides_nothing_but_keeps_the_groups(loaded: World) -> None:
    registry = registry_of(loaded, EMBED, SCORE, META, expose=True)
    assert registry.owners(EMBED) == (META,)
    assert [e.name for e in registry.visible()] == [META, EMBED, SCORE]
    assert registry.resolve(EMBED).name == EMBED


def test_a_failed_meta_hides_nothing(loaded: World) -> None:
    registry = registry_of(loaded, EMBED, SCORE)
    registry.put(ModelEntry.failed(META, "model.py: import failed"))
    registry.put(ModelEntry.loading(EMBED_ONLY))
    assert registry.owners(EMBED) == ()
    assert registry.metas() == []
    assert [e.name for e in registry.visible()] == [EMBED_ONLY, META, EMBED, SCORE]
    with pytest.raises(ModelUnavailableError, match=r"model\.py: import failed"):
        registry.resolve(META)
    # The failed entry replacing a loaded meta gives its sub-models back.
    registry.put(entry(loaded, META))
    assert is_hidden(registry, SCORE)
    registry.put(ModelEntry.failed(META, "reload failed"))
    assert not is_hidden(registry, SCORE)


def test_a_meta_named_by_another_meta_stays_visible(loaded: World) -> None:
    registry = registry_of(loaded, EMBED, SCORE, META, NESTED)
    assert registry.resolve(META).name == META
    assert not is_hidden(registry, META)


# -- readiness ---------------------------------------------------------------------------------


def state_with(world: World, *names: str) -> WorkerState:
    state = WorkerState(world.state.config, version="0.0.test")
    for name in names:
        state.registry.put(entry(world, name))
    state.started = True
    return state


def test_a_meta_serves_when_every_callee_does(loaded: World) -> None:
    state = state_with(loaded, EMBED, SCORE, META)
    meta = state.registry.get(META)
    assert meta is not None
    assert state.unavailable_reason(meta) is None
    assert state.serving(meta)
    assert state.model_ready(META)
    assert state.model_ready(META, "1")
    assert not state.model_ready(META, "2")
    assert not state.model_ready(EMBED)  # serving, but hidden
    assert state.ready()  # ServerReady: the only visible model is the meta


def test_a_meta_with_a_missing_callee_is_not_ready(loaded: World) -> None:
    state = state_with(loaded, EMBED, META, GHOSTLY)
    for name, missing in ((META, SCORE), (GHOSTLY, "ghost")):
        meta = state.registry.get(name)
        assert meta is not None
        assert state.unavailable_reason(meta) == f"sub-model '{missing}' is not loaded"
        assert not state.model_ready(name)
    state.registry.put(ModelEntry.loading(SCORE))
    meta = state.registry.get(META)
    assert meta is not None
    assert state.unavailable_reason(meta) == "sub-model 'pipeline_score' is not loaded"
    state.registry.put(entry(loaded, SCORE))
    assert state.model_ready(META)


def test_a_meta_calling_a_meta_is_not_ready(loaded: World) -> None:
    state = state_with(loaded, EMBED, SCORE, META, NESTED)
    nested = state.registry.get(NESTED)
    assert nested is not None
    assert state.unavailable_reason(nested) == (
        "sub-model 'pipeline' is a meta model; a meta may call regular models only"
    )
    assert not state.model_ready(NESTED)


def test_server_ready_needs_start_up_and_a_loaded_visible_model(loaded: World) -> None:
    state = state_with(loaded, META)  # no sub-model loaded: the meta does not serve...
    assert not state.model_ready(META)
    assert state.ready()  # ...but ServerReady counts loaded models
    state.started = False
    assert not state.ready()
