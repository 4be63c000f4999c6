"""``ModelInfer`` on the shipped examples through tritonclient."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient

from ._bundles import assert_close, mlp_reference, two_io_reference
from ._harness import WorkerProcess, infer_input, raw_request, response_array, rows

pytestmark = pytest.mark.slow


def test_infer_with_raw_inputs(client: Any, weights: dict[str, Any]) -> None:
    x = rows(3, 16, seed=1)
    result = client.infer("mlp", [infer_input("x", x, "FP32")], request_id="req-1")
    response = result.get_response()
    assert response.model_name == "mlp"
    assert response.model_version == "1"
    assert response.id == "req-1"
    assert dict(response.parameters) == {}
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("logits", "FP32", [3, 4])
    assert_close(result.as_numpy("logits"), mlp_reference(weights["mlp"], x))


def test_infer_with_typed_contents(stub: Any, weights: dict[str, Any]) -> None:
    x = rows(2, 16, seed=2)
    request = raw_request("mlp", [("x", "FP32", x.shape, None)])
    request.inputs[0].contents.fp32_contents.extend(x.ravel().tolist())
    response = stub.ModelInfer(request)
    # outputs always come back raw, never as typed contents
    assert len(response.raw_output_contents) == 1
    assert not response.outputs[0].contents.fp32_contents
    assert_close(response_array(response, 0), mlp_reference(weights["mlp"], x))


def test_every_compiled_size_and_padding(client: Any, weights: dict[str, Any]) -> None:
    for n in (1, 5, 8, 20, 32):
        x = rows(n, 16, seed=100 + n)
        got = client.infer("mlp", [infer_input("x", x, "FP32")]).as_numpy("logits")
        assert got.shape == (n, 4)
        assert_close(got, mlp_reference(weights["mlp"], x))


def test_cnn_nchw_batch_matches_row_by_row(client: Any) -> None:
    images = np.random.default_rng(3).random((5, 1, 28, 28), dtype=np.float32)
    batched = client.infer("cnn", [infer_input("image", images, "FP32")]).as_numpy("logits")
    assert batched.shape == (5, 10)
    for i in range(len(images)):
        one = images[i : i + 1]
        alone = client.infer("cnn", [infer_input("image", one, "FP32")]).as_numpy("logits")
        assert alone.shape == (1, 10)
        assert_close(alone[0], batched[i])
    assert len({tuple(np.round(r, 4)) for r in batched}) == len(images)


def test_two_io_output_subsets_and_order(client: Any, weights: dict[str, Any]) -> None:
    a, b = rows(4, 8, seed=4), rows(4, 8, seed=5)
    inputs = [infer_input("a", a, "FP32"), infer_input("b", b, "FP32")]
    want_sum, want_dot = two_io_reference(weights["two_io"], a, b)

    every = client.infer("two_io", inputs)
    assert [o.name for o in every.get_response().outputs] == ["sum", "dot"]
    assert_close(every.as_numpy("sum"), want_sum)
    assert_close(every.as_numpy("dot"), want_dot)

    only_dot = client.infer("two_io", inputs, outputs=[grpcclient.InferRequestedOutput("dot")])
    assert [o.name for o in only_dot.get_response().outputs] == ["dot"]
    assert len(only_dot.get_response().raw_output_contents) == 1
    assert_close(only_dot.as_numpy("dot"), want_dot)

    reordered = client.infer(
        "two_io",
        inputs,
        outputs=[grpcclient.InferRequestedOutput("dot"), grpcclient.InferRequestedOutput("sum")],
    )
    response = reordered.get_response()
    assert [(o.name, list(o.shape)) for o in response.outputs] == [("dot", [4, 1]), ("sum", [4, 8])]
    assert_close(reordered.as_numpy("sum"), want_sum)
    assert_close(reordered.as_numpy("dot"), want_dot)


def test_model_with_hooks(client: Any) -> None:
    images = np.random.default_rng(6).integers(0, 256, (3, 28, 28, 3), dtype=np.uint8)
    result = client.infer("classifier_hooks", [infer_input("image", images, "UINT8")])
    response = result.get_response()
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
        ("indices", "INT64", [3, 3]),
        ("scores", "FP32", [3, 3]),
    ]
    indices, scores = result.as_numpy("indices"), result.as_numpy("scores")
    assert np.all((indices >= 0) & (indices < 10))
    assert all(len(set(row)) == 3 for row in indices.tolist())
    assert np.all(np.diff(scores, axis=1) <= 0)  # best first
    assert np.all((scores > 0) & (scores <= 1))
    assert np.all(scores.sum(axis=1) <= 1 + 1e-5)
    for i in range(len(images)):
        alone = client.infer("classifier_hooks", [infer_input("image", images[i : i + 1], "UINT8")])
        np.testing.assert_array_equal(alone.as_numpy("indices")[0], indices[i])
        assert_close(alone.as_numpy("scores")[0], scores[i])


def test_hooks_pass_through_model(client: Any, weights: dict[str, Any]) -> None:
    x = rows(3, 16, seed=7)
    got = client.infer("hooky", [infer_input("x", x, "FP32")]).as_numpy("logits")
    assert_close(got, mlp_reference(weights["hooky"], x))


def test_asyncio_client(worker: WorkerProcess, weights: dict[str, Any]) -> None:
    xs = [rows(2, 16, seed=200 + i) for i in range(6)]

    async def run() -> list[Any]:
        async with aioclient.InferenceServerClient(worker.url) as client:
            assert await client.is_server_ready()
            calls = [
                client.infer("mlp", [_aio_input(x)], request_id=str(i)) for i, x in enumerate(xs)
            ]
            return list(await asyncio.gather(*calls))

    results = asyncio.run(run())
    for i, (x, result) in enumerate(zip(xs, results, strict=True)):
        assert result.get_response().id == str(i)
        assert_close(result.as_numpy("logits"), mlp_reference(weights["mlp"], x))


def _aio_input(x: np.ndarray[Any, Any]) -> Any:
    tensor = aioclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor
