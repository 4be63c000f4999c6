"""Helpers of the client end-to-end suite: example data, references, an IO driver, clean-up checks.

The server side comes from the worker suite's harness (``tests/worker_e2e/_harness.py``); this
module adds what a client test needs on top: inputs for each example in both clients' shapes,
the reference answer from ``tritonclient.grpc``, and an :class:`~reactantserver.client.InferenceIO`
over rows of ``mlp`` inputs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from reactantserver import client as rc
from reactantserver.core.errors import ReactantError
from reactantserver.core.protocol import grpc_service_pb2 as pb
from tests._e2e_support import worker_env
from tests.worker_e2e._bundles import SPIN
from tests.worker_e2e._harness import (
    Answers,
    WorkerProcess,
    infer_input,
    queue_waits,
    spin_input,
    wait_for,
)

OURS: list[WorkerProcess] = []
"""Every worker this suite started (checked for left-over registrations after each test)."""

SHM_PREFIX = f"reactantserver-client-{os.getpid()}-"
"""Our SHM objects: staging pools, and the explicit regions of this suite (named alike)."""

Tensors = list[tuple[str, npt.NDArray[Any], str]]
"""A request's inputs: ``(name, array, KServe datatype)``."""


def shm_leftovers() -> list[str]:
    """SHM objects of this process still in ``/dev/shm``."""
    return sorted(p.name for p in Path("/dev/shm").glob(f"{SHM_PREFIX}*"))


def region_key(tag: str) -> str:
    """A fresh SHM key of this process for an explicit region (``/reactantserver-client-...``)."""
    return f"/{SHM_PREFIX}e2e-{tag}-{os.urandom(4).hex()}"


def registered(triton: Any) -> dict[str, tuple[str, int, int]]:
    """``{name: (key, offset, byte_size)}`` of the system SHM regions a server has registered."""
    status = triton.get_system_shared_memory_status()
    return {name: (r.key, r.offset, r.byte_size) for name, r in status.regions.items()}


def dedicated_worker(
    repo: Path, cache_dir: Path, tmp: Path, models: Sequence[str], **extra: str
) -> WorkerProcess:
    """A worker (not started yet) serving copies of ``models`` from ``repo``."""
    own = tmp / "models"
    own.mkdir()
    for name in models:
        shutil.copytree(repo / name, own / name)
    process = WorkerProcess(own, tmp / "worker.log", worker_env(cache_dir, **extra))
    OURS.append(process)
    return process


def status_name(error: BaseException) -> str:
    """The gRPC status name a client error carries (``grpc.RpcError`` or a core error)."""
    if isinstance(error, grpc.RpcError):
        # grpc.aio's AioRpcError has code() but is no grpc.Call
        code = error.code()
        return str(code.name)
    if isinstance(error, ReactantError):
        return str(error.status.name)
    raise AssertionError(f"not a status-carrying error: {error!r}")


# -- example data -------------------------------------------------------------------------------

EXAMPLE_OUTPUTS = {
    "mlp": ("logits",),
    "cnn": ("logits",),
    "two_io": ("sum", "dot"),
    "classifier_hooks": ("indices", "scores"),
}
"""The examples and their outputs, in metadata order."""


def example_inputs(model: str, n: int, seed: int) -> Tensors:
    """``n`` items of inputs for ``model``, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    if model == "mlp":
        return [("x", rng.standard_normal((n, 16)).astype(np.float32), "FP32")]
    if model == "cnn":
        return [("image", rng.random((n, 1, 28, 28), dtype=np.float32), "FP32")]
    if model == "two_io":
        a = rng.standard_normal((n, 8)).astype(np.float32)
        b = rng.standard_normal((n, 8)).astype(np.float32)
        return [("a", a, "FP32"), ("b", b, "FP32")]
    if model == "classifier_hooks":
        return [("image", rng.integers(0, 256, (n, 28, 28, 3), dtype=np.uint8), "UINT8")]
    raise AssertionError(f"no inputs for {model!r}")


def ours(tensors: Tensors) -> list[rc.InferInput]:
    """The inputs as this client's ``InferInput`` objects."""
    return [rc.InferInput(name, array) for name, array, _ in tensors]


def reference(triton: Any, model: str, tensors: Tensors) -> dict[str, npt.NDArray[Any]]:
    """Every output of ``model`` on ``tensors``, as ``tritonclient.grpc`` receives it."""
    result = triton.infer(model, [infer_input(name, a, dt) for name, a, dt in tensors])
    return {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}


def outputs_of(response: pb.ModelInferResponse) -> dict[str, npt.NDArray[Any]]:
    """Every output of a response of this client, by name (copies)."""
    return {o.name: np.array(rc.InferOutput(response, o.name)) for o in response.outputs}


# -- a batched IO driver ------------------------------------------------------------------------


class MlpRows:
    """``mlp`` over the rows of ``x``: inputs carved from the slot, logits gathered in ``y``.

    With ``declare=True`` it declares ``logits`` as an :class:`~reactantserver.client.OutputSpec`
    (with an SHM pool the server then writes them into the chunk's slot). ``via_slot`` records,
    per chunk, whether the logits ``decode_chunk`` read were also in the slot's memory at that
    moment, i.e. whether they came back through the slot.
    """

    FEATURES = 16
    CLASSES = 4

    def __init__(self, x: npt.NDArray[np.float32], *, declare: bool = False) -> None:
        self.x = x
        self.y = np.full((len(x), self.CLASSES), np.nan, np.float32)
        self.declare = declare
        self.chunks: list[range] = []
        self.via_slot: dict[int, bool] = {}
        self._slots: dict[int, tuple[rc.StagingPool, int, int]] = {}

    def __len__(self) -> int:
        return len(self.x)

    def item_input_bytes(self) -> int:
        return self.FEATURES * 4

    def output_specs(self) -> tuple[rc.OutputSpec, ...]:
        if not self.declare:
            return ()
        return (rc.OutputSpec("logits", np.float32, (self.CLASSES,)),)

    def encode_chunk(self, items: range, slot: rc.StagingSlot) -> list[rc.InferInput]:
        buffer = slot.scratch((len(items), self.FEATURES), np.float32)
        buffer[...] = self.x[items.start : items.stop]
        self._slots[items.start] = (slot.pool, slot.offset, slot.nbytes)
        return [rc.InferInput.from_slot("x", buffer)]

    def decode_chunk(self, items: range, response: pb.ModelInferResponse) -> None:
        self.chunks.append(items)
        logits = rc.InferOutput(response, "logits")
        assert logits.shape == (len(items), self.CLASSES)
        self.y[items.start : items.stop] = logits
        pool, offset, nbytes = self._slots.pop(items.start)
        self.via_slot[items.start] = logits.tobytes() in bytes(pool.view(offset, nbytes))


# -- holding the device -------------------------------------------------------------------------


@contextlib.contextmanager
def device_held(triton: Any, worker: WorkerProcess, iterations: float) -> Iterator[None]:
    """``dispatch_held`` of the worker suite with a spin of ``iterations`` (float32-exact).

    A long spin executes and a one-iteration spin waits behind it, so anything sent inside
    the block queues; on exit both spins must have succeeded.
    """
    spins = Answers(2)
    taken = queue_waits(triton, SPIN)
    triton.async_infer(SPIN, [spin_input(iterations)], spins.callback("long"))
    # The short spin goes out only once the long one left the queue for an execution, so the
    # two are never coalesced into one batch however fast the server turns.
    wait_for(lambda: queue_waits(triton, SPIN) > taken, "the long spin request dispatched")
    triton.async_infer(SPIN, [spin_input(1)], spins.callback("short"))
    wait_for(
        lambda: (
            worker.metric("reactantserver_worker_inflight_requests") == 2
            and worker.metric("reactantserver_worker_queue_depth", model=SPIN) == 1
        ),
        "a spin request executing and another queued",
    )
    yield
    for key, (error, result) in spins.wait().items():
        assert error is None, (key, error)
        assert result.as_numpy("y").shape == (1, 16)
