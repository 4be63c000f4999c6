"""The oracle's hands: send one case, judge its status, then prove the worker is still well.

After every case a good inference (checked against the NumPy reference) and two control
requests (``ServerReady``, ``WorkerControl.ModelControlStatus``) must succeed, and the
process must be alive::

    probe = Probe(worker, channel, weights)
    probe.check("datatypes", request, frozenset({INVALID}), "datatype 'INT8'")
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import grpc
import numpy as np
import psutil
from tritonclient.grpc import service_pb2

from reactantserver.core.protocol import control_pb2, control_pb2_grpc
from tests.worker_e2e._bundles import assert_close, mlp_reference
from tests.worker_e2e._harness import WorkerProcess, inference_stub

from ._report import record
from ._requests import LOGITS, MODEL, OK, base_request, x_rows

CLIENT_DEADLINE_S = 20.0
"""Every RPC carries this deadline: a hang shows as a failure, never as a stuck suite."""
HEALTH_ROWS = 3


class Probe:
    """One worker, its stubs, and the checks every fuzz case ends with."""

    def __init__(
        self, worker: WorkerProcess, channel: grpc.Channel, weights: Mapping[str, Any]
    ) -> None:
        assert worker.proc is not None
        self.worker = worker
        self.process = psutil.Process(worker.proc.pid)
        self.stub = inference_stub(channel)
        self.control = control_pb2_grpc.WorkerControlStub(channel)
        self.want = mlp_reference(weights, x_rows(HEALTH_ROWS))

    def rss(self) -> int:
        """The worker's resident set size in bytes."""
        return int(self.process.memory_info().rss)

    def send(self, request: Any) -> tuple[str, str, Any]:
        """``(status name, error message, response or None)`` of one ``ModelInfer``."""
        started = time.monotonic()
        try:
            response = self.stub.ModelInfer(request, timeout=CLIENT_DEADLINE_S)
            answer: tuple[str, str, Any] = (OK, "", response)
        except grpc.RpcError as error:
            answer = (error.code().name, str(error.details() or ""), None)
        elapsed = time.monotonic() - started
        assert elapsed < CLIENT_DEADLINE_S * 0.9, f"no answer in {elapsed:.1f} s: {answer[:2]}"
        return answer

    def check(self, strategy: str, request: Any, expected: frozenset[str], label: str) -> str:
        """Send ``request``; its status must be in ``expected``; then :meth:`assert_healthy`."""
        status, message, response = self.send(request)
        record(strategy, status)
        assert status in expected, (
            f"{label}: got {status} ({message!r}), expected one of {sorted(expected)}"
        )
        if response is None:
            assert message, f"{label}: {status} without a message"
            assert "\n" not in message, f"{label}: multi-line message {message!r}"
        else:
            check_response(response)
        self.assert_healthy(label)
        return status

    def assert_healthy(self, after: str = "") -> None:
        """A good inference, ``ServerReady`` and ``ModelControlStatus`` succeed; process alive."""
        assert self.worker.proc is not None
        code = self.worker.proc.poll()
        assert code is None, f"worker exited {code} after {after}:\n{self.worker.log_tail()}"
        good = self.stub.ModelInfer(base_request(HEALTH_ROWS), timeout=CLIENT_DEADLINE_S)
        assert_close(response_logits(good), self.want)
        ready = self.stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=CLIENT_DEADLINE_S)
        assert ready.ready, f"not ready after {after}"
        status = self.control.ModelControlStatus(
            control_pb2.ModelControlStatusRequest(), timeout=CLIENT_DEADLINE_S
        )
        assert MODEL in {model.name for model in status.models}, after


def response_logits(response: Any) -> np.ndarray[Any, Any]:
    """``logits`` of a raw ``ModelInferResponse`` of :data:`MODEL`."""
    (output,) = response.outputs
    assert (output.name, output.datatype) == ("logits", "FP32")
    data = np.frombuffer(response.raw_output_contents[0], np.float32)
    return data.reshape(list(output.shape))


def check_response(response: Any) -> None:
    """A success is well formed: ``logits [n, 4]`` FP32, raw bytes to match (or in SHM)."""
    assert response.model_name == MODEL, response.model_name
    assert len(response.raw_output_contents) == len(response.outputs)
    for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        assert (output.name, output.datatype) == ("logits", "FP32"), output
        rows, width = output.shape
        assert width == LOGITS, output
        assert rows >= 1, output
        in_shm = "shared_memory_region" in output.parameters
        assert len(raw) == (0 if in_shm else rows * LOGITS * 4), (output, len(raw))
