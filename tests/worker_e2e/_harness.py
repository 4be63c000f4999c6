"""The worker end-to-end harness: a real ``reactantserver-worker`` process and client helpers.

Everything here drives the worker from outside, as an operator and a stock client would: the
worker runs as ``python -m reactantserver.worker --model-repository REPO`` with its ports set
through the environment, and requests go through ``tritonclient.grpc`` (or its generated stubs for
requests the high-level client refuses to build).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from ._bundles import ROOT, SPIN, SPIN_ITERATIONS

STARTUP_TIMEOUT_S = 120.0
"""Generous: the first start compiles every (variant x batch size) module on the CPU."""
STOP_TIMEOUT_S = 20.0
"""SIGTERM, then this long for the process to exit before it is killed."""
WAIT_S = 30.0
"""Upper bound for anything the suite waits on (callbacks, metrics); never a timing assertion."""
MAX_MESSAGE_BYTES = 512 * 1024 * 1024


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes] | None) -> int | None:
    """SIGTERM, wait, then SIGKILL; the exit status (``None`` if never started)."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)
    return proc.returncode


class WorkerProcess:
    """One ``reactantserver-worker`` subprocess with its own ports and a captured log."""

    def __init__(
        self,
        repo: Path,
        log: Path,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        self.repo = repo
        self.args = tuple(args)
        self.log = log
        self.grpc_port = free_port()
        self.http_port = free_port()
        while self.http_port == self.grpc_port:
            self.http_port = free_port()
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``host:port`` of the gRPC listener, as tritonclient wants it."""
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> None:
        """Spawn the process (returns at once; see :meth:`wait_ready`)."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("REACTANTSERVER_WORKER_", "INFERENCE_SERVER_"))
        }
        env.update(
            {
                "REACTANTSERVER_WORKER_ENDPOINTS_PORT": str(self.grpc_port),
                "REACTANTSERVER_WORKER_ENDPOINTS_METRICS_PORT": str(self.http_port),
                # REST shares the metrics port (one HTTP port, as the tests address it).
                "REACTANTSERVER_WORKER_ENDPOINTS_HTTP_PORT": "0",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.env)
        command = [
            sys.executable,
            "-m",
            "reactantserver.worker",
            "--model-repository",
            str(self.repo),
            *self.args,
        ]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        STARTED.append(self)

    def wait_ready(self, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Poll ``ServerReady`` until true; fail with the log if the process dies or hangs."""
        assert self.proc is not None
        wait_server_ready(self.url, self.proc, self.log_tail, timeout_s, "worker")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` to the process."""
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float) -> int:
        """The exit status, waiting at most ``timeout_s`` (raises ``TimeoutExpired``)."""
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def stop(self) -> int | None:
        """SIGTERM, wait, then SIGKILL; returns the exit status (``None`` if never started)."""
        return stop_process(self.proc)

    def log_tail(self, nchars: int = 12000) -> str:
        """The end of the worker's stdout + stderr."""
        if not self.log.exists():
            return "(no log)"
        text = self.log.read_text(errors="replace")
        return text[-nchars:]

    # -- the HTTP port ---------------------------------------------------------------------

    def http_get(self, path: str) -> tuple[int, str, str]:
        """``(status, content type, body)`` of ``GET path`` on the HTTP port."""
        url = f"http://127.0.0.1:{self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = response.read().decode()
                return response.status, response.headers.get("Content-Type", ""), body
        except urllib.error.HTTPError as error:
            with error:
                body = error.read().decode()
                return error.code, error.headers.get("Content-Type", ""), body

    def metric(self, name: str, **labels: str) -> float:
        """Σ of the samples called ``name`` whose labels include ``labels`` (0 when none)."""
        status, _, text = self.http_get("/metrics")
        assert status == 200
        return sum_samples(text, name, **labels)


STARTED: list[WorkerProcess] = []
"""Every worker started by this test session (their logs are attached to failures)."""


def worker_logs(nchars: int) -> list[tuple[str, str]]:
    """``(title, log tail)`` of every worker this session started, for a failing report."""
    return [(f"worker log {worker.log.name}", worker.log_tail(nchars)) for worker in STARTED]


def wait_server_ready(
    url: str,
    proc: subprocess.Popen[bytes],
    tail: Callable[[], str],
    timeout_s: float,
    what: str,
    *,
    poll_s: float = 0.2,
) -> None:
    """Poll ``ServerReady`` at ``url`` until true; fail with ``tail()`` if ``proc`` exits or hangs.

    ``what`` names the process in the failure (``worker``, ``gateway``, ``node``).
    """
    stop_at = time.monotonic() + timeout_s
    with grpcclient.InferenceServerClient(url) as client:
        while True:
            code = proc.poll()
            if code is not None:
                raise AssertionError(f"{what} exited with {code} during start-up:\n{tail()}")
            with contextlib.suppress(InferenceServerException):
                if client.is_server_ready(client_timeout=2.0):
                    return
            if time.monotonic() > stop_at:
                raise AssertionError(f"{what} not ready after {timeout_s} s:\n{tail()}")
            time.sleep(poll_s)


@contextlib.contextmanager
def running_worker(
    repo: Path, log: Path, env: Mapping[str, str] | None = None, args: Sequence[str] = ()
) -> Iterator[WorkerProcess]:
    """A ready worker on ``repo`` (``args``: extra flags); on exit it is stopped and must have
    exited with 0."""
    process = WorkerProcess(repo, log, env, args)
    process.start()
    try:
        process.wait_ready()
        yield process
    finally:
        code = process.stop()
    assert code == 0, f"the worker exited with {code}:\n{process.log_tail()}"


def sum_samples(text: str, name: str, **labels: str) -> float:
    """Σ of the samples called ``name`` in a Prometheus exposition whose labels match."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != name:
                continue
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``condition`` until true (bounded by ``timeout_s``, which is not an assertion)."""
    stop_at = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > stop_at:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# -- gRPC helpers -------------------------------------------------------------------------------


CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


@contextlib.contextmanager
def open_channel(url: str) -> Iterator[grpc.Channel]:
    """A plain insecure channel (closed on exit)."""
    channel = grpc.insecure_channel(url, options=CHANNEL_OPTIONS)
    try:
        yield channel
    finally:
        channel.close()


def inference_stub(channel: grpc.Channel) -> Any:
    """tritonclient's own generated stub of ``inference.GRPCInferenceService``."""
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


def infer_input(name: str, array: np.ndarray[Any, Any], datatype: str) -> Any:
    """A tritonclient ``InferInput`` carrying ``array`` as raw bytes."""
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def raw_request(
    model: str,
    tensors: Sequence[tuple[str, str, Sequence[int], bytes | None]],
    *,
    outputs: Sequence[str] = (),
    request_id: str = "",
    version: str = "",
) -> Any:
    """A hand-built ``ModelInferRequest``: per input ``(name, datatype, shape, raw or None)``.

    Inputs with ``None`` get no raw entry (set typed contents or SHM parameters afterwards).
    """
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, datatype, shape, raw in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=list(shape))
        if raw is not None:
            request.raw_input_contents.append(raw)
    for name in outputs:
        request.outputs.add(name=name)
    return request


def rows(n: int, features: int, seed: int, dtype: Any = np.float32) -> np.ndarray[Any, Any]:
    """Deterministic test data ``[n, features]``."""
    return np.random.default_rng(seed).standard_normal((n, features)).astype(dtype)


def response_array(response: Any, index: int) -> np.ndarray[Any, Any]:
    """Output ``index`` of a raw ``ModelInferResponse`` as a NumPy array (FP32/INT64 only)."""
    output = response.outputs[index]
    dtype = {"FP32": np.float32, "INT64": np.int64}[output.datatype]
    return np.frombuffer(response.raw_output_contents[index], dtype).reshape(list(output.shape))


def spin_input(iterations: float = SPIN_ITERATIONS) -> Any:
    """The input of one :data:`SPIN` request that loops ``iterations`` times."""
    x = np.zeros((1, 16), np.float32)
    x[0, 0] = iterations
    return infer_input("x", x, "FP32")


class Answers:
    """Collects ``async_infer`` answers by key: ``{key: (error, result)}``."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.answers: dict[str, tuple[Any, Any]] = {}
        self._lock = threading.Lock()
        self._all = threading.Event()

    def callback(self, key: str) -> Callable[..., None]:
        """The ``callback`` argument of one ``async_infer``."""

        def done(result: Any, error: Any) -> None:
            with self._lock:
                self.answers[key] = (error, result)
                if len(self.answers) == self.expected:
                    self._all.set()

        return done

    def wait(self) -> dict[str, tuple[Any, Any]]:
        """Every answer (bounded by :data:`WAIT_S`)."""
        assert self._all.wait(WAIT_S), f"{len(self.answers)} of {self.expected} answered"
        return self.answers


@contextlib.contextmanager
def dispatch_held(client: Any, worker: WorkerProcess, already_in_flight: int = 0) -> Iterator[None]:
    """While inside, the dispatch thread runs a long :data:`SPIN` execution.

    Two spin requests go out: a long one and a one-iteration one. The short one is sent only
    once the long one has left the queue for an execution (the model's statistics count queue
    waits when a dispatch takes its requests), so the two are never coalesced into one batch,
    however fast the server turns. Once two requests more than ``already_in_flight`` are in
    flight and one is queued, the long one is executing, so anything sent inside the block
    queues behind it. On exit both spin requests must succeed.
    """
    spins = Answers(2)
    taken = queue_waits(client, SPIN)
    client.async_infer(SPIN, [spin_input()], spins.callback("long"))
    wait_for(lambda: queue_waits(client, SPIN) > taken, "the long spin request dispatched")
    client.async_infer(SPIN, [spin_input(1)], spins.callback("short"))
    wait_for(
        lambda: (
            worker.metric("reactantserver_worker_inflight_requests") == already_in_flight + 2
            and worker.metric("reactantserver_worker_queue_depth", model=SPIN) == 1
        ),
        "a spin request executing and another queued",
    )
    yield
    for key, (error, result) in spins.wait().items():
        assert error is None, (key, error)
        assert result.as_numpy("y").shape == (1, 16)


def queue_waits(client: Any, model: str) -> int:
    """How many of ``model``'s requests have left its queue for an execution."""
    stats = client.get_inference_statistics(model_name=model)
    return int(stats.model_stats[0].inference_stats.queue.count)


def failure(call: Callable[..., Any], *args: Any, **kwargs: Any) -> InferenceServerException:
    """The error ``call(*args, **kwargs)`` raises (it must raise one)."""
    with pytest.raises(InferenceServerException) as caught:
        call(*args, **kwargs)
    return caught.value


def status_of(error: BaseException) -> str:
    """The gRPC status name of a tritonclient error or a ``grpc.RpcError``."""
    if isinstance(error, grpc.RpcError):
        code = error.code()
        return str(code.name)
    if isinstance(error, InferenceServerException):
        return str(error.status() or "").removeprefix("StatusCode.")
    raise AssertionError(f"not a gRPC error: {error!r}")


def message_of(error: BaseException) -> str:
    """The server's error text."""
    if isinstance(error, grpc.RpcError):
        return str(error.details() or "")
    if isinstance(error, InferenceServerException):
        return str(error.message() or "")
    raise AssertionError(f"not a gRPC error: {error!r}")


def model_stats(client: Any, model: str) -> Any:
    """The ``ModelStatistics`` entry of ``model`` (one visible model, version "1")."""
    response = client.get_inference_statistics(model_name=model)
    (entry,) = response.model_stats
    return entry
