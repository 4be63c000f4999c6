"""``RepositoryModelLoad`` / ``Unload`` over REST on ``explicit``-mode workers.

Through the worker only that worker changes; through the gateway the call fans out to both.
Each test leaves the model loaded again.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.worker_e2e._harness import wait_for

from ._target import Target, error_body, grpc_input, http_input, request

pytestmark = pytest.mark.slow

MODEL = "cnn"


def test_unload_then_load(target: Target) -> None:
    images = np.random.default_rng(8).random((2, 1, 28, 28), dtype=np.float32)
    with target.clients() as (rest, rpc):
        want = rpc.infer(MODEL, [grpc_input("image", images, "FP32")]).as_numpy("logits")
        rest.unload_model(MODEL)
        try:
            assert not rest.is_model_ready(MODEL)
            with pytest.raises(InferenceServerException):
                rest.infer(MODEL, [http_input("image", images, "FP32", binary=True)])
            index = {m["name"]: m for m in rest.get_model_repository_index()}
            assert index.get(MODEL, {}).get("state") != "READY"
        finally:
            rest.load_model(MODEL)
        assert rest.is_model_ready(MODEL)
        wait_for(lambda: rpc.is_model_ready(MODEL), f"{MODEL} ready over gRPC")
        got = rest.infer(MODEL, [http_input("image", images, "FP32", binary=True)])
        np.testing.assert_array_equal(got.as_numpy("logits"), want)


def test_load_errors(target: Target) -> None:
    answer = request(target, "/v2/repository/models/no_such_bundle/load", b"")
    assert answer.status == 404, answer
    assert "no_such_bundle" in error_body(answer)
    # A config override is refused the same way on both protocols.
    with target.clients() as (rest, rpc):
        with pytest.raises(InferenceServerException) as caught:
            rpc.load_model(MODEL, config="{}")
        assert "INVALID_ARGUMENT" in str(caught.value.status()), caught.value
        body = json.dumps({"parameters": {"config": "{}"}}).encode()
        answer = request(target, f"/v2/repository/models/{MODEL}/load", body)
        assert answer.status == 400, answer
        assert "not supported" in error_body(answer)
        assert rest.is_model_ready(MODEL)
