"""The supervisor: run every child, restart crashes, probe liveness, shut down on a signal.

The restart policy and crash budget, signals and shutdown, and supervisor liveness probes.
Each child is supervised by its own task; a shutdown (a signal, or a child out of restarts)
stops every child concurrently and :meth:`Supervisor.run` returns the exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from reactantserver.core.config import SupervisorConfig
from reactantserver.node._child import Child, describe_exit, http_status
from reactantserver.node._logmux import LogMux
from reactantserver.node._spec import ChildSpec

__all__ = [
    "EXIT_CRASH_BUDGET",
    "EXIT_OK",
    "LIVENESS_TIMEOUT_SECONDS",
    "RestartBudget",
    "Supervisor",
    "backoff_seconds",
]

#: ``run()`` after a graceful shutdown.
EXIT_OK: Final = 0
#: ``run()`` when a child failed more than ``max_restarts`` consecutive times.
EXIT_CRASH_BUDGET: Final = 1
#: How long one ``/healthz`` probe may take before it counts as failed.
LIVENESS_TIMEOUT_SECONDS: Final = 2.0

_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


def backoff_seconds(counter: int, cap: float) -> float:
    """The delay before restart number ``counter`` (1, 2, 3 …): ``min(2**(counter-1), cap)``."""
    if counter < 1:
        raise ValueError(f"counter must be >= 1, got {counter}")
    # Past 2**64 the cap has long won; avoid float overflow for absurd counters.
    return min(2.0 ** min(counter - 1, 64), cap)


class RestartBudget:
    """One child's consecutive-crash count and what it allows next."""

    def __init__(
        self, *, max_restarts: int, stable_uptime_seconds: float, max_backoff_seconds: float
    ) -> None:
        self.max_restarts = max_restarts
        self.stable_uptime_seconds = stable_uptime_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.consecutive = 0

    @classmethod
    def from_policy(cls, policy: SupervisorConfig) -> RestartBudget:
        """The budget the node file's ``supervisor:`` block sets."""
        return cls(
            max_restarts=policy.max_restarts,
            stable_uptime_seconds=policy.stable_uptime_seconds,
            max_backoff_seconds=policy.max_backoff_seconds,
        )

    def on_exit(self, uptime: float) -> float | None:
        """Count an exit after ``uptime`` seconds; the restart delay, or ``None`` when spent.

        A run of at least ``stable_uptime_seconds`` resets the count first;
        ``max_restarts == 0`` never runs out.
        """
        if uptime >= self.stable_uptime_seconds:
            self.consecutive = 0
        self.consecutive += 1
        if 0 < self.max_restarts < self.consecutive:
            return None
        return backoff_seconds(self.consecutive, self.max_backoff_seconds)


class Supervisor:
    """Runs ``children`` under ``policy`` until a signal or an exhausted crash budget.

    Usage: ``code = await Supervisor(specs, config.supervisor, LogMux(sys.stdout.buffer)).run()``.
    ``role`` and ``notes`` (planner warnings and the like) are only logged.
    """

    def __init__(
        self,
        children: Sequence[ChildSpec],
        policy: SupervisorConfig,
        mux: LogMux,
        *,
        role: str = "all",
        notes: Sequence[str] = (),
    ) -> None:
        self._children = tuple(children)
        self._policy = policy
        self._mux = mux
        self._role = role
        self._notes = tuple(notes)
        self._shutdown = asyncio.Event()
        self._exit_code = EXIT_OK
        self._signalled = False

    @property
    def shutting_down(self) -> bool:
        """Whether a shutdown was requested (by a signal, a call, or a spent crash budget)."""
        return self._shutdown.is_set()

    def request_shutdown(self) -> None:
        """Stop restarting and stop every child; ``run()`` then returns 0. Idempotent."""
        self._begin_shutdown(EXIT_OK)

    async def run(self) -> int:
        """Supervise until shutdown; 0 after a graceful one, 1 when a crash budget ran out."""
        self._mux.supervisor(f"role {self._role}; {len(self._children)} children")
        for note in self._notes:
            self._mux.supervisor(note)
        restore = self._install_signal_handlers()
        tasks = [
            asyncio.create_task(self._supervise(spec), name=f"supervise {spec.name}")
            for spec in self._children
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            # Reached early only when run() itself is cancelled: stop the children anyway.
            self._begin_shutdown(EXIT_OK)
            await asyncio.gather(*tasks, return_exceptions=True)
            restore()
        self._mux.supervisor(f"shutdown complete (exit code {self._exit_code})")
        return self._exit_code

    def _begin_shutdown(self, code: int) -> None:
        if self._shutdown.is_set():
            return
        self._exit_code = code
        self._shutdown.set()

    def _on_signal(self, signum: signal.Signals) -> None:
        if self._signalled:
            return
        self._signalled = True
        if not self._shutdown.is_set():
            self._mux.supervisor(f"received {signum.name}; shutting down")
        self.request_shutdown()

    def _install_signal_handlers(self) -> Callable[[], None]:
        """Route SIGTERM/SIGINT to :meth:`request_shutdown`; returns the undo."""
        loop = asyncio.get_running_loop()
        previous: dict[signal.Signals, Any] = {}
        for signum in _SIGNALS:
            try:
                old = signal.getsignal(signum)
                loop.add_signal_handler(signum, self._on_signal, signum)
            except (ValueError, RuntimeError, NotImplementedError) as exc:
                # Not the main thread (or no Unix signals): the caller must stop us itself.
                self._mux.supervisor(f"not handling {signum.name}: {exc}")
                continue
            previous[signum] = old

        def restore() -> None:
            for signum, old in previous.items():
                loop.remove_signal_handler(signum)
                if old is not None:
                    signal.signal(signum, old)

        return restore

    async def _supervise(self, spec: ChildSpec) -> None:
        """Start ``spec``, restart it per the budget, stop it at shutdown."""
        budget = RestartBudget.from_policy(self._policy)
        try:
            while not self._shutdown.is_set():
                uptime = await self._run_once(spec)
                if uptime is None or self._shutdown.is_set():
                    return
                delay = budget.on_exit(uptime)
                if delay is None:
                    self._mux.supervisor(
                        f"{spec.name} failed {budget.consecutive} consecutive times; "
                        "shutting the node down"
                    )
                    self._begin_shutdown(EXIT_CRASH_BUDGET)
                    return
                self._mux.supervisor(f"restarting {spec.name} in {delay:g} s")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._shutdown.wait()
        except Exception as exc:
            self._mux.supervisor(f"supervising {spec.name} failed: {exc!r}; shutting down")
            self._begin_shutdown(EXIT_CRASH_BUDGET)

    async def _run_once(self, spec: ChildSpec) -> float | None:
        """One run of the child: its uptime, or ``None`` when shutdown stopped it."""
        child = Child(spec, self._mux)
        try:
            await child.start()
        except OSError as exc:
            self._mux.supervisor(f"failed to start {spec.name}: {exc}")
            return 0.0
        port = "no HTTP port" if spec.http_port is None else f"HTTP port {spec.http_port}"
        self._mux.supervisor(f"started {spec.name} (pid {child.pid}, {port})")
        waits: dict[asyncio.Task[Any], str] = {
            asyncio.create_task(child.wait()): "exit",
            asyncio.create_task(self._shutdown.wait()): "shutdown",
        }
        if self._liveness_url(spec) is not None:
            waits[asyncio.create_task(self._liveness(child))] = "liveness"
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            reasons = {waits[task] for task in done}
            if "exit" not in reasons:
                if "liveness" in reasons and "shutdown" not in reasons:
                    self._mux.supervisor(
                        f"{spec.name} failed {self._policy.liveness_failures} liveness probes "
                        "in a row; stopping it"
                    )
                returncode = await child.stop()
            else:
                returncode = await child.wait()
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            if child.returncode is None:
                await child.stop()  # only when cancelled: never leave the child running
        uptime = time.monotonic() - child.started_at
        self._mux.supervisor(f"{spec.name} {describe_exit(returncode)} after {uptime:.1f} s")
        return None if "shutdown" in reasons else uptime

    def _liveness_url(self, spec: ChildSpec) -> str | None:
        if self._policy.liveness_interval_seconds <= 0:
            return None
        return spec.url("/healthz")

    async def _liveness(self, child: Child) -> None:
        """Return once the child, having answered 200 once, failed enough probes in a row."""
        url = self._liveness_url(child.spec)
        assert url is not None
        interval = self._policy.liveness_interval_seconds
        answered = False
        failures = 0
        while True:
            await asyncio.sleep(interval)
            status = await http_status(url, LIVENESS_TIMEOUT_SECONDS)
            if status == 200:
                answered, failures = True, 0
            elif answered:
                failures += 1
                what = "no answer" if status is None else f"status {status}"
                self._mux.supervisor(f"{child.name} liveness probe failed ({what})")
                if failures >= self._policy.liveness_failures:
                    return
