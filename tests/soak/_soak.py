"""The soak driver: mixed traffic from 32 stock ``tritonclient.grpc`` clients, and a probe.

Traffic is a fixed list of :class:`Case` requests over the shipped examples, sent round-robin
by a shared ticket counter so that every model is interleaved with every other. Each client
thread owns one ``InferenceServerClient`` and sends one request at a time in its
:class:`Mode`: plain ``infer``, ``async_infer`` (waited on), or system shared memory in and out
through regions it creates, registers, unregisters and unlinks every :data:`SHM_CYCLE`
requests. Every answer is compared with the answer the same case got when sent alone.

:func:`snapshot` reads what the worker holds from outside (``psutil`` and ``/proc``): RSS,
threads, file descriptors and its ``/dev/shm`` mappings.
"""

from __future__ import annotations

import enum
import itertools
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from tests.worker_e2e._bundles import TOLERANCE
from tests.worker_e2e._harness import infer_input

CONCURRENCY = 32
"""Client threads, each with one request in flight."""
SHM_CYCLE = 25
"""Requests a shared-memory thread sends through one pair of regions before replacing it."""
REGION_BYTES = 32 * 1024
"""Input region size: the largest case (``cnn``, 4 images) needs 12.5 KiB."""
OUT_REGION_BYTES = 4 * 1024
ALIGN = 64
"""Offsets of tensors inside a region."""
REQUEST_TIMEOUT_S = 60.0
"""Client deadline of one request: a hang fails the soak instead of stalling it."""
MAX_ERRORS = 20
"""The soak stops early after this many errors (they are all reported)."""
SHM_DIR = Path("/dev/shm")

Tensor = tuple[str, np.ndarray[Any, Any], str]
Answer = dict[str, np.ndarray[Any, Any]]


class Mode(enum.Enum):
    """How a client thread sends its requests."""

    SYNC = "sync"
    ASYNC = "async"
    SHM = "shm"


def mode_of(thread: int) -> Mode:
    """Half the threads plain ``infer``, a quarter ``async_infer``, a quarter shared memory."""
    return (Mode.SYNC, Mode.ASYNC, Mode.SYNC, Mode.SHM)[thread % 4]


@dataclass(frozen=True)
class Case:
    """One request: the model, its inputs and the outputs asked for."""

    model: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[str, ...]
    fixed_outputs: bool = True
    """Output shapes known in advance (shared memory outputs); a meta's depend on the data."""


def build_cases() -> list[Case]:
    """The traffic mix: every example at a few row counts (13 cases)."""
    rng = np.random.default_rng(1414)

    def f32(*shape: int) -> np.ndarray[Any, Any]:
        return rng.standard_normal(shape).astype(np.float32)

    cases: list[Case] = []
    for n in (1, 3, 8):
        cases.append(Case("mlp", (("x", f32(n, 16), "FP32"),), ("logits",)))
    for n in (1, 4):
        cases.append(Case("cnn", (("image", f32(n, 1, 28, 28), "FP32"),), ("logits",)))
    for n in (1, 5):
        inputs = (("a", f32(n, 8), "FP32"), ("b", f32(n, 8), "FP32"))
        cases.append(Case("two_io", inputs, ("sum", "dot")))
    for n in (1, 2):
        image = rng.integers(0, 256, (n, 28, 28, 3), dtype=np.uint8)
        cases.append(Case("classifier_hooks", (("image", image, "UINT8"),), ("indices", "scores")))
    for n in (1, 5, 32):
        items = (("items", f32(n, 16), "FP32"),)
        cases.append(Case("pipeline", items, ("scores", "indices"), fixed_outputs=False))
    return cases


def _plain_inputs(case: Case) -> list[Any]:
    return [infer_input(name, array, datatype) for name, array, datatype in case.inputs]


def _requested(case: Case) -> list[Any]:
    return [grpcclient.InferRequestedOutput(name) for name in case.outputs]


def infer_plain(client: Any, case: Case) -> Answer:
    """``case`` through ``client.infer`` with its tensors in the message."""
    result = client.infer(
        case.model,
        _plain_inputs(case),
        outputs=_requested(case),
        client_timeout=REQUEST_TIMEOUT_S,
    )
    return {name: result.as_numpy(name) for name in case.outputs}


def infer_async(client: Any, case: Case) -> Answer:
    """``case`` through ``client.async_infer``, waiting for its callback."""
    done = threading.Event()
    box: list[tuple[Any, Any]] = []

    def callback(result: Any, error: Any) -> None:
        box.append((result, error))
        done.set()

    client.async_infer(
        case.model,
        _plain_inputs(case),
        callback,
        outputs=_requested(case),
        client_timeout=REQUEST_TIMEOUT_S,
    )
    if not done.wait(REQUEST_TIMEOUT_S + 5.0):
        raise TimeoutError(f"no callback for {case.model} in {REQUEST_TIMEOUT_S} s")
    result, error = box[0]
    if error is not None:
        raise error
    return {name: result.as_numpy(name) for name in case.outputs}


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class ShmLane:
    """One thread's pair of system shared memory regions, replaced every :data:`SHM_CYCLE`."""

    def __init__(self, client: Any, tag: str) -> None:
        self.client = client
        self.tag = tag
        self.cycles = 0
        self.uses = 0
        self.handles: tuple[Any, Any] | None = None

    def _name(self, side: str) -> str:
        return f"{self.tag}_{self.cycles}_{side}"

    def open(self) -> None:
        """Create, register and remember a fresh pair of regions."""
        self.cycles += 1
        self.uses = 0
        sizes = {"in": REGION_BYTES, "out": OUT_REGION_BYTES}
        handles = []
        for side, size in sizes.items():
            name = self._name(side)
            handle = shm.create_shared_memory_region(name, f"/{name}", size, create_only=True)
            handles.append(handle)
            self.client.register_system_shared_memory(name, f"/{name}", size)
        self.handles = (handles[0], handles[1])

    def close(self) -> None:
        """Unregister both regions by name, then unmap and unlink them."""
        if self.handles is None:
            return
        for side in ("in", "out"):
            self.client.unregister_system_shared_memory(self._name(side))
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)
        self.handles = None

    def infer(self, case: Case, expected: Answer) -> Answer:
        """``case`` with every input, and fixed-shape outputs, in the lane's regions."""
        if self.handles is None or self.uses >= SHM_CYCLE:
            self.close()
            self.open()
        assert self.handles is not None
        self.uses += 1
        handle_in, handle_out = self.handles
        inputs, offset = [], 0
        for name, array, datatype in case.inputs:
            shm.set_shared_memory_region(handle_in, [array], offset=offset)
            tensor = grpcclient.InferInput(name, list(array.shape), datatype)
            tensor.set_shared_memory(self._name("in"), array.nbytes, offset=offset)
            inputs.append(tensor)
            offset += _aligned(array.nbytes)
        outputs, places, offset = [], {}, 0
        for name in case.outputs:
            output = grpcclient.InferRequestedOutput(name)
            if case.fixed_outputs:
                want = expected[name]
                output.set_shared_memory(self._name("out"), want.nbytes, offset=offset)
                places[name] = offset
                offset += _aligned(want.nbytes)
            outputs.append(output)
        result = self.client.infer(
            case.model, inputs, outputs=outputs, client_timeout=REQUEST_TIMEOUT_S
        )
        answer: Answer = {}
        for name in case.outputs:
            if name not in places:
                answer[name] = result.as_numpy(name)
                continue
            want = expected[name]
            view = shm.get_contents_as_numpy(handle_out, want.dtype, want.shape, places[name])
            answer[name] = np.array(view)  # a copy: the region must close with no view on it
            del view
        return answer


def compare(case: Case, got: Answer, want: Answer) -> str | None:
    """``None`` when ``got`` matches ``want`` (f32 noise only), else what differs."""
    for name in case.outputs:
        actual, desired = got.get(name), want[name]
        if actual is None or actual.shape != desired.shape or actual.dtype != desired.dtype:
            shape = None if actual is None else (actual.shape, actual.dtype)
            return f"{name}: got {shape}, want {(desired.shape, desired.dtype)}"
        if not np.allclose(actual, desired, rtol=TOLERANCE, atol=TOLERANCE):
            return f"{name}: values differ from the request sent alone"
    return None


def reference_answers(url: str, cases: Sequence[Case]) -> list[Answer]:
    """Each case sent alone, one after another: what the soak's answers must match."""
    with grpcclient.InferenceServerClient(url) as client:
        return [infer_plain(client, case) for case in cases]


@dataclass
class Traffic:
    """The client side of the soak: cases, their reference answers, and what went wrong."""

    url: str
    cases: list[Case]
    expected: list[Answer]
    errors: list[str] = field(default_factory=list)
    sent: Counter[str] = field(default_factory=Counter)
    shm_cycles: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self, total: int, phase: str) -> float:
        """Send ``total`` requests from :data:`CONCURRENCY` threads; the wall time in seconds."""
        tickets = itertools.count()
        threads = [
            threading.Thread(
                target=self._client, args=(index, tickets, total, phase), name=f"soak-{index}"
            )
            for index in range(CONCURRENCY)
        ]
        start = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.monotonic() - start

    def _next(self, tickets: itertools.count[int], total: int) -> int | None:
        with self._lock:
            ticket = next(tickets)
        if ticket >= total or self._stop.is_set():
            return None
        return ticket

    def _fail(self, text: str) -> None:
        with self._lock:
            self.errors.append(text)
            if len(self.errors) >= MAX_ERRORS:
                self._stop.set()

    def _client(self, index: int, tickets: itertools.count[int], total: int, phase: str) -> None:
        mode = mode_of(index)
        sent: Counter[str] = Counter()
        try:
            with grpcclient.InferenceServerClient(self.url) as client:
                lane = ShmLane(client, f"rs_soak_{os.getpid()}_{phase}_{index}")
                try:
                    while (ticket := self._next(tickets, total)) is not None:
                        case_index = ticket % len(self.cases)
                        case, want = self.cases[case_index], self.expected[case_index]
                        try:
                            if mode is Mode.SHM:
                                got = lane.infer(case, want)
                            elif mode is Mode.ASYNC:
                                got = infer_async(client, case)
                            else:
                                got = infer_plain(client, case)
                        except Exception as error:  # every failure is reported
                            self._fail(f"{mode.value} {case.model} #{ticket}: {error!r}")
                            continue
                        sent[f"{case.model}/{mode.value}"] += 1
                        if (problem := compare(case, got, want)) is not None:
                            self._fail(f"{mode.value} {case.model} #{ticket}: {problem}")
                finally:
                    lane.close()
        except Exception as error:  # a client that breaks is an error too
            self._fail(f"{mode.value} client {index}: {error!r}")
        with self._lock:
            self.sent.update(sent)
            self.shm_cycles += lane.cycles


@dataclass(frozen=True)
class Snapshot:
    """What the worker process holds, read from outside."""

    rss: int
    threads: int
    fds: int
    shm_maps: frozenset[str]
    """``/dev/shm`` files the worker has mapped (``/proc/PID/maps``)."""
    shm_fds: frozenset[str]
    """``/dev/shm`` files the worker has open."""
    dev_shm: frozenset[str]
    """The whole ``/dev/shm`` listing (other processes' files included)."""


def snapshot(pid: int) -> Snapshot:
    """The worker's RSS, thread and descriptor counts, and its ``/dev/shm`` holdings."""
    process = psutil.Process(pid)
    maps = set()
    with open(f"/proc/{pid}/maps") as lines:
        for line in lines:
            parts = line.split(maxsplit=5)  # address perms offset device inode [path]
            path = parts[5].strip() if len(parts) == 6 else ""
            if path.startswith(f"{SHM_DIR}/"):
                maps.add(path.removesuffix(" (deleted)"))
    fds = set()
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(entry)
        except OSError:  # closed between the listing and the read
            continue
        if target.startswith(f"{SHM_DIR}/"):
            fds.add(target)
    return Snapshot(
        rss=process.memory_info().rss,
        threads=process.num_threads(),
        fds=process.num_fds(),
        shm_maps=frozenset(maps),
        shm_fds=frozenset(fds),
        dev_shm=frozenset(os.listdir(SHM_DIR)),
    )
