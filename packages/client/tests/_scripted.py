"""A real in-process gRPC inference server whose behaviour each test scripts and inspects.

The server listens on ``127.0.0.1:<free port>``, serves the Triton paths through
``inference_service_handler`` and keeps its shared memory in a real
``SharedMemoryRegistry``, so the client's SHM traffic is checked end to end. ``ModelInfer``
echoes every input ``x`` as output ``x_out`` (honouring requested outputs and SHM outputs)::

    with scripted_server() as server:
        server.answer_probe(grpc.StatusCode.UNIMPLEMENTED)
        server.fail_infer(grpc.StatusCode.RESOURCE_EXHAUSTED, times=2)
        ...                                   # talk to server.url with the client
        assert server.count("ModelInfer") == 3
        assert server.infers[-1].shm_inputs   # sent by reference
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import glob
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeAlias

import attrs
import grpc
import numpy as np
import numpy.typing as npt

from reactantserver.client import (
    InferInput,
    InferOutput,
    KServeModel,
    OutputSpec,
    StagingPool,
    StagingSlot,
    infer_async,
    infer_sync,
    shutdown,
)
from reactantserver.core import codec
from reactantserver.core.errors import status_of
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.protocol import grpc_service_pb2 as pb
from reactantserver.core.protocol import inference_service_handler
from reactantserver.core.shm import SharedMemoryRegistry
from reactantserver.core.types import InferResponse

__all__ = [
    "KINDS",
    "MAX_MESSAGE_BYTES",
    "EchoIO",
    "InferCall",
    "Pools",
    "ScriptedServer",
    "ShmEvent",
    "check_echo",
    "client_session",
    "code_of",
    "echo_from_slot",
    "pid_shm_files",
    "rows",
    "run_infer",
    "scripted_server",
    "slot_inputs",
    "wait_for",
]

KINDS = ("sync", "async")
"""The two drivers every behaviour is checked through (``run_infer``'s ``kind``)."""
MAX_MESSAGE_BYTES = 64 << 20
"""Receive limit the server decodes requests with."""
_GATHER_TIMEOUT_S = 10.0

ProbeAnswer: TypeAlias = "bool | grpc.StatusCode | None"
"""``True``/``False`` as the answer, a status to fail with, ``None``: ask the registry."""


@attrs.frozen
class InferCall:
    """What one ``ModelInfer`` call carried, and how the server answered it."""

    model_name: str
    request_id: str
    timeout: float | None
    """``context.time_remaining()`` when the call arrived (the client's gRPC timeout)."""
    reactant_timeout_ns: int | None
    raw_inputs: int
    """How many ``raw_input_contents`` entries (inline inputs) the request had."""
    shm_inputs: tuple[tuple[str, str], ...]
    """``(input name, region)`` of every input sent by reference."""
    outputs: tuple[str, ...]
    shm_outputs: tuple[tuple[str, str], ...]
    """``(output name, region)`` of every output requested into shared memory."""
    status: grpc.StatusCode
    details: str = ""


@attrs.frozen
class ShmEvent:
    """One shared-memory call: ``register``/``unregister``, the name, and what was asked."""

    kind: str
    name: str
    key: str = ""
    offset: int = 0
    byte_size: int = 0
    status: grpc.StatusCode = grpc.StatusCode.OK


class ScriptedServer:
    """The server; start it with :func:`scripted_server` (a context manager)."""

    def __init__(self, *, workers: int = 32) -> None:
        self.registry = SharedMemoryRegistry()
        self._lock = threading.Lock()
        self._calls: collections.Counter[str] = collections.Counter()
        self._infers: list[InferCall] = []
        self._shm: list[ShmEvent] = []
        self._probe: ProbeAnswer = None
        self._probe_hang = 0.0
        self._failures: collections.deque[tuple[grpc.StatusCode, str]] = collections.deque()
        self._refuse: grpc.StatusCode | None = None
        self._gate: threading.Barrier | None = None
        self._gate_left = 0
        self._release = threading.Event()
        self.probe_hanging = threading.Event()
        """Set when a probe starts hanging (see :meth:`hang_probe`)."""
        self._executor = ThreadPoolExecutor(max_workers=workers)
        self._server = grpc.server(self._executor)
        behaviours: dict[str, Callable[[Any, Any], Any]] = {
            "ModelMetadata": self._metadata,
            "ModelInfer": self._infer,
            "SystemSharedMemoryRegister": self._register,
            "SystemSharedMemoryUnregister": self._unregister,
            "SystemSharedMemoryStatus": self._status,
            "IsSameIPCNamespace": self._same_namespace,
        }
        self._server.add_generic_rpc_handlers([inference_service_handler(behaviours)])
        self.port: int = self._server.add_insecure_port("127.0.0.1:0")
        self.url = f"grpc://127.0.0.1:{self.port}"

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start serving."""
        self._server.start()

    def close(self) -> None:
        """Stop serving: end hanging probes, cancel calls, drop every registration."""
        self._release.set()
        self._server.stop(grace=None).wait()
        self._executor.shutdown(wait=True)
        self.registry.close()

    # -- scripting --------------------------------------------------------------------------

    def answer_probe(self, answer: ProbeAnswer) -> None:
        """What ``IsSameIPCNamespace`` answers from now on (``None``: the registry's answer)."""
        with self._lock:
            self._probe = answer

    def hang_probe(self, seconds: float) -> None:
        """Make every later probe wait ``seconds`` (or until :meth:`close`) before answering."""
        with self._lock:
            self._probe_hang = seconds

    def fail_infer(
        self, code: grpc.StatusCode, *, times: int = 1, details: str | Iterator[str] = ""
    ) -> None:
        """Fail the next ``times`` ``ModelInfer`` calls with ``code`` (and ``details`` text)."""
        texts = details if not isinstance(details, str) else iter([details] * times)
        with self._lock:
            for _ in range(times):
                self._failures.append((code, next(texts)))

    def gather_infer(self, n: int) -> None:
        """Answer none of the next ``n`` ``ModelInfer`` calls before all ``n`` are processed.

        So ``n`` concurrent requests all see the server in the same state (say, a forgotten
        region) before any client can react to an answer.
        """
        with self._lock:
            self._gate = threading.Barrier(n)
            self._gate_left = n

    def forget(self) -> None:
        """Drop every registration, as a restarted server would."""
        self.registry.unregister("")

    def refuse_registrations(self, code: grpc.StatusCode | None) -> None:
        """Fail every later ``SystemSharedMemoryRegister`` with ``code`` (``None``: accept)."""
        with self._lock:
            self._refuse = code

    # -- records ----------------------------------------------------------------------------

    def count(self, method: str) -> int:
        """How many calls of ``method`` (``"ModelInfer"``, ...) arrived so far."""
        with self._lock:
            return self._calls[method]

    @property
    def infers(self) -> list[InferCall]:
        """Every ``ModelInfer`` call answered so far, in the order they were answered."""
        with self._lock:
            return list(self._infers)

    @property
    def shm_events(self) -> list[ShmEvent]:
        """Every register/unregister call so far, in arrival order."""
        with self._lock:
            return list(self._shm)

    def registrations(self, name: str) -> int:
        """How many accepted ``SystemSharedMemoryRegister`` calls named ``name``."""
        return sum(
            1
            for e in self.shm_events
            if e.kind == "register" and e.name == name and e.status is grpc.StatusCode.OK
        )

    # -- behaviours -------------------------------------------------------------------------

    def _arrived(self, method: str) -> None:
        with self._lock:
            self._calls[method] += 1

    def _metadata(self, request: pb.ModelMetadataRequest, context: Any) -> Any:
        self._arrived("ModelMetadata")
        reply = pb.ModelMetadataResponse(name=request.name, platform="scripted", versions=["1"])
        reply.inputs.add(name="x", datatype="FP32", shape=[-1, 4])
        reply.outputs.add(name="x_out", datatype="FP32", shape=[-1, 4])
        return reply

    def _infer(self, request: pb.ModelInferRequest, context: Any) -> Any:
        timeout = context.time_remaining()
        with self._lock:
            self._calls["ModelInfer"] += 1
            failure = self._failures.popleft() if self._failures else None
            gate = None
            if self._gate is not None and self._gate_left > 0:
                gate, self._gate_left = self._gate, self._gate_left - 1
        status, details, reply = grpc.StatusCode.OK, "", None
        if failure is not None:
            status, details = failure
        else:
            try:
                decoded = codec.decode_request(
                    request,
                    registry=self.registry,
                    max_recv_msg_bytes=MAX_MESSAGE_BYTES,
                    grpc_time_remaining=timeout,
                )
                try:
                    echo = InferResponse(
                        model_name=decoded.model_name,
                        id=decoded.id,
                        outputs=[NamedTensor(f"{t.name}_out", t.data) for t in decoded.inputs],
                    )
                    reply = codec.encode_response(
                        echo, requested=decoded.outputs, registry=self.registry
                    )
                finally:
                    decoded.release()
            except Exception as error:
                status, details = status_of(error), str(error)
        self._record(request, timeout, status, details)
        if gate is not None:
            gate.wait(_GATHER_TIMEOUT_S)
        if reply is None:
            context.abort(status, details)
        return reply

    def _record(
        self,
        request: pb.ModelInferRequest,
        timeout: float | None,
        status: grpc.StatusCode,
        details: str,
    ) -> None:
        params = request.parameters
        call = InferCall(
            model_name=request.model_name,
            request_id=request.id,
            timeout=timeout,
            reactant_timeout_ns=(
                params["reactant_timeout_ns"].int64_param
                if "reactant_timeout_ns" in params
                else None
            ),
            raw_inputs=len(request.raw_input_contents),
            shm_inputs=tuple(
                (t.name, t.parameters[codec.SHM_REGION].string_param)
                for t in request.inputs
                if codec.SHM_REGION in t.parameters
            ),
            outputs=tuple(o.name for o in request.outputs),
            shm_outputs=tuple(
                (o.name, o.parameters[codec.SHM_REGION].string_param)
                for o in request.outputs
                if codec.SHM_REGION in o.parameters
            ),
            status=status,
            details=details,
        )
        with self._lock:
            self._infers.append(call)

    def _register(self, request: pb.SystemSharedMemoryRegisterRequest, context: Any) -> Any:
        self._arrived("SystemSharedMemoryRegister")
        with self._lock:
            status, details = self._refuse, "registrations are refused (scripted)"
        if status is None:
            try:
                self.registry.register(request.name, request.key, request.offset, request.byte_size)
                status = grpc.StatusCode.OK
            except Exception as error:
                status, details = status_of(error), str(error)
        event = ShmEvent(
            "register", request.name, request.key, request.offset, request.byte_size, status
        )
        with self._lock:
            self._shm.append(event)
        if status is not grpc.StatusCode.OK:
            context.abort(status, details)
        return pb.SystemSharedMemoryRegisterResponse()

    def _unregister(self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any) -> Any:
        self._arrived("SystemSharedMemoryUnregister")
        self.registry.unregister(request.name)
        with self._lock:
            self._shm.append(ShmEvent("unregister", request.name))
        return pb.SystemSharedMemoryUnregisterResponse()

    def _status(self, request: pb.SystemSharedMemoryStatusRequest, context: Any) -> Any:
        self._arrived("SystemSharedMemoryStatus")
        reply = pb.SystemSharedMemoryStatusResponse()
        for name, region in self.registry.status(request.name).items():
            entry = reply.regions[name]
            entry.name, entry.key = region.name, region.key
            entry.offset, entry.byte_size = region.offset, region.byte_size
        return reply

    def _same_namespace(self, request: pb.IsSameIPCNamespaceRequest, context: Any) -> Any:
        self._arrived("IsSameIPCNamespace")
        with self._lock:
            answer, hang = self._probe, self._probe_hang
        if hang > 0:
            self.probe_hanging.set()
            self._release.wait(hang)
        if isinstance(answer, grpc.StatusCode):
            context.abort(answer, f"probe fails with {answer.name} (scripted)")
        same = self.registry.is_same_namespace(request.name) if answer is None else answer
        return pb.IsSameIPCNamespaceResponse(same=same)


@contextlib.contextmanager
def scripted_server(*, workers: int = 32) -> Iterator[ScriptedServer]:
    """A started :class:`ScriptedServer` on a free port, stopped on exit."""
    server = ScriptedServer(workers=workers)
    server.start()
    try:
        yield server
    finally:
        server.close()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``condition`` until it holds; ``AssertionError`` after ``timeout`` seconds."""
    stop = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > stop:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.01)


def pid_shm_files() -> list[str]:
    """This process's staging-pool objects still in ``/dev/shm``."""
    return sorted(glob.glob(f"/dev/shm/reactantserver-client-{os.getpid()}-*"))


class Pools:
    """Staging pools a test makes, closed when its session ends (whatever ``shutdown`` did)."""

    def __init__(self) -> None:
        self._pools: list[StagingPool] = []

    def new(self, nbytes: int = 1 << 16, slots: int = 4) -> StagingPool:
        """A new SHM pool."""
        pool = StagingPool(nbytes, slots)
        self._pools.append(pool)
        return pool

    def close(self) -> None:
        """Close every pool made."""
        for pool in self._pools:
            pool.close()


@contextlib.contextmanager
def client_session() -> Iterator[Pools]:
    """End with ``shutdown()``, and check no staging-pool object of this process is left."""
    pools = Pools()
    try:
        yield pools
    finally:
        shutdown()
        pools.close()
    left = pid_shm_files()
    assert not left, f"staging-pool objects left behind: {left}"


def code_of(error: BaseException) -> grpc.StatusCode | None:
    """The status of a gRPC error, sync or aio (``AioRpcError`` is no ``grpc.Call``)."""
    code = getattr(error, "code", None) if isinstance(error, grpc.RpcError) else None
    return code() if callable(code) else None


def run_infer(
    kind: str,
    model: KServeModel,
    inputs: Any,
    **kwargs: Any,
) -> pb.ModelInferResponse | None:
    """``infer_sync`` (``kind="sync"``) or ``infer_async`` on a fresh event loop."""
    if kind == "sync":
        return infer_sync(model, inputs, **kwargs)
    assert kind == "async", kind
    return asyncio.run(infer_async(model, inputs, **kwargs))


def rows(n: int, start: int = 0) -> npt.NDArray[np.float32]:
    """``n`` rows of 4 consecutive FP32 values from ``start``."""
    return np.arange(start, start + 4 * n, dtype=np.float32).reshape(n, 4)


def check_echo(response: pb.ModelInferResponse | None, data: npt.NDArray[Any]) -> None:
    """``response`` echoes ``data`` as ``x_out``."""
    assert response is not None
    np.testing.assert_array_equal(InferOutput(response, "x_out"), data)


def echo_from_slot(
    kind: str, model: KServeModel, pool: StagingPool, data: npt.NDArray[Any]
) -> None:
    """One request with ``data`` as input ``x`` in a slot of ``pool``; check the echo."""
    with slot_inputs(pool, x=data) as inputs:
        response = run_infer(kind, model, inputs)
    check_echo(response, data)


@contextlib.contextmanager
def slot_inputs(pool: StagingPool, **arrays: npt.NDArray[Any]) -> Iterator[list[InferInput]]:
    """``InferInput.from_slot`` inputs holding copies of ``arrays``, carved from one slot."""
    with pool.acquire() as slot:
        inputs = []
        for name, array in arrays.items():
            buffer = slot.scratch(array.shape, array.dtype)
            buffer[...] = array
            inputs.append(InferInput.from_slot(name, buffer))
        yield inputs


class EchoIO:
    """``n`` items of ``width`` FP32 values written into pool slots as input ``x``.

    The echoed ``x_out`` is declared (:class:`OutputSpec`), so an SHM pool gets it written
    into the slot and copied back; :attr:`result` collects what came back.
    """

    def __init__(self, n: int, width: int = 4) -> None:
        self.data = np.arange(n * width, dtype=np.float32).reshape(n, width) + 0.5
        self.result = np.full_like(self.data, np.nan)

    def __len__(self) -> int:
        return len(self.data)

    def item_input_bytes(self) -> int:
        """Bytes of one item's ``x``."""
        return int(self.data[0].nbytes)

    def encode_chunk(self, items: range, slot: StagingSlot) -> list[InferInput]:
        """Copy the chunk's rows into the slot and reference them."""
        x = slot.scratch((len(items), self.data.shape[1]), np.float32)
        x[...] = self.data[items.start : items.stop]
        return [InferInput.from_slot("x", x)]

    def decode_chunk(self, items: range, response: pb.ModelInferResponse) -> None:
        """Keep the chunk's echoed rows."""
        self.result[items.start : items.stop] = InferOutput(response, "x_out")

    def output_specs(self) -> list[OutputSpec]:
        """``x_out``, one row per item."""
        return [OutputSpec("x_out", np.float32, (self.data.shape[1],))]
