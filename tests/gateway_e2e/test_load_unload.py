"""RepositoryModelLoad/Unload fan-out over two ``explicit`` workers, and the route refresh."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests._e2e_support import worker_env
from tests.worker_e2e._harness import (
    WorkerProcess,
    infer_input,
    model_stats,
    rows,
    running_worker,
    status_of,
)

from ._gateway import running_gateway

pytestmark = pytest.mark.slow

X = rows(2, 16, seed=51)


@pytest.fixture(scope="module")
def explicit_pair(
    repo: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[WorkerProcess]]:
    """Two ``explicit`` workers on a repository holding a copy of ``mlp`` (nothing pinned)."""
    base = tmp_path_factory.mktemp("explicit-pair")
    models = base / "models"
    models.mkdir()
    shutil.copytree(repo / "mlp", models / "mlp")
    env = worker_env(
        cache_dir, MODEL_CONTROL_MODE="explicit", RUNTIME_WEIGHT_CACHE_MAX_BYTES="1000000"
    )
    with (
        running_worker(models, base / "explicit0.log", env) as first,
        running_worker(models, base / "explicit1.log", env) as second,
    ):
        yield [first, second]


def _status(call: Any, *args: Any) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call(*args)
    return status_of(caught.value)


def _infer(client: Any) -> Any:
    return client.infer("mlp", [infer_input("x", X, "FP32")]).as_numpy("logits")


def test_load_and_unload_fan_out_and_refresh_the_routes(
    explicit_pair: list[WorkerProcess], tmp_path: Path
) -> None:
    direct = [grpcclient.InferenceServerClient(worker.url) for worker in explicit_pair]
    try:
        with (
            running_gateway(explicit_pair, tmp_path, name="gateway-explicit") as gateway,
            grpcclient.InferenceServerClient(gateway.url) as client,
        ):
            assert not client.is_model_ready("mlp")
            assert _status(_infer, client) in {"NOT_FOUND", "UNAVAILABLE"}

            client.load_model("mlp")  # both workers pin it; the routes follow at once
            assert all(each.is_model_ready("mlp") for each in direct)
            assert client.is_model_ready("mlp")
            before = [model_stats(each, "mlp").inference_count for each in direct]
            for _ in range(4):
                assert _infer(client).shape == (2, 4)
            after = [model_stats(each, "mlp").inference_count for each in direct]
            assert [a - b for a, b in zip(after, before, strict=True)] == [4, 4]

            client.unload_model("mlp")
            assert not any(each.is_model_ready("mlp") for each in direct)
            assert not client.is_model_ready("mlp")
            assert _status(_infer, client) == "NOT_FOUND"

            # An error on every worker: the first one is returned unchanged.
            theirs = _status(direct[0].load_model, "no-such-bundle")
            assert _status(client.load_model, "no-such-bundle") == theirs

            client.load_model("mlp")
            assert _infer(client).shape == (2, 4)
    finally:
        for each in direct:
            each.close()
