"""Registry and data plane in process: real compiled bundles, real model.py, real scheduler."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import jax
import numpy as np
import pytest

from reactantserver.core.errors import ReactantError
from reactantserver.core.hooks import NamedTensor
from reactantserver.core.manifest import load_manifest
from reactantserver.core.types import InferRequest, OutputRequest
from reactantserver.core.weights import PrivateWeightStore
from reactantserver.worker.dataplane import DataPlane
from reactantserver.worker.hooks import load_hooks
from reactantserver.worker.registry import ModelEntry, ModelRegistry
from reactantserver.worker.runtime import ExecutableCache, Residency, WeightCache, load_bundle
from reactantserver.worker.runtime.jax_backend import JaxBackend
from reactantserver.worker.scheduler import InflightLimiter, ScheduledModel, Scheduler

from .conftest import BundleMaker, Tensor

X = Tensor("x", "f32", "nk", {"k": 2})
Y = Tensor("y", "f32", "nk", {"k": 2})
W = np.array([10.0, 100.0], np.float32)

MODEL_PY = """
import numpy as np


def preprocess(inputs):
    (pixels,) = inputs
    return [NamedTensor("x", pixels.data.astype(np.float32) / 2)]


def postprocess(outputs):
    (y,) = outputs
    return [NamedTensor("total", y.data.sum(axis=1, keepdims=True))]


register_model("scaled", preprocess=preprocess, postprocess=postprocess)
"""


def _scale(x: jax.Array, w: jax.Array) -> jax.Array:
    return x * w


def _hooked(manifest: dict[str, Any]) -> None:
    manifest["client_inputs"] = [
        {"name": "pixels", "dtype": "i32", "shape": "nk", "dims": {"k": 2}}
    ]
    manifest["client_outputs"] = [
        {"name": "total", "dtype": "f32", "shape": "nk", "dims": {"k": 1}}
    ]


@pytest.fixture
def plane(make_bundle: BundleMaker, tmp_path: Path) -> Iterator[DataPlane]:
    backend = JaxBackend("cpu")
    exe_cache = ExecutableCache(tmp_path / "exe", backend)
    weights = WeightCache(backend, enabled=False)
    store = PrivateWeightStore()
    registry = ModelRegistry()
    scheduler = Scheduler(backend, weights)
    bundles = {
        "plain": make_bundle(
            "plain", _scale, inputs=[X], outputs=[Y], weights=[("w", W)], batch_sizes=[1, 4]
        ),
        "scaled": make_bundle(
            "scaled",
            _scale,
            inputs=[X],
            outputs=[Y],
            weights=[("w", W)],
            batch_sizes=[1, 4],
            manifest_edit=_hooked,
        ),
    }
    (bundles["scaled"] / "model.py").write_text(MODEL_PY)
    loaded_models = []
    for name, bundle in bundles.items():
        manifest = load_manifest(bundle)
        loaded = load_bundle(bundle, backend, exe_cache)
        loaded_models.append(loaded)
        weights.add_model(name, loaded.weight_source(store), Residency.UNPINNED)
        scheduled = ScheduledModel.from_loaded(loaded)
        scheduler.add_model(scheduled)
        registry.put(
            ModelEntry.ready(
                manifest, load_hooks(bundle, manifest), scheduled=scheduled, loaded=loaded
            )
        )
    registry.put(ModelEntry.loading("compiling"))
    registry.put(ModelEntry.failed("broken", "manifest.yaml: bad dtype\nmore detail"))
    pool = concurrent.futures.ThreadPoolExecutor(2)
    scheduler.start()
    try:
        yield DataPlane(registry, scheduler, pool, limiter=InflightLimiter(8))
    finally:
        scheduler.stop(grace_s=1.0)
        pool.shutdown()
        for loaded in loaded_models:
            loaded.close()


def _request(model: str, name: str, array: np.ndarray[Any, Any], **kw: Any) -> InferRequest:
    return InferRequest(model_name=model, inputs=[NamedTensor(name, array)], **kw)


def _status(plane: DataPlane, request: InferRequest) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(ReactantError) as caught:
        asyncio.run(plane.infer(request))
    return caught.value.status, str(caught.value)


def test_concurrent_requests_each_get_their_own_rows(plane: DataPlane) -> None:
    async def many() -> list[Any]:
        requests = [
            _request("plain", "x", np.array([[k, k]], np.float32), id=str(k)) for k in range(8)
        ]
        return await asyncio.gather(*(plane.infer(r) for r in requests))

    responses = asyncio.run(many())
    for k, response in enumerate(responses):
        assert response.id == str(k)
        assert response.model_version == "1"
        (out,) = response.outputs
        assert out.name == "y"
        np.testing.assert_array_equal(out.data, [[10.0 * k, 100.0 * k]])
    stats = plane.scheduler.stats("plain")
    assert stats is not None
    assert stats.requests_served == 8
    assert stats.dispatch_count < 8
    assert plane.request_stats("plain").success_count == 8


def test_hooks_run_around_the_executable(plane: DataPlane) -> None:
    pixels = np.array([[2, 4], [6, 8]], np.int32)
    response = asyncio.run(plane.infer(_request("scaled", "pixels", pixels)))
    (total,) = response.outputs
    assert total.name == "total"
    np.testing.assert_allclose(total.data, [[10 + 200], [30 + 400]])


@pytest.mark.parametrize(
    ("request_", "status", "text"),
    [
        (_request("nope", "x", np.zeros((1, 2), np.float32)), "NOT_FOUND", "unknown model"),
        (
            _request("plain", "x", np.zeros((1, 2), np.float32), model_version="2"),
            "NOT_FOUND",
            "version 2",
        ),
        (_request("compiling", "x", np.zeros((1, 2), np.float32)), "UNAVAILABLE", "loading"),
        (_request("broken", "x", np.zeros((1, 2), np.float32)), "UNAVAILABLE", "bad dtype"),
        (_request("plain", "z", np.zeros((1, 2), np.float32)), "INVALID_ARGUMENT", "'z'"),
        (_request("plain", "x", np.zeros((1, 3), np.float32)), "INVALID_ARGUMENT", "[-1, 2]"),
        (_request("plain", "x", np.zeros((5, 2), np.float32)), "INVALID_ARGUMENT", "exceeds"),
        (_request("plain", "x", np.zeros((1, 2), np.int32)), "INVALID_ARGUMENT", "datatype"),
        (
            _request("plain", "x", np.zeros((1, 2), np.float32), outputs=[OutputRequest("q")]),
            "INVALID_ARGUMENT",
            "unknown requested output 'q'",
        ),
        (
            _request("scaled", "pixels", np.zeros((1, 2), np.float32)),
            "INVALID_ARGUMENT",
            "pixels",
        ),
        (
            _request("plain", "x", np.zeros((1, 2), np.float32), deadline_ns=1),
            "DEADLINE_EXCEEDED",
            "deadline",
        ),
    ],
)
def test_bad_requests_get_their_status_and_others_keep_working(
    plane: DataPlane, request_: InferRequest, status: str, text: str
) -> None:
    code, message = _status(plane, request_)
    assert code is getattr(grpc.StatusCode, status)
    assert text in message
    assert "\n" not in message
    ok = asyncio.run(plane.infer(_request("plain", "x", np.ones((1, 2), np.float32))))
    np.testing.assert_array_equal(ok.outputs[0].data, [[10.0, 100.0]])


def test_failures_are_counted(plane: DataPlane) -> None:
    _status(plane, _request("plain", "x", np.zeros((1, 3), np.float32)))
    stats = plane.request_stats("plain")
    assert (stats.fail_count, stats.success_count) == (1, 0)
    assert stats.fail_ns > 0


def test_in_flight_cap_sheds_at_once(plane: DataPlane) -> None:
    held = [plane.limiter.try_acquire() for _ in range(plane.limiter.limit)]
    assert all(held)
    code, message = _status(plane, _request("plain", "x", np.ones((1, 2), np.float32)))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limit 8" in message
    assert plane.limiter.shed == 1
    for _ in held:
        plane.limiter.release()


def test_expired_deadline_never_reaches_the_device(plane: DataPlane) -> None:
    before = plane.scheduler.stats("plain")
    assert before is not None
    past = time.monotonic_ns() - 1
    _status(plane, _request("plain", "x", np.ones((1, 2), np.float32), deadline_ns=past))
    after = plane.scheduler.stats("plain")
    assert after is not None
    assert after.dispatch_count == before.dispatch_count
