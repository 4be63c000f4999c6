"""The repository watcher: poll ``model_dirs``, debounce, apply the changes.

``dynamic`` mode only. A thread polls every ``model_poll_seconds``: it scans the roots,
digests every bundle (re-hashing only files whose stat fingerprint moved), asks the
:class:`~reactantserver.worker.repository.reconcile.Reconciler` what two consecutive polls
confirmed, and applies each action through the
:class:`~reactantserver.worker.repository.lifecycle.ModelLifecycle` (a failed load or reload is
logged and recorded there; the watcher keeps going)::

    watcher = RepositoryWatcher(state, lifecycle, seed=seen)
    watcher.start()
    watcher.poll()          # one poll now (tests); returns the actions it applied
    watcher.force("mlp")    # RepositoryModelLoad: reconcile one bundle without the debounce
    watcher.stop()
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from reactantserver.core.config import ModelControlMode
from reactantserver.core.errors import ModelNotFoundError, status_message
from reactantserver.worker.repository.boot import Booted
from reactantserver.worker.repository.lifecycle import ModelLifecycle
from reactantserver.worker.repository.reconcile import (
    Action,
    Load,
    Reconciler,
    Reload,
    Rename,
    Seen,
    Unload,
)
from reactantserver.worker.repository.scan import observe, scan_model_dirs
from reactantserver.worker.state import Runtime, WorkerState

__all__ = ["RepositoryControl", "RepositoryWatcher", "start_lifecycle"]

_log = logging.getLogger("reactantserver.worker.watcher")


class RepositoryWatcher:
    """Polls the model directories and keeps the served model set equal to them."""

    def __init__(
        self,
        state: WorkerState,
        lifecycle: ModelLifecycle,
        *,
        seed: Mapping[str, Seen],
    ) -> None:
        self._state = state
        self._lifecycle = lifecycle
        self._reconciler = Reconciler(seed)
        self._stop = threading.Event()
        # Start and stop may race (a shutdown while the loader thread is still starting the
        # watcher): the lock makes ``_thread`` name only a started thread, and a watcher
        # stopped first never starts one.
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.polls = 0
        """Completed polls (tests wait on it)."""

    @property
    def interval_s(self) -> float:
        """``model_poll_seconds``."""
        return self._state.config.model_poll_seconds

    def start(self) -> None:
        """Start the watcher thread (nothing, once :meth:`stop` was called)."""
        with self._lock:
            if self._stop.is_set() or self._thread is not None:
                return
            thread = threading.Thread(target=self._run, name="reactant-watcher", daemon=True)
            thread.start()
            self._thread = thread

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop polling (honoured at once between polls, or when a compiling load finishes).

        Waits up to ``timeout_s`` for the thread (``None``: until it ends). Safe to call
        before, during or after :meth:`start`, from any thread.
        """
        with self._lock:
            self._stop.set()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):  # returns at once when stop() is called
            try:
                self.poll()
            except Exception:
                _log.exception("repository poll failed; trying again next poll")

    # -- one poll ----------------------------------------------------------------------------

    def _observe(self) -> dict[str, Seen]:
        config = self._state.config
        found = scan_model_dirs([Path(d) for d in config.model_dirs], include=config.models_include)
        seen = observe(found, self._lifecycle.digester)
        known = self._lifecycle.known
        # Keep what cannot be judged this poll: names in two roots, and models whose root
        # could not be listed (an NFS hiccup must not unload them).
        kept = set(found.conflicts)
        kept.update(
            name for name, k in known.items() if any(k.path.parent == r for r in found.unreadable)
        )
        for name in kept:
            if name in known and name not in seen:
                k = known[name]
                seen[name] = Seen(k.path, k.identity, k.digest)
        return seen

    def poll(self) -> list[Action]:
        """Scan and digest once, then apply what two consecutive polls confirmed."""
        with self._lifecycle.lock:
            seen = self._observe()
            actions = self._reconciler.plan(dict(self._lifecycle.known), seen)
            self._apply(actions)
            self._lifecycle.refresh(seen)
        self.polls += 1
        return actions

    def force(self, name: str) -> list[Action]:
        """Reconcile ``name`` now without the debounce (``RepositoryModelLoad``, dynamic mode).

        ``NOT_FOUND`` when no model directory holds such a bundle; re-raises a failed load.
        """
        with self._lifecycle.lock:
            seen = self._observe()
            try:
                actions = self._reconciler.forced(name, dict(self._lifecycle.known), seen)
            except LookupError:
                raise ModelNotFoundError(
                    f"no bundle named '{name}' in the model directories"
                ) from None
            self._apply(actions, strict=True)
        return actions

    def _apply(self, actions: Sequence[Action], *, strict: bool = False) -> None:
        lifecycle = self._lifecycle
        for action in actions:
            try:
                if isinstance(action, Unload):
                    lifecycle.unload(action.name)
                elif isinstance(action, Rename):
                    lifecycle.rename(action.old, action.new, action.seen)
                elif isinstance(action, Load | Reload):
                    lifecycle.install(action.name, action.seen)
            except Exception as exc:
                if strict:
                    raise
                # install() has logged and recorded a failed load; this covers the rest.
                _log.warning("watcher action %s failed: %s", action, status_message(exc))


@attrs.frozen
class RepositoryControl:
    """What changes the served models once start-up is done (the worker server holds it)."""

    lifecycle: ModelLifecycle
    """Loads, reloads, unloads and renames models."""
    watcher: RepositoryWatcher | None
    """The repository watcher in ``dynamic`` mode (started), else ``None``."""


def start_lifecycle(state: WorkerState, runtime: Runtime, booted: Booted) -> RepositoryControl:
    """After start-up: hand the models to a lifecycle and, in ``dynamic`` mode, start watching."""
    lifecycle = ModelLifecycle(state, runtime)
    lifecycle.digester = booted.digester
    for name, seen in booted.seen.items():
        entry = state.registry.get(name)
        if entry is not None and entry.installed:
            lifecycle.adopt(entry, seen)
        else:
            lifecycle.note_failed(name, seen)
    watcher = None
    if state.config.model_control_mode is ModelControlMode.DYNAMIC:
        watcher = RepositoryWatcher(state, lifecycle, seed=booted.seen)
        watcher.start()
    return RepositoryControl(lifecycle, watcher)
