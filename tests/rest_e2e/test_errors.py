"""Error cases over plain HTTP: the mapped status, a JSON ``{"error"}`` body, and no harm done.

After every failure a good request on the same port must still succeed.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ._target import Target, error_body, request

pytestmark = pytest.mark.slow

GOOD = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}


def _infer_body(datatype: str, shape: list[int], data: list[float]) -> bytes:
    tensor = {"name": "x", "datatype": datatype, "shape": shape, "data": data}
    return json.dumps({"inputs": [tensor]}).encode()


CASES = {
    "unknown model": ("/v2/models/no_such_model/infer", json.dumps(GOOD).encode(), 404),
    "malformed JSON": ("/v2/models/mlp/infer", b'{"inputs": [', 400),
    "wrong shape": ("/v2/models/mlp/infer", _infer_body("FP32", [1, 15], [0.5] * 15), 400),
    "wrong datatype": ("/v2/models/mlp/infer", _infer_body("INT32", [1, 16], [1] * 16), 400),
    "unknown path": ("/v2/no/such/path", None, 404),
    "unknown model metadata": ("/v2/models/no_such_model", None, 404),
    "binary header past the body": (
        "/v2/models/mlp/infer",
        json.dumps(GOOD).encode(),
        400,
    ),
}


def _good(target: Target) -> None:
    answer = request(target, "/v2/models/mlp/infer", json.dumps(GOOD).encode())
    assert answer.status == 200, answer
    (logits,) = json.loads(answer.body)["outputs"]
    assert (logits["name"], logits["datatype"], logits["shape"]) == ("logits", "FP32", [1, 4])
    assert np.isfinite(logits["data"]).all()


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_status_and_body(target: Target, case: str) -> None:
    path, body, status = CASES[case]
    headers = {"Content-Type": "application/json"}
    if case == "binary header past the body":
        headers["Inference-Header-Content-Length"] = str(len(body or b"") + 10)
    answer = request(target, path, body, headers)
    assert answer.status == status, answer
    message = error_body(answer)
    if "model" in case:
        assert "no_such_model" in message
    _good(target)


def test_unknown_method_on_a_known_path_is_an_error(target: Target) -> None:
    answer = request(target, "/v2/models/mlp/infer", method="DELETE")
    assert answer.status == 405, answer
    assert answer.headers["Allow"] == "POST"
    error_body(answer)
    _good(target)
