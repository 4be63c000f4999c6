"""A scheduler over a :class:`MockBackend` whose executions are recorded and timed exactly.

Timing-free tests share one :class:`FakeClock` between the scheduler and the backend and
drive the loop with :meth:`Scheduler.step`; every execution advances the clock by the
duration set for its model (and batch size), so measured costs and fair EMAs are exact::

    h = Harness(discipline=SchedulingDiscipline.FIFO)
    h.add("m", sizes=(1, 4), duration_s=0.010)
    r = h.submit("m", row(3))
    h.drain()
    assert r.value().tolist() == [[30.0, 300.0]]

Threaded tests call :meth:`Harness.start` (real clock when ``real_clock=True``) and
:meth:`Harness.hold` a model so that its next execution blocks on a :class:`Gate` until
the test releases it; :meth:`Harness.close` releases every gate and stops the scheduler.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from reactantserver.core.config import SchedulerConfig
from reactantserver.core.dtypes import DType
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.manifest import VariableAxis
from reactantserver.core.types import Batch, Fixed, TensorSpec, Variable
from reactantserver.worker.runtime.backend import CompileSpec
from reactantserver.worker.scheduler import (
    FutureCompletion,
    Pending,
    ProgramKey,
    ScheduledModel,
    Scheduler,
)
from reactantserver.worker.testing import FakeClock, MockBackend

__all__ = [
    "SCALE",
    "WAIT_S",
    "Gate",
    "Harness",
    "Request",
    "Run",
    "row",
    "variant_axes",
    "wait_for",
]

Array = np.ndarray[Any, Any]
Outputs = list[Array]

#: Bounded wait for anything another thread must do (never a timing assertion).
WAIT_S = 10.0

#: The default model multiplies feature 0 by 10 and feature 1 by 100 (04's batching example).
SCALE = np.array([10.0, 100.0], np.float32)

X = TensorSpec("x", DType.F32, (Batch(), Fixed(2)))


def row(*values: float) -> Array:
    """One request row ``[[v0, v1, ...]]`` (``row(k)`` is ``[[k, k]]``)."""
    if len(values) == 1:
        values = (values[0], values[0])
    return np.array([values], np.float32)


def wait_for(predicate: Callable[[], bool], timeout: float = WAIT_S) -> None:
    """Poll ``predicate`` until it holds; ``AssertionError`` after ``timeout`` seconds."""
    limit = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > limit:
            raise AssertionError("condition not reached in time")
        time.sleep(0.001)


@attrs.frozen
class Run:
    """One execution the backend performed (failed ones are recorded too, ``ok=False``)."""

    model: str
    generation: int
    variant: int | None
    batch: int
    inputs: tuple[Array, ...]
    ok: bool = True

    @property
    def first_column(self) -> list[float]:
        """Feature 0 of every row of the first input (identifies the requests taken)."""
        return [float(v) for v in self.inputs[0].reshape(self.inputs[0].shape[0], -1)[:, 0]]


@attrs.define(eq=False)
class Gate:
    """Blocks a model's executions: ``entered`` is set when one starts, ``release`` lets it go."""

    entered: threading.Event = attrs.Factory(threading.Event)
    release: threading.Event = attrs.Factory(threading.Event)
    count: int = 0


@attrs.define(eq=False)
class Request:
    """A submitted request and the future its outcome lands in."""

    pending: Pending
    completion: FutureCompletion

    @property
    def future(self) -> concurrent.futures.Future[Outputs]:
        """The caller's future."""
        return self.completion.future

    def outputs(self) -> Outputs:
        """The outputs (waits a bounded time for another thread)."""
        return self.future.result(timeout=WAIT_S)

    def value(self) -> Array:
        """The first output."""
        return self.outputs()[0]

    def error(self) -> BaseException:
        """The exception the request failed with (``AssertionError`` if it succeeded)."""
        exc = self.future.exception(timeout=WAIT_S)
        assert exc is not None, "the request succeeded"
        return exc


class Harness:
    """A :class:`Scheduler` on a recording :class:`MockBackend`, with helpers."""

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        real_clock: bool = False,
        **settings: Any,
    ) -> None:
        self.clock = FakeClock()
        self.backend = MockBackend(clock=self.clock)
        # The planning rules are tested as they are documented, without the pad-up step
        # (on by default since the adaptive wait); tests of pad-up turn it on themselves.
        settings.setdefault("pad_up_when_cheaper", False)
        self.config = config or SchedulerConfig(**settings)
        clock: Callable[[], int] = time.monotonic_ns if real_clock else self.clock
        self.scheduler = Scheduler(self.backend, None, self.config, clock=clock)
        self.runs: list[Run] = []
        self.durations: dict[tuple[str, int | None], float] = {}
        self.gates: dict[str, Gate] = {}
        self.started = False
        self._lock = threading.Lock()

    # -- models ----------------------------------------------------------------------------

    def build(
        self,
        name: str,
        *,
        sizes: Sequence[int] = (1, 2),
        generation: int = 1,
        compute: Callable[[Array], Array] | None = None,
        duration_s: float | None = None,
        durations: Mapping[int, float] | None = None,
        coalescable: bool = True,
        weight: float = 1.0,
        max_batch_size: int | None = None,
        queue_delay_s: float | None = 0.0,
        inputs: Sequence[TensorSpec] = (X,),
        output_axes: Sequence[int | None] = (0,),
        variants: Iterable[int | None] = (None,),
        variable_axes: Sequence[VariableAxis] = (),
        variant_keys: Mapping[tuple[int, ...], int] | None = None,
        on_drained: Callable[[], None] | None = None,
    ) -> ScheduledModel:
        """A model generation whose programs are recording mock executables.

        ``compute`` maps the first input to the output (default ``x * SCALE``); an input
        holding a negative value makes the execution raise ``RuntimeError("poisoned ...")``.
        """
        if duration_s is not None:
            self.durations[(name, None)] = duration_s
        for size, seconds in (durations or {}).items():
            self.durations[(name, size)] = seconds
        fn_of = compute or (lambda x: x * SCALE)
        programs: dict[ProgramKey, Any] = {}
        for variant in variants:
            for size in sizes:
                module = f"{name}/g{generation}/v{variant}/b{size}".encode()
                self.backend.register(
                    module, self._recording(name, generation, variant, size, fn_of)
                )
                programs[(variant, size)] = self.backend.compile(module, CompileSpec())
        return ScheduledModel(
            name=name,
            generation=generation,
            inputs=tuple(inputs),
            output_axes=tuple(output_axes),
            programs=programs,
            coalescable=coalescable,
            variable_axes=tuple(variable_axes),
            variant_keys=dict(variant_keys or {}),
            weight=weight,
            max_batch_size=max_batch_size,
            queue_delay_ns=None if queue_delay_s is None else round(queue_delay_s * 1e9),
            on_drained=on_drained,
        )

    def add(self, name: str, **kwargs: Any) -> ScheduledModel:
        """:meth:`build` a model generation and install it."""
        model = self.build(name, **kwargs)
        self.scheduler.add_model(model)
        return model

    def _recording(
        self,
        name: str,
        generation: int,
        variant: int | None,
        size: int,
        compute: Callable[[Array], Array],
    ) -> Callable[..., Array]:
        def run(*arrays: Array) -> Array:
            gate = self.gates.get(name)
            if gate is not None and not gate.release.is_set():
                gate.count += 1
                gate.entered.set()
                if not gate.release.wait(WAIT_S):
                    raise RuntimeError("gate never released")
            poisoned = bool(np.any(arrays[0] < 0))
            record = Run(name, generation, variant, size, tuple(a.copy() for a in arrays))
            with self._lock:
                self.runs.append(record if not poisoned else attrs.evolve(record, ok=False))
            self.clock.advance(self.duration(name, size))
            if poisoned:
                raise RuntimeError(f"poisoned input for model '{name}'")
            return compute(arrays[0])

        return run

    def duration(self, name: str, size: int) -> float:
        """Seconds one execution of ``name`` at ``size`` advances the fake clock."""
        return self.durations.get((name, size), self.durations.get((name, None), 0.0))

    def hold(self, name: str) -> Gate:
        """Block ``name``'s executions until ``gate.release`` is set."""
        gate = Gate()
        self.gates[name] = gate
        return gate

    # -- requests --------------------------------------------------------------------------

    def submit(
        self,
        name: str,
        x: Array | None = None,
        *,
        deadline_ns: int | None = None,
        priority: int = 0,
        committed: bool = False,
        completion: FutureCompletion | None = None,
        tensors: Sequence[NamedTensor] | None = None,
    ) -> Request:
        """Queue one request (default input ``row(1)``); admission errors propagate."""
        completion = completion or FutureCompletion()
        if tensors is None:
            tensors = [NamedTensor("x", row(1) if x is None else x)]
        pending = self.scheduler.submit(
            name,
            tensors,
            completion=completion,
            deadline_ns=deadline_ns,
            priority=priority,
            committed=committed,
        )
        return Request(pending, completion)

    def at(self, seconds: float) -> int:
        """An absolute deadline ``seconds`` from the fake now."""
        return self.clock() + round(seconds * 1e9)

    # -- the loop --------------------------------------------------------------------------

    def drain(self, limit: int = 100_000) -> int:
        """Step until idle; the number of turns that did something."""
        turns = 0
        while self.scheduler.step():
            turns += 1
            assert turns < limit, "the scheduler never went idle"
        return turns

    def ran(self) -> list[tuple[str, int]]:
        """``(model, batch)`` of every successful execution, in order."""
        return [(r.model, r.batch) for r in self.runs if r.ok]

    def start(self) -> None:
        """Start the real dispatch thread."""
        self.scheduler.start()
        self.started = True

    def close(self, grace_s: float = 0.0) -> None:
        """Release every gate and stop the scheduler (joins the dispatch thread)."""
        for gate in self.gates.values():
            gate.release.set()
        self.scheduler.stop(grace_s=grace_s)


def variant_axes() -> tuple[TensorSpec, tuple[VariableAxis, ...]]:
    """An input ``x[n, s]`` whose second axis is VARIABLE (variant-key slot 0)."""
    spec = TensorSpec("x", DType.F32, (Batch(), Variable()))
    return spec, (VariableAxis(0, "x", 1, "s", 0),)
