"""The model lifecycle end to end: workers of their own, changed through their directories.

A ``dynamic`` worker polls a model directory of its own every :data:`POLL_S`; the tests publish,
rewrite, delete and rename bundles there the way an operator would (atomic publication) and
watch the served set follow through a stock ``tritonclient.grpc`` client. An ``explicit``
worker with the on-demand weight cache is driven through ``WorkerControl`` and the repository
RPCs. Every test uses names of its own, or leaves the names it touches as it found them.
(``static`` mode refusing the repository RPCs is covered by ``test_metadata.py``.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from safetensors import safe_open
from safetensors.numpy import save_file
from tritonclient.utils import InferenceServerException

from reactantserver.core.protocol import control_pb2, control_pb2_grpc, grpc_service_pb2

from ._bundles import TOLERANCE, assert_close, load_weights, mlp_reference
from ._harness import (
    WAIT_S,
    WorkerProcess,
    failure,
    infer_input,
    inference_stub,
    message_of,
    open_channel,
    rows,
    running_worker,
    status_of,
    wait_for,
)

pytestmark = pytest.mark.slow

POLL_S = 0.1
"""``model_poll_seconds`` of the workers here: a change lands two or three polls later."""
X = rows(4, 16, seed=21)
WEIGHTS = "weights.safetensors"
MANIFEST = "manifest.yaml"
HITS = "reactantserver_worker_executable_cache_hits_total"
MISSES = "reactantserver_worker_executable_cache_misses_total"
FAILURES = "reactantserver_worker_model_load_failures_total"

DYNAMIC_MODELS = ("mlp", "swap", "doomed", "staging", "m-production", "m-staging", "fragile")
"""Copies of ``mlp`` the dynamic worker starts with (``m-staging`` with weights doubled)."""
EXPLICIT_MODELS = ("mlp", "solo")


# -- bundles --------------------------------------------------------------------------------------


def publish(source: Path, root: Path, name: str) -> Path:
    """Copy ``source`` to ``root/name`` atomically (``name.tmp`` first, then one rename)."""
    staging = root / f"{name}.tmp"
    shutil.copytree(source, staging)
    target = root / name
    os.rename(staging, target)
    return target


def replace_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (a hidden sibling, then ``os.replace``)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def scale_weights(bundle: Path, factor: float, *, keep_metadata: bool = True) -> None:
    """Multiply every weight of ``bundle`` by ``factor`` in place (atomically).

    Without ``keep_metadata`` the file loses its ``argument_order``: a broken bundle.
    """
    path = bundle / WEIGHTS
    with safe_open(str(path), "np") as f:
        metadata = f.metadata()
        names = f.keys()  # safe_open is not iterable
        tensors = {key: f.get_tensor(key) * np.float32(factor) for key in names}
    tmp = bundle / f".{WEIGHTS}.tmp"
    save_file(tensors, str(tmp), metadata=metadata if keep_metadata else None)
    os.replace(tmp, path)


def reference(bundle: Path) -> Any:
    """What ``bundle`` must answer for :data:`X` (its weights in NumPy)."""
    return mlp_reference(load_weights(bundle), X)


def same(actual: Any, desired: Any) -> bool:
    """Whether two outputs agree up to f32 noise."""
    return bool(np.allclose(actual, desired, rtol=TOLERANCE, atol=TOLERANCE))


# -- client helpers -------------------------------------------------------------------------------


def logits(client: Any, model: str) -> Any:
    """``model``'s answer for :data:`X`."""
    return client.infer(model, [infer_input("x", X, "FP32")]).as_numpy("logits")


def infer_status(client: Any, model: str) -> str:
    """``"OK"`` when ``model`` answers, else the gRPC status name of its error."""
    try:
        logits(client, model)
    except InferenceServerException as error:
        return status_of(error)
    return "OK"


def index_row(client: Any, model: str) -> Any:
    """``model``'s ``RepositoryIndex`` row, ``None`` when it is not listed."""
    index = client.get_model_repository_index()
    return next((row for row in index.models if row.name == model), None)


def reason_of(client: Any, model: str) -> str | None:
    """``model``'s ``RepositoryIndex`` reason (``None`` when not listed)."""
    row = index_row(client, model)
    return None if row is None else str(row.reason)


# -- workers --------------------------------------------------------------------------------------


def control_status(worker: WorkerProcess) -> Any | None:
    """``WorkerControl.ModelControlStatus``; ``None`` while the worker cannot answer it."""
    with open_channel(worker.url) as channel:
        stub = control_pb2_grpc.WorkerControlStub(channel)
        try:
            return stub.ModelControlStatus(control_pb2.ModelControlStatusRequest(), timeout=5.0)
        except grpc.RpcError:
            return None


@contextlib.contextmanager
def own_worker(
    base: Path, repo: Path, cache_dir: Path, names: Iterable[str], env: dict[str, str]
) -> Iterator[WorkerProcess]:
    """A worker on ``base/models`` (copies of ``mlp`` as ``names``), started; stopped cleanly.

    An explicit worker with nothing device-resident is ServerReady too (models registered).
    """
    root = base / "models"
    root.mkdir()
    for name in names:
        shutil.copytree(repo / "mlp", root / name)
        if name.endswith("-staging"):
            scale_weights(root / name, 2.0)
    settings = {"REACTANTSERVER_WORKER_CACHE_DIR": str(cache_dir)}
    settings["REACTANTSERVER_WORKER_MODEL_POLL_SECONDS"] = str(POLL_S)
    with running_worker(root, base / "worker.log", {**settings, **env}) as process:
        yield process


@pytest.fixture(scope="module")
def dynamic(
    repo: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A ``dynamic`` worker on :data:`DYNAMIC_MODELS` and ``m-staging`` (weights doubled)."""
    base = tmp_path_factory.mktemp("lifecycle-dynamic")
    with own_worker(base, repo, cache_dir, DYNAMIC_MODELS, {}) as process:
        yield process


@pytest.fixture(scope="module")
def dclient(dynamic: WorkerProcess) -> Iterator[Any]:
    """A ``tritonclient.grpc`` client of the dynamic worker."""
    with grpcclient.InferenceServerClient(dynamic.url) as triton:
        yield triton


@pytest.fixture(scope="module")
def explicit(
    repo: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """An ``explicit`` worker with the on-demand cache on, serving :data:`EXPLICIT_MODELS`."""
    base = tmp_path_factory.mktemp("lifecycle-explicit")
    env = {
        "REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "explicit",
        "REACTANTSERVER_WORKER_RUNTIME_WEIGHT_CACHE_MAX_BYTES": "1000000",
    }
    with own_worker(base, repo, cache_dir, EXPLICIT_MODELS, env) as process:
        yield process


@pytest.fixture(scope="module")
def eclient(explicit: WorkerProcess) -> Iterator[Any]:
    """A ``tritonclient.grpc`` client of the explicit worker."""
    with grpcclient.InferenceServerClient(explicit.url) as triton:
        yield triton


# -- dynamic mode ---------------------------------------------------------------------------------


def test_new_bundle_is_served_after_the_debounce(dynamic: WorkerProcess, dclient: Any) -> None:
    assert infer_status(dclient, "fresh") == "NOT_FOUND"
    bundle = publish(dynamic.repo / "mlp", dynamic.repo, "fresh")
    wait_for(lambda: dclient.is_model_ready("fresh"), "the new bundle to be ready")
    assert_close(logits(dclient, "fresh"), logits(dclient, "mlp"))
    assert_close(logits(dclient, "fresh"), reference(bundle))
    row = index_row(dclient, "fresh")
    assert (row.state, row.reason) == ("READY", "")


def test_rewritten_weights_swap_without_a_failed_request(
    dynamic: WorkerProcess, dclient: Any
) -> None:
    bundle = dynamic.repo / "swap"
    old = logits(dclient, "swap")
    assert_close(old, reference(bundle))
    answers: list[Any] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def load_loop() -> None:
        try:
            with grpcclient.InferenceServerClient(dynamic.url) as own:
                while not stop.is_set():
                    answers.append(logits(own, "swap"))
        except BaseException as exc:  # reported by the test, never lost in the thread
            errors.append(exc)

    loop = threading.Thread(target=load_loop, name="lifecycle-load-loop")
    loop.start()
    try:
        wait_for(lambda: len(answers) >= 5 or bool(errors), "the load loop to get going")
        scale_weights(bundle, 2.0)
        new = reference(bundle)
        assert not same(new, old)

        def settled() -> bool:
            firsts = [i for i, a in enumerate(answers) if same(a, new)]
            return bool(errors) or (bool(firsts) and len(answers) - firsts[0] >= 20)

        wait_for(settled, "20 answers from the new generation")
    finally:
        stop.set()
        loop.join(WAIT_S)
    assert not loop.is_alive()
    assert errors == [], errors
    kinds = ["old" if same(a, old) else "new" if same(a, new) else "other" for a in answers]
    assert "other" not in kinds
    switch = kinds.index("new")
    assert switch >= 5
    assert kinds == ["old"] * switch + ["new"] * (len(kinds) - switch)
    assert_close(logits(dclient, "swap"), new)
    assert reason_of(dclient, "swap") == ""


def test_deleted_bundle_is_unloaded(dynamic: WorkerProcess, dclient: Any) -> None:
    assert infer_status(dclient, "doomed") == "OK"
    bundle = dynamic.repo / "doomed"
    retired = dynamic.repo / "doomed.old"  # ignored by the scanner: the bundle is gone at once
    os.rename(bundle, retired)
    shutil.rmtree(retired)
    wait_for(lambda: infer_status(dclient, "doomed") == "NOT_FOUND", "NOT_FOUND for the bundle")
    error = failure(logits, dclient, "doomed")
    assert error.status() == "StatusCode.NOT_FOUND"
    assert not dclient.is_model_ready("doomed")
    assert index_row(dclient, "doomed") is None
    assert dclient.is_model_ready("mlp")


def test_rename_serves_under_the_new_name_without_recompiling(
    dynamic: WorkerProcess, dclient: Any
) -> None:
    expected = logits(dclient, "staging")
    hits, misses = dynamic.metric(HITS), dynamic.metric(MISSES)
    assert hits + misses > 0  # the counters are live: the start-up compiled through the cache
    os.rename(dynamic.repo / "staging", dynamic.repo / "production")
    wait_for(lambda: dclient.is_model_ready("production"), "production to be ready")
    wait_for(lambda: infer_status(dclient, "staging") == "NOT_FOUND", "staging to be gone")
    assert_close(logits(dclient, "production"), expected)
    assert index_row(dclient, "staging") is None
    assert index_row(dclient, "production").state == "READY"
    assert (dynamic.metric(HITS), dynamic.metric(MISSES)) == (hits, misses)
    assert dynamic.metric(FAILURES, model="production") == 0


def test_promotion_chain_in_one_window(dynamic: WorkerProcess, dclient: Any) -> None:
    production, staging = logits(dclient, "m-production"), logits(dclient, "m-staging")
    assert not same(production, staging)
    hits, misses = dynamic.metric(HITS), dynamic.metric(MISSES)
    root = dynamic.repo
    os.rename(root / "m-production", root / "m-production-old")
    os.rename(root / "m-staging", root / "m-production")

    def promoted() -> bool:
        # The watcher may see the two renames in one poll window or in two; either way the
        # end state is the same (and no step loads anything).
        return (
            dclient.is_model_ready("m-production-old")
            and infer_status(dclient, "m-staging") == "NOT_FOUND"
            and infer_status(dclient, "m-production") == "OK"
            and same(logits(dclient, "m-production"), staging)
        )

    wait_for(promoted, "m-production-old and the promoted m-production")
    assert_close(logits(dclient, "m-production-old"), production)
    assert_close(logits(dclient, "m-production"), staging)
    assert (dynamic.metric(HITS), dynamic.metric(MISSES)) == (hits, misses)


def _break_manifest(bundle: Path) -> None:
    path = bundle / MANIFEST
    replace_file(path, path.read_bytes() + b"\nexecutable_inputs: [unclosed\n")


def _break_weights(bundle: Path) -> None:
    scale_weights(bundle, 1.0, keep_metadata=False)


@pytest.mark.parametrize("breaker", [_break_manifest, _break_weights], ids=["manifest", "weights"])
def test_broken_bundle_keeps_the_old_generation(
    dynamic: WorkerProcess, dclient: Any, breaker: Callable[[Path], None]
) -> None:
    bundle = dynamic.repo / "fragile"
    good = {name: (bundle / name).read_bytes() for name in (MANIFEST, WEIGHTS)}
    expected = logits(dclient, "fragile")
    failures = dynamic.metric(FAILURES, model="fragile")
    breaker(bundle)
    wait_for(
        lambda: (reason_of(dclient, "fragile") or "").startswith("reload failed"),
        "the failed reload to be reported",
    )
    assert dynamic.metric(FAILURES, model="fragile") > failures
    row = index_row(dclient, "fragile")
    assert row.state == "READY"
    assert "\n" not in row.reason
    assert dclient.is_model_ready("fragile")
    assert_close(logits(dclient, "fragile"), expected)
    # Fixed: the good files again (a new digest), reloaded, the reason gone.
    for name, data in good.items():
        replace_file(bundle / name, data)
    wait_for(lambda: reason_of(dclient, "fragile") == "", "the fixed bundle to reload")
    assert index_row(dclient, "fragile").state == "READY"
    assert_close(logits(dclient, "fragile"), expected)
    assert dclient.is_model_ready("fragile")


def test_load_model_reconciles_at_once(dynamic: WorkerProcess, dclient: Any) -> None:
    bundle = publish(dynamic.repo / "mlp", dynamic.repo, "eager")
    dclient.load_model("eager")
    assert dclient.is_model_ready("eager")
    assert_close(logits(dclient, "eager"), reference(bundle))
    dclient.load_model("mlp")  # unchanged: a no-op that still succeeds
    assert dclient.is_model_ready("mlp")

    error = failure(dclient.unload_model, "eager")
    assert status_of(error) == "FAILED_PRECONDITION", error
    assert "remove the bundle" in message_of(error)
    assert dclient.is_model_ready("eager")
    error = failure(dclient.load_model, "no-such-bundle")
    assert status_of(error) == "NOT_FOUND", error
    assert index_row(dclient, "no-such-bundle") is None


# -- explicit mode --------------------------------------------------------------------------------


def residency_of(worker: WorkerProcess, model: str) -> int | None:
    """``model``'s residency in ``ModelControlStatus`` (``None`` when not listed)."""
    status = control_status(worker)
    assert status is not None
    return next((int(m.residency) for m in status.models if m.name == model), None)


def set_residency(
    worker: WorkerProcess, model: str, target: control_pb2.Residency.ValueType
) -> int:
    """``WorkerControl.SetModelResidency``; the residency it reports."""
    with open_channel(worker.url) as channel:
        stub = control_pb2_grpc.WorkerControlStub(channel)
        request = control_pb2.SetModelResidencyRequest(name=model, target=target)
        response = stub.SetModelResidency(request, timeout=WAIT_S)
    return int(response.residency)


def test_explicit_worker_is_ready_with_nothing_resident(
    explicit: WorkerProcess, eclient: Any
) -> None:
    assert not eclient.is_model_ready("mlp")  # nothing pinned yet (the tests below pin)
    assert eclient.is_server_ready()


def test_explicit_residency_drives_readiness(explicit: WorkerProcess, eclient: Any) -> None:
    status = control_status(explicit)
    assert status is not None
    assert status.residency_mode == "externally_managed"
    by_name = {m.name: m for m in status.models}
    assert sorted(by_name) == sorted(EXPLICIT_MODELS)
    assert not by_name["mlp"].device_resident
    assert not eclient.is_model_ready("mlp")
    assert infer_status(eclient, "mlp") == "UNAVAILABLE"
    row = index_row(eclient, "mlp")
    assert row.state == "UNAVAILABLE"
    assert row.reason.startswith("not resident")

    pinned = set_residency(explicit, "mlp", control_pb2.PINNED_DEVICE)
    assert pinned == control_pb2.PINNED_DEVICE
    assert eclient.is_model_ready("mlp")
    assert_close(logits(eclient, "mlp"), reference(explicit.repo / "mlp"))
    assert index_row(eclient, "mlp").state == "READY"

    unpinned = set_residency(explicit, "mlp", control_pb2.UNPINNED)
    assert unpinned == control_pb2.UNPINNED
    assert not eclient.is_model_ready("mlp")
    assert infer_status(eclient, "mlp") == "UNAVAILABLE"


def test_explicit_load_and_unload(explicit: WorkerProcess, eclient: Any) -> None:
    expected = reference(explicit.repo / "solo")
    assert not eclient.is_model_ready("solo")
    eclient.load_model("solo")  # loaded at start-up, unchanged: only pinned
    assert eclient.is_model_ready("solo")
    assert residency_of(explicit, "solo") == control_pb2.PINNED_DEVICE
    assert_close(logits(eclient, "solo"), expected)

    eclient.unload_model("solo")
    assert not eclient.is_model_ready("solo")
    assert infer_status(eclient, "solo") == "NOT_FOUND"
    assert index_row(eclient, "solo") is None

    assert residency_of(explicit, "solo") is None
    error = failure(eclient.unload_model, "solo")
    assert status_of(error) == "NOT_FOUND", error

    eclient.load_model("solo")  # a fresh load, pinned on return
    assert eclient.is_model_ready("solo")
    assert residency_of(explicit, "solo") == control_pb2.PINNED_DEVICE
    assert_close(logits(eclient, "solo"), expected)
    error = failure(eclient.load_model, "no-such-bundle")
    assert status_of(error) == "NOT_FOUND", error


def test_repository_control_refuses_parameters(explicit: WorkerProcess, eclient: Any) -> None:
    """Config overrides and files are not supported, nothing moves."""
    eclient.load_model("solo")
    error = failure(eclient.load_model, "solo", config='{"max_batch_size": 4}')
    assert status_of(error) == "INVALID_ARGUMENT", error
    assert "config" in message_of(error), error
    error = failure(eclient.load_model, "fresh", config="{}", files={"file:1/model.mlir": b"x"})
    assert status_of(error) == "INVALID_ARGUMENT", error
    assert index_row(eclient, "fresh") is None
    with open_channel(explicit.url) as channel:
        stub = inference_stub(channel)
        unload = grpc_service_pb2.RepositoryModelUnloadRequest(model_name="solo")
        unload.parameters["unload_dependents"].bool_param = True
        with pytest.raises(grpc.RpcError) as caught:
            stub.RepositoryModelUnload(unload, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value
    assert eclient.is_model_ready("solo")
    assert_close(logits(eclient, "solo"), reference(explicit.repo / "solo"))


def test_explicit_mode_does_not_watch(explicit: WorkerProcess, eclient: Any) -> None:
    bundle = publish(explicit.repo / "mlp", explicit.repo, "late")
    # A negative observation needs some time: ten poll intervals, in which a watcher (there
    # must be none in explicit mode) would have loaded the bundle several times over.
    time.sleep(10 * POLL_S)
    assert index_row(eclient, "late") is None
    assert infer_status(eclient, "late") == "NOT_FOUND"
    eclient.load_model("late")
    assert eclient.is_model_ready("late")
    assert_close(logits(eclient, "late"), reference(bundle))
