"""One request at a time on every example, against ``tritonclient.grpc`` in the same process.

Both clients are imported at module top and both run inferences here: core's messages live in a
private proto package, so the two descriptor pools never clash.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as triton_pb

from reactantserver import client as rc
from reactantserver.core.protocol import grpc_service_pb2 as pb
from tests.worker_e2e._bundles import EXAMPLES, assert_close, mlp_reference, two_io_reference
from tests.worker_e2e._harness import WorkerProcess

from ._helpers import EXAMPLE_OUTPUTS, example_inputs, ours, outputs_of, reference

pytestmark = pytest.mark.slow

N = 3


def _check_like(
    response: pb.ModelInferResponse, model: str, want: dict[str, np.ndarray[Any, Any]]
) -> None:
    assert response.model_name == model
    assert [o.name for o in response.outputs] == list(EXAMPLE_OUTPUTS[model])
    got = outputs_of(response)
    assert list(got) == list(want)
    for name, array in got.items():
        assert array.shape[0] == N, (name, array.shape)  # batch first
        assert array.shape == want[name].shape, name
        assert array.dtype == want[name].dtype, name
        assert_close(array, want[name])


def test_descriptor_pools_do_not_clash() -> None:
    assert (
        pb.ModelInferRequest.DESCRIPTOR.full_name
        != triton_pb.ModelInferRequest.DESCRIPTOR.full_name
    )
    assert pb.DESCRIPTOR.name != triton_pb.DESCRIPTOR.name
    assert grpcclient.InferInput("x", [1], "FP32").name() == rc.InferInput("x", np.ones(1)).name


@pytest.mark.parametrize("model", EXAMPLES)
def test_sync_and_async_equal_tritonclient(worker: WorkerProcess, triton: Any, model: str) -> None:
    tensors = example_inputs(model, N, seed=len(model))
    want = reference(triton, model, tensors)
    with rc.KServeModel(f"grpc://{worker.url}", model) as served:
        sync = rc.infer_sync(served, ours(tensors), request_id=f"{model}-sync")
        assert sync is not None
        assert sync.id == f"{model}-sync"
        _check_like(sync, model, want)

        async def run() -> pb.ModelInferResponse | None:
            return await rc.infer_async(served, ours(tensors), request_id=f"{model}-async")

        answer = asyncio.run(run())
        assert answer is not None
        assert answer.id == f"{model}-async"
        _check_like(answer, model, want)


def test_numbers_match_numpy(worker: WorkerProcess, weights: dict[str, Any]) -> None:
    x = example_inputs("mlp", 5, seed=1)[0][1]
    with rc.KServeModel(worker.url, "mlp") as mlp:
        response = rc.infer_sync(mlp, [rc.InferInput("x", x)])
    assert response is not None
    assert_close(rc.InferOutput(response, "logits"), mlp_reference(weights["mlp"], x))


def test_output_subsets_priority_and_parameters(
    worker: WorkerProcess, weights: dict[str, Any]
) -> None:
    a, b = (t[1] for t in example_inputs("two_io", N, seed=2))
    want_sum, want_dot = two_io_reference(weights["two_io"], a, b)
    inputs = [rc.InferInput("a", a), rc.InferInput("b", b)]
    with rc.KServeModel(f"grpc://{worker.url}", "two_io") as model:
        only_dot = rc.infer_sync(model, inputs, outputs=["dot"], priority=1, request_id="d")
        assert only_dot is not None
        assert [o.name for o in only_dot.outputs] == ["dot"]
        assert only_dot.id == "d"
        assert_close(rc.InferOutput(only_dot, "dot"), want_dot)
        with pytest.raises(KeyError, match="sum"):
            rc.InferOutput(only_dot, "sum")

        reordered = rc.infer_sync(
            model, inputs, outputs=["dot", rc.RequestedOutput("sum")], parameters={"note": "e2e"}
        )
        assert reordered is not None
        assert [(o.name, list(o.shape)) for o in reordered.outputs] == [
            ("dot", [N, 1]),
            ("sum", [N, 8]),
        ]
        assert_close(rc.InferOutput(reordered, "sum"), want_sum)
        assert_close(rc.InferOutput(reordered, "dot"), want_dot)

        async def run() -> pb.ModelInferResponse | None:
            return await rc.infer_async(
                model, inputs, outputs=["sum"], priority=2, request_id="s", parameters={"n": 1}
            )

        only_sum = asyncio.run(run())
        assert only_sum is not None
        assert (only_sum.id, [o.name for o in only_sum.outputs]) == ("s", ["sum"])
        assert_close(rc.InferOutput(only_sum, "sum"), want_sum)


def test_concurrent_async_requests_keep_their_ids(
    worker: WorkerProcess, weights: dict[str, Any]
) -> None:
    xs = [example_inputs("mlp", 1 + i % 3, seed=10 + i)[0][1] for i in range(8)]

    async def run(model: rc.KServeModel) -> list[pb.ModelInferResponse | None]:
        calls = [
            rc.infer_async(model, [rc.InferInput("x", x)], request_id=f"r{i}")
            for i, x in enumerate(xs)
        ]
        return list(await asyncio.gather(*calls))

    with rc.KServeModel(worker.url, "mlp") as model:
        answers = asyncio.run(run(model))
    for i, (x, answer) in enumerate(zip(xs, answers, strict=True)):
        assert answer is not None
        assert answer.id == f"r{i}"
        assert_close(rc.InferOutput(answer, "logits"), mlp_reference(weights["mlp"], x))


@pytest.mark.parametrize("model", EXAMPLES)
def test_metadata_equals_tritonclient(worker: WorkerProcess, triton: Any, model: str) -> None:
    want = triton.get_model_metadata(model)
    with rc.KServeModel(worker.url, model) as served:
        spec = served.metadata()
        assert served.metadata() is spec  # fetched once
    assert spec.name == want.name == model
    assert spec.platform == want.platform
    assert spec.versions == tuple(want.versions)

    def tensors(infos: Any) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(t.name, t.datatype, tuple(t.shape)) for t in infos]

    assert tensors(spec.inputs) == tensors(want.inputs)
    assert tensors(spec.outputs) == tensors(want.outputs)
    assert [t.name for t in spec.outputs] == list(EXAMPLE_OUTPUTS[model])
    assert all(t.shape[0] == -1 for t in (*spec.inputs, *spec.outputs))  # batch first
