"""KServeModel: argument validation, defaults, closing (no server needed)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reactantserver import client
from reactantserver.client import (
    InferInput,
    KServeModel,
    RetryPolicy,
    StagingPool,
    Target,
    infer_async,
    infer_sync,
)
from reactantserver.client._model import MAX_RECV_ENV, MAX_SEND_ENV

SHM = Path("/dev/shm")
URL = "grpc://127.0.0.1:1"  # never dialled


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(MAX_SEND_ENV, raising=False)
    monkeypatch.delenv(MAX_RECV_ENV, raising=False)
    yield
    client.shutdown()
    left = sorted(SHM.glob(f"reactantserver-client-{os.getpid()}-*"))
    assert not left, f"staging pools left behind: {left}"


def test_defaults() -> None:
    with KServeModel(URL, "mlp") as model:
        assert model.url == URL
        assert model.model_name == "mlp"
        assert model.deadline == 10.0
        assert isinstance(model.deadline, float)
        assert model.max_batch_size == 1
        assert model.shared_memory == "auto"
        assert model.retry == RetryPolicy()
        assert model.shm_reprobe_interval == 60.0
        assert model.key.target == Target("127.0.0.1", 1, tls=False)
        assert model.key.max_send_message_length == 512 * 1024 * 1024
        assert model.key.max_receive_message_length == 512 * 1024 * 1024
        assert not model.closed
        assert repr(model) == f"KServeModel({URL!r}, 'mlp')"


def test_arguments_are_kept() -> None:
    policy = RetryPolicy(enabled=False)
    with (
        closing(StagingPool(4096, 2)) as pool,
        KServeModel(
            "grpcs://Example.com:443",
            "cnn",
            deadline=2,
            max_batch_size=16,
            shared_memory="off",
            retry=policy,
            root_certificates=b"roots",
            private_key=b"key",
            certificate_chain=b"chain",
            pool=pool,
            shm_reprobe_interval=0.5,
        ) as model,
    ):
        assert model.deadline == 2.0
        assert model.max_batch_size == 16
        assert model.shared_memory == "off"
        assert model.retry is policy
        assert model.pool is pool
        assert model.shm_reprobe_interval == 0.5
        assert model.key.target == Target("example.com", 443, tls=True)
        assert model.key.root_certificates == b"roots"
        assert model.key.private_key == b"key"
        assert model.key.certificate_chain == b"chain"


@pytest.mark.parametrize("mode", ["auto", "on", "off"])
def test_shared_memory_modes(mode: Any) -> None:
    with KServeModel(URL, "m", shared_memory=mode) as model:
        assert model.shared_memory == mode


def test_tls_without_material_is_fine() -> None:
    with KServeModel("grpcs://example.com:443", "m") as model:
        assert model.key.target.tls
        assert model.key.root_certificates is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"deadline": 0}, "deadline"),
        ({"deadline": -1.0}, "deadline"),
        ({"deadline": float("nan")}, "deadline"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_batch_size": -3}, "max_batch_size"),
        ({"shared_memory": "yes"}, "shared_memory"),
        ({"shared_memory": "AUTO"}, "shared_memory"),
        ({"shared_memory": True}, "shared_memory"),
        ({"root_certificates": b"roots"}, "TLS"),
        ({"private_key": b"key"}, "TLS"),
        ({"certificate_chain": b"chain"}, "TLS"),
        ({"shm_reprobe_interval": 0}, "shm_reprobe_interval"),
        ({"max_send_message_length": 0}, ">= 1"),
        ({"max_receive_message_length": -1}, ">= 1"),
    ],
    ids=lambda v: repr(v) if not isinstance(v, dict) else ",".join(f"{k}" for k in v),
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        KServeModel(URL, "m", **kwargs)


@pytest.mark.parametrize("url", ["grpc://127.0.0.1:1", "127.0.0.1:1"])
def test_tls_material_needs_a_tls_url(url: str) -> None:
    with pytest.raises(ValueError, match="grpcs://"):
        KServeModel(url, "m", root_certificates=b"roots")


def test_empty_model_name() -> None:
    with pytest.raises(ValueError, match="model_name"):
        KServeModel(URL, "")


@pytest.mark.parametrize("url", ["ftp://host:1", "host", "host:0", ""])
def test_bad_url(url: str) -> None:
    with pytest.raises(ValueError, match="invalid gRPC URL"):
        KServeModel(url, "m")


def test_context_manager_closes() -> None:
    with KServeModel(URL, "m") as model:
        assert not model.closed
    assert model.closed


def test_context_manager_closes_on_error() -> None:
    with pytest.raises(RuntimeError, match="boom"), KServeModel(URL, "m") as model:
        raise RuntimeError("boom")
    assert model.closed


def test_close_is_idempotent() -> None:
    model = KServeModel(URL, "m")
    model.close()
    model.close()
    assert model.closed


def test_calls_after_close() -> None:
    model = KServeModel(URL, "m")
    model.close()
    with pytest.raises(ValueError, match="closed"):
        model.check_open()
    with pytest.raises(ValueError, match="closed"):
        model.metadata()
    with pytest.raises(ValueError, match="closed"):
        infer_sync(model, [InferInput("x", np.zeros(1, np.float32))])
    with pytest.raises(ValueError, match="closed"):
        asyncio.run(infer_async(model, [InferInput("x", np.zeros(1, np.float32))]))


def test_inputs_must_be_infer_inputs() -> None:
    with KServeModel(URL, "m") as model, pytest.raises(TypeError, match="InferInput"):
        infer_sync(model, [np.zeros(1, np.float32)])  # type: ignore[list-item]


def test_given_pool_is_used() -> None:
    with (
        closing(StagingPool(4096, 4, shm=False)) as pool,
        KServeModel(URL, "m", pool=pool) as model,
    ):
        assert model.pool is pool
