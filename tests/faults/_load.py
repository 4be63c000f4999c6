"""Continuous client load with exact bookkeeping: every request sent gets one recorded outcome.

    load = Load(url, "mlp", threads=8)
    ...  # inject the fault
    tally = load.finish()
    assert tally.lost == 0 and tally.failed == {}

A request counts as *sent* just before ``infer`` is called and as *answered* when it returns or
raises; ``lost`` is sent minus answered once every thread has stopped, so a request that never
got a terminal answer shows up there. Each OK answer is compared with ``expected``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.worker_e2e._bundles import TOLERANCE
from tests.worker_e2e._harness import infer_input, status_of

CLIENT_TIMEOUT_S = 30.0
"""Deadline of each request: far longer than any failover, never a timing assertion."""


@attrs.frozen
class Tally:
    """What a :class:`Load` saw: requests sent, answered OK, failed (by status), lost."""

    sent: int
    ok: int
    failed: dict[str, int]
    wrong: int
    """OK answers whose numbers differ from the reference."""

    @property
    def lost(self) -> int:
        """Requests sent that never got a terminal answer."""
        return self.sent - self.ok - sum(self.failed.values())

    def __str__(self) -> str:
        return (
            f"sent={self.sent} ok={self.ok} failed={dict(self.failed)} "
            f"wrong={self.wrong} lost={self.lost}"
        )


class Load:
    """``threads`` clients each sending ``model`` requests back to back until :meth:`finish`."""

    def __init__(
        self,
        url: str,
        model: str,
        x: np.ndarray[Any, Any],
        expected: np.ndarray[Any, Any],
        *,
        threads: int = 8,
        output: str = "logits",
    ) -> None:
        self.url = url
        self.model = model
        self.x = x
        self.expected = expected
        self.output = output
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sent = 0
        self._ok = 0
        self._wrong = 0
        self._failed: Counter[str] = Counter()
        self._pool = ThreadPoolExecutor(threads)
        self._futures = [self._pool.submit(self._run) for _ in range(threads)]

    def _run(self) -> None:
        with grpcclient.InferenceServerClient(self.url) as client:
            while not self._stop.is_set():
                with self._lock:
                    self._sent += 1
                try:
                    result = client.infer(
                        self.model,
                        [infer_input("x", self.x, "FP32")],
                        client_timeout=CLIENT_TIMEOUT_S,
                    )
                except InferenceServerException as error:
                    with self._lock:
                        self._failed[status_of(error)] += 1
                    continue
                good = np.allclose(
                    result.as_numpy(self.output), self.expected, rtol=TOLERANCE, atol=TOLERANCE
                )
                with self._lock:
                    self._ok += 1
                    self._wrong += not good

    def answered(self) -> int:
        """Requests answered so far (OK or not)."""
        with self._lock:
            return self._ok + sum(self._failed.values())

    def wait_more(self, count: int, wait: Callable[[Callable[[], bool], str], None]) -> None:
        """Block (through ``wait``, e.g. ``wait_for``) until ``count`` more answers arrived."""
        target = self.answered() + count
        wait(lambda: self.answered() >= target, f"{count} more {self.model} answers")

    def finish(self) -> Tally:
        """Stop every thread (each finishes its current request) and count."""
        self._stop.set()
        for future in self._futures:
            future.result(timeout=2 * CLIENT_TIMEOUT_S)
        self._pool.shutdown()
        return self.tally()

    def tally(self) -> Tally:
        """The counts so far."""
        with self._lock:
            return Tally(self._sent, self._ok, dict(self._failed), self._wrong)
