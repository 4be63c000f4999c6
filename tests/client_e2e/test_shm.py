"""Explicit shared-memory regions, with this client and with ``tritonclient``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as triton_shm

from reactantserver import client as rc
from reactantserver.core import codec
from reactantserver.core.protocol import grpc_service_pb2 as pb
from tests.worker_e2e._harness import WorkerProcess

from ._helpers import example_inputs, reference, region_key, registered

pytestmark = pytest.mark.slow

REGION_BYTES = 1024
N = 3
X_OFFSET = 128
OUT_OFFSET = 256


@pytest.fixture
def regions() -> Iterator[tuple[rc.ShmRegion, rc.ShmRegion]]:
    """An input and an output region of this process (unlinked afterwards)."""
    with (
        rc.create_region(region_key("in"), REGION_BYTES) as rin,
        rc.create_region(region_key("out"), REGION_BYTES) as rout,
    ):
        yield rin, rout


def _shm_output(response: pb.ModelInferResponse, name: str) -> tuple[str, int, int]:
    (tensor,) = (t for t in response.outputs if t.name == name)
    params = tensor.parameters
    return (
        params[codec.SHM_REGION].string_param,
        params[codec.SHM_OFFSET].int64_param,
        params[codec.SHM_BYTE_SIZE].int64_param,
    )


def test_inputs_and_outputs_in_explicit_regions(
    worker: WorkerProcess, triton: Any, regions: tuple[rc.ShmRegion, rc.ShmRegion]
) -> None:
    rin, rout = regions
    tensors = example_inputs("two_io", N, seed=31)
    (_, a, _), (_, b, _) = tensors
    want = reference(triton, "two_io", tensors)
    assert rin.write(X_OFFSET, a) == a.nbytes
    dot_bytes = N * 4
    with rc.KServeModel(worker.url, "two_io") as model:
        rc.register_region(model, rin)
        rc.register_region(f"grpc://{worker.url}", rout, "e2e-out")
        assert rout.name == "e2e-out"
        assert registered(triton) == {
            rin.name: (rin.key, 0, REGION_BYTES),
            "e2e-out": (rout.key, 0, REGION_BYTES),
        }
        # ``a`` from the region, ``b`` inline; ``dot`` into the region, ``sum`` inline
        inputs = [rc.InferInput.from_shm("a", rin, X_OFFSET, a.shape, np.float32)]
        inputs.append(rc.InferInput("b", b))
        outputs: list[str | rc.RequestedOutput] = [
            rc.RequestedOutput.to_shm("dot", rout, OUT_OFFSET, dot_bytes),
            "sum",
        ]
        response = rc.infer_sync(model, inputs, outputs=outputs)
        assert response is not None
        assert _shm_output(response, "dot") == ("e2e-out", OUT_OFFSET, dot_bytes)
        with pytest.raises(ValueError, match=r"ShmRegion\.read"):
            rc.InferOutput(response, "dot")
        np.testing.assert_array_equal(rout.read(OUT_OFFSET, (N, 1), np.float32), want["dot"])
        np.testing.assert_array_equal(rc.InferOutput(response, "sum"), want["sum"])

        # the same through the async driver, into another part of the output region
        rout.write(0, np.zeros(REGION_BYTES // 4, np.float32))
        later = [rc.RequestedOutput.to_shm("sum", rout, 0, N * 8 * 4)]

        async def run() -> pb.ModelInferResponse | None:
            return await rc.infer_async(model, inputs, outputs=later)

        answer = asyncio.run(run())
        assert answer is not None
        assert [o.name for o in answer.outputs] == ["sum"]
        np.testing.assert_array_equal(rout.read(0, (N, 8), np.float32), want["sum"])

        rc.unregister_region(model, rin)
        rc.unregister_region(f"grpc://{worker.url}", "e2e-out")
        rc.unregister_region(model, "never-registered")  # unknown names are fine
    assert registered(triton) == {}


def test_partial_registration_offsets_are_relative(
    worker: WorkerProcess, triton: Any, regions: tuple[rc.ShmRegion, rc.ShmRegion]
) -> None:
    rin, rout = regions
    tensors = example_inputs("mlp", N, seed=32)
    x = tensors[0][1]
    want = reference(triton, "mlp", tensors)["logits"]
    rin.write(512, x)
    with rc.KServeModel(worker.url, "mlp") as model:
        rc.register_region(model, rin, "e2e-half", offset=512, byte_size=512)
        rc.register_region(model, rout, "e2e-out", offset=512)
        assert registered(triton) == {
            "e2e-half": (rin.key, 512, 512),
            "e2e-out": (rout.key, 512, 512),
        }
        response = rc.infer_sync(
            model,
            [rc.InferInput.from_shm("x", rin, 0, x.shape, np.float32)],
            outputs=[rc.RequestedOutput.to_shm("logits", rout, 0, N * 16)],
        )
        assert response is not None
        np.testing.assert_array_equal(rout.read(512, (N, 4), np.float32), want)
        for name in ("e2e-half", "e2e-out"):
            rc.unregister_region(model, name)


def test_our_region_in_a_tritonclient_request(
    worker: WorkerProcess, triton: Any, regions: tuple[rc.ShmRegion, rc.ShmRegion]
) -> None:
    rin, rout = regions
    tensors = example_inputs("mlp", N, seed=33)
    x = tensors[0][1]
    want = reference(triton, "mlp", tensors)["logits"]
    rin.write(X_OFFSET, x)
    rc.register_region(worker.url, rin)
    rc.register_region(worker.url, rout)
    try:
        tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
        tensor.set_shared_memory(rin.name, x.nbytes, offset=X_OFFSET)
        output = grpcclient.InferRequestedOutput("logits")
        output.set_shared_memory(rout.name, N * 16, offset=OUT_OFFSET)
        result = triton.infer("mlp", [tensor], outputs=[output])
        assert result.get_output("logits") is not None
        np.testing.assert_array_equal(rout.read(OUT_OFFSET, (N, 4), np.float32), want)
    finally:
        rc.unregister_region(worker.url, rin)
        rc.unregister_region(worker.url, rout)


def test_tritonclient_region_in_our_request(worker: WorkerProcess, triton: Any) -> None:
    tensors = example_inputs("mlp", N, seed=34)
    x = tensors[0][1]
    want = reference(triton, "mlp", tensors)["logits"]
    key = region_key("triton")
    handle = triton_shm.create_shared_memory_region("e2e-triton", key, REGION_BYTES)
    try:
        triton_shm.set_shared_memory_region(handle, [x], offset=X_OFFSET)
        triton.register_system_shared_memory("e2e-triton", key, REGION_BYTES)
        try:
            region = rc.ShmRegion(key, REGION_BYTES, create=False)
            region.name = "e2e-triton"
            with rc.KServeModel(worker.url, "mlp") as model:
                response = rc.infer_sync(
                    model,
                    [rc.InferInput.from_shm("x", region, X_OFFSET, x.shape, np.float32)],
                    outputs=[rc.RequestedOutput.to_shm("logits", region, OUT_OFFSET, N * 16)],
                )
            assert response is not None
            got = triton_shm.get_contents_as_numpy(handle, np.float32, [N, 4], offset=OUT_OFFSET)
            np.testing.assert_array_equal(got, want)
            region.close()
        finally:
            triton.unregister_system_shared_memory("e2e-triton")
    finally:
        triton_shm.destroy_shared_memory_region(handle)
