"""The watcher's plan per poll: debounce, load/reload/unload, failures, renames and chains."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from reactantserver.worker.repository.reconcile import (
    Action,
    Known,
    Load,
    Reconciler,
    Reload,
    Rename,
    Seen,
    Unload,
)

A, B, C, D = (0, 1), (0, 2), (0, 3), (0, 4)


def seen(name: str, identity: tuple[int, int], digest: str) -> Seen:
    return Seen(Path("/models") / name, identity, digest)


def known_as(s: Seen, *, failed: bool = False, serving: bool = True) -> Known:
    return Known(s.path, s.identity, s.digest, failed=failed, serving=serving)


def apply(known: Mapping[str, Known], actions: Sequence[Action]) -> dict[str, Known]:
    """What the watcher thread does with a plan, every step succeeding."""
    after = dict(known)
    for action in actions:
        match action:
            case Load(name, s) | Reload(name, s):
                after[name] = known_as(s)
            case Unload(name):
                assert name in after, f"unload of unknown {name}"
                del after[name]
            case Rename(old, new, s):
                assert old in after, f"rename of unknown {old}"
                assert new not in after, f"rename onto occupied {new}"
                del after[old]
                after[new] = known_as(s)
    return after


class World:
    """A reconciler and the worker's known models, polled like the watcher does."""

    def __init__(self, initial: Mapping[str, Seen]) -> None:
        self.known = {name: known_as(s) for name, s in initial.items()}
        self.reconciler = Reconciler(initial)

    def poll(self, observed: Mapping[str, Seen]) -> list[Action]:
        actions = self.reconciler.plan(self.known, observed)
        self.known = apply(self.known, actions)
        return actions


MLP = seen("mlp", A, "d1")


def test_a_poll_identical_to_the_seed_is_a_noop() -> None:
    world = World({"mlp": MLP, "other": seen("other", B, "d2")})
    assert world.poll({"mlp": MLP, "other": seen("other", B, "d2")}) == []
    assert world.poll({"mlp": MLP, "other": seen("other", B, "d2")}) == []


def test_an_empty_repository_stays_quiet() -> None:
    world = World({})
    assert world.poll({}) == []


def test_a_new_bundle_loads_on_the_second_equal_poll() -> None:
    world = World({"mlp": MLP})
    new = seen("new", B, "n1")
    assert world.poll({"mlp": MLP, "new": new}) == []
    assert world.poll({"mlp": MLP, "new": new}) == [Load("new", new)]
    assert world.poll({"mlp": MLP, "new": new}) == []


def test_a_bundle_changing_on_every_poll_waits_for_two_equal_polls() -> None:
    world = World({})
    for digest in ("p1", "p2", "p3", "p4"):
        assert world.poll({"new": seen("new", B, digest)}) == []
    assert world.poll({"new": seen("new", B, "p4")}) == [Load("new", seen("new", B, "p4"))]


def test_a_changed_digest_reloads_after_two_polls() -> None:
    world = World({"mlp": MLP})
    changed = seen("mlp", A, "d2")
    assert world.poll({"mlp": changed}) == []
    assert world.poll({"mlp": changed}) == [Reload("mlp", changed)]
    assert world.poll({"mlp": changed}) == []


def test_a_half_written_change_never_reloads_until_settled() -> None:
    world = World({"mlp": MLP})
    assert world.poll({"mlp": seen("mlp", A, "partial-1")}) == []
    assert world.poll({"mlp": seen("mlp", A, "partial-2")}) == []
    # Back to the original content: confirmed, and equal to what serves.
    assert world.poll({"mlp": MLP}) == []
    assert world.poll({"mlp": MLP}) == []


def test_a_removed_bundle_unloads_after_two_polls() -> None:
    world = World({"mlp": MLP, "keep": seen("keep", B, "k")})
    assert world.poll({"keep": seen("keep", B, "k")}) == []
    assert world.poll({"keep": seen("keep", B, "k")}) == [Unload("mlp")]
    assert world.poll({"keep": seen("keep", B, "k")}) == []


def test_a_flapping_bundle_is_never_unloaded() -> None:
    world = World({"mlp": MLP})
    for _ in range(3):
        assert world.poll({}) == []
        assert world.poll({"mlp": MLP}) == []
    assert "mlp" in world.known


def test_a_failed_digest_is_retried_only_when_it_changes_again() -> None:
    world = World({"mlp": MLP})
    broken = seen("mlp", A, "broken")
    assert world.poll({"mlp": broken}) == []
    assert world.poll({"mlp": broken}) == [Reload("mlp", broken)]
    world.known["mlp"] = known_as(broken, failed=True)  # the old generation keeps serving
    for _ in range(3):
        assert world.poll({"mlp": broken}) == []
    fixed = seen("mlp", A, "fixed")
    assert world.poll({"mlp": fixed}) == []
    assert world.poll({"mlp": fixed}) == [Reload("mlp", fixed)]


def test_a_failed_first_load_is_retried_as_a_reload_when_it_changes() -> None:
    world = World({})
    broken = seen("new", B, "broken")
    world.poll({"new": broken})
    assert world.poll({"new": broken}) == [Load("new", broken)]
    world.known["new"] = known_as(broken, failed=True, serving=False)
    assert world.poll({"new": broken}) == []
    fixed = seen("new", B, "fixed")
    world.poll({"new": fixed})
    assert world.poll({"new": fixed}) == [Reload("new", fixed)]


def test_a_failed_model_that_is_removed_unloads() -> None:
    world = World({"mlp": MLP})
    world.known["mlp"] = known_as(MLP, failed=True, serving=False)
    world.poll({})
    assert world.poll({}) == [Unload("mlp")]


def test_forced_loads_reloads_or_does_nothing() -> None:
    reconciler = Reconciler({"mlp": MLP})
    new = seen("new", B, "n1")
    known = {"mlp": known_as(MLP)}
    assert reconciler.forced("mlp", known, {"mlp": MLP}) == []
    assert reconciler.forced("new", known, {"mlp": MLP, "new": new}) == [Load("new", new)]
    changed = seen("mlp", A, "d2")
    assert reconciler.forced("mlp", known, {"mlp": changed}) == [Reload("mlp", changed)]
    failed = {"mlp": known_as(MLP, failed=True)}
    assert reconciler.forced("mlp", failed, {"mlp": MLP}) == [Reload("mlp", MLP)]


def test_forced_on_an_absent_bundle_raises_lookup_error() -> None:
    reconciler = Reconciler({"mlp": MLP})
    with pytest.raises(LookupError, match="ghost"):
        reconciler.forced("ghost", {"mlp": known_as(MLP)}, {"mlp": MLP})


def test_forced_leaves_the_debounce_of_other_names_alone() -> None:
    world = World({"mlp": MLP, "other": seen("other", B, "o1")})
    other2 = seen("other", B, "o2")
    new = seen("new", C, "n1")
    # Poll 1 sees "other" change; a forced load of "new" happens before poll 2.
    assert world.poll({"mlp": MLP, "other": other2}) == []
    forced_view = {"mlp": MLP, "other": seen("other", B, "o3"), "new": new}
    actions = world.reconciler.forced("new", world.known, forced_view)
    assert actions == [Load("new", new)]
    world.known = apply(world.known, actions)
    # "other" is still confirmed by poll 2 against poll 1, not reset by the forced view.
    assert world.poll({"mlp": MLP, "other": other2, "new": new}) == [Reload("other", other2)]
    assert world.poll({"mlp": MLP, "other": other2, "new": new}) == []


def test_forced_reload_then_polls_do_not_reload_again() -> None:
    world = World({"mlp": MLP})
    changed = seen("mlp", A, "d2")
    actions = world.reconciler.forced("mlp", world.known, {"mlp": changed})
    world.known = apply(world.known, actions)
    assert world.poll({"mlp": changed}) == []
    assert world.poll({"mlp": changed}) == []


def test_a_renamed_directory_is_renamed_in_place() -> None:
    staging = seen("m-staging", A, "d1")
    world = World({"m-staging": staging})
    production = seen("m-production", A, "d1")
    assert world.poll({"m-production": production}) == []
    assert world.poll({"m-production": production}) == [
        Rename("m-staging", "m-production", production)
    ]
    assert world.poll({"m-production": production}) == []


def test_a_rename_seen_across_polls_still_renames() -> None:
    # The new name appears one poll before the old one goes: wait for the old name's
    # absence to be confirmed rather than loading a copy.
    staging = seen("m-staging", A, "d1")
    world = World({"m-staging": staging})
    production = seen("m-production", A, "d1")
    assert world.poll({"m-staging": staging, "m-production": production}) == []
    assert world.poll({"m-production": production}) == []
    assert world.poll({"m-production": production}) == [
        Rename("m-staging", "m-production", production)
    ]


def test_a_rename_with_changed_content_is_unload_and_load() -> None:
    world = World({"m-staging": seen("m-staging", A, "d1")})
    production = seen("m-production", A, "d2")
    assert world.poll({"m-production": production}) == []
    assert world.poll({"m-production": production}) == [
        Load("m-production", production),
        Unload("m-staging"),
    ]


def test_a_copy_with_the_same_content_is_a_load() -> None:
    staging = seen("m-staging", A, "d1")
    world = World({"m-staging": staging})
    copy = seen("m-production", B, "d1")
    world.poll({"m-production": copy})
    assert world.poll({"m-production": copy}) == [Load("m-production", copy), Unload("m-staging")]


def test_a_symlinked_second_name_does_not_steal_the_first() -> None:
    staging = seen("m-staging", A, "d1")
    world = World({"m-staging": staging})
    alias = seen("m-production", A, "d1")  # same directory under two names
    world.poll({"m-staging": staging, "m-production": alias})
    assert world.poll({"m-staging": staging, "m-production": alias}) == [
        Load("m-production", alias)
    ]


def test_a_failed_model_is_not_renamed() -> None:
    staging = seen("m-staging", A, "d1")
    world = World({"m-staging": staging})
    world.known["m-staging"] = known_as(staging, failed=True)
    production = seen("m-production", A, "d1")
    world.poll({"m-production": production})
    assert world.poll({"m-production": production}) == [
        Load("m-production", production),
        Unload("m-staging"),
    ]


def test_a_promotion_chain_renames_in_dependency_order() -> None:
    world = World(
        {"m-production": seen("m-production", A, "p"), "m-staging": seen("m-staging", B, "s")}
    )
    after = {
        "m-production-old": seen("m-production-old", A, "p"),
        "m-production": seen("m-production", B, "s"),
    }
    assert world.poll(after) == []
    assert world.poll(after) == [
        Rename("m-production", "m-production-old", after["m-production-old"]),
        Rename("m-staging", "m-production", after["m-production"]),
    ]
    assert set(world.known) == {"m-production-old", "m-production"}
    assert world.known["m-production"].identity == B
    assert world.poll(after) == []


def test_a_three_step_chain() -> None:
    world = World({"v1": seen("v1", A, "a"), "v2": seen("v2", B, "b"), "v3": seen("v3", C, "c")})
    after = {"v0": seen("v0", A, "a"), "v1": seen("v1", B, "b"), "v2": seen("v2", C, "c")}
    world.poll(after)
    assert world.poll(after) == [
        Rename("v1", "v0", after["v0"]),
        Rename("v2", "v1", after["v1"]),
        Rename("v3", "v2", after["v2"]),
    ]


def test_a_rename_cycle_falls_back_to_unload_and_load() -> None:
    world = World({"a": seen("a", A, "x"), "b": seen("b", B, "y"), "c": seen("c", C, "z")})
    swapped = {"a": seen("a", B, "y"), "b": seen("b", A, "x"), "c": seen("c", C, "z")}
    assert world.poll(swapped) == []
    assert world.poll(swapped) == [
        Unload("a"),
        Unload("b"),
        Load("a", swapped["a"]),
        Load("b", swapped["b"]),
    ]
    assert world.poll(swapped) == []


def test_an_occupied_target_whose_directory_vanished_is_unloaded_first() -> None:
    world = World(
        {"m-production": seen("m-production", A, "p"), "m-staging": seen("m-staging", B, "s")}
    )
    # m-production's directory was deleted, m-staging moved onto its name.
    after = {"m-production": seen("m-production", B, "s")}
    assert world.poll(after) == []
    assert world.poll(after) == [
        Unload("m-production"),
        Rename("m-staging", "m-production", after["m-production"]),
    ]
    assert world.known == {"m-production": known_as(after["m-production"])}


def test_an_old_directory_replaced_by_another_is_rename_then_load() -> None:
    world = World({"m-staging": seen("m-staging", A, "s1")})
    after = {"m-production": seen("m-production", A, "s1"), "m-staging": seen("m-staging", B, "s2")}
    assert world.poll(after) == []
    assert world.poll(after) == [
        Rename("m-staging", "m-production", after["m-production"]),
        Load("m-staging", after["m-staging"]),
    ]
    assert world.poll(after) == []


def test_a_replaced_old_directory_still_settling_loads_later() -> None:
    world = World({"m-staging": seen("m-staging", A, "s1")})
    production = seen("m-production", A, "s1")
    world.poll({"m-production": production})
    # The rename is confirmed; the new m-staging is still being written.
    partial = seen("m-staging", B, "half")
    assert world.poll({"m-production": production, "m-staging": partial}) == [
        Rename("m-staging", "m-production", production)
    ]
    full = seen("m-staging", B, "s2")
    assert world.poll({"m-production": production, "m-staging": full}) == []
    assert world.poll({"m-production": production, "m-staging": full}) == [Load("m-staging", full)]


def test_a_replaced_directory_with_new_content_reloads() -> None:
    world = World({"mlp": MLP})
    republished = seen("mlp", B, "d2")  # atomic publication: a fresh directory swapped in
    world.poll({"mlp": republished})
    assert world.poll({"mlp": republished}) == [Reload("mlp", republished)]


def test_output_groups_are_ordered_and_sorted_by_name() -> None:
    initial = {
        "p": seen("p", A, "p"),
        "q": seen("q", B, "q"),
        "r1": seen("r1", C, "r"),
        "r2": seen("r2", D, "r"),
        "gone1": seen("gone1", (0, 10), "g"),
        "gone2": seen("gone2", (0, 11), "g"),
    }
    world = World(initial)
    after = {
        "p": seen("p", B, "q"),  # q moved onto p, whose directory vanished
        "r1": seen("r1", C, "r1-new"),
        "r2": seen("r2", D, "r2-new"),
        "zz": seen("zz", (0, 20), "z"),
        "aa": seen("aa", (0, 21), "a"),
    }
    world.poll(after)
    assert world.poll(after) == [
        Unload("p"),
        Rename("q", "p", after["p"]),
        Reload("r1", after["r1"]),
        Reload("r2", after["r2"]),
        Load("aa", after["aa"]),
        Load("zz", after["zz"]),
        Unload("gone1"),
        Unload("gone2"),
    ]
