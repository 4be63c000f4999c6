"""Meta models end to end: real workers of their own, driven through ``tritonclient.grpc``.

A ``static`` worker (``fifo`` discipline, meta gate capacity 1) serves the ``pipeline``
example, :data:`~._bundles.SPIN` and copies of it, and the test metas of ``_meta_bundles.py``;
the served numbers are checked against the pipeline's glue and jax stages run in this
process. An ``explicit`` worker (on-demand weight cache on) holds metas that must not load
and checks the load-time rules through the repository RPCs. Every test leaves the gate free.
"""

from __future__ import annotations

import itertools
import queue
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from ._bundles import SPIN, SPIN_ITERATIONS, assert_close, export_examples
from ._harness import (
    WAIT_S,
    Answers,
    WorkerProcess,
    dispatch_held,
    failure,
    infer_input,
    message_of,
    model_stats,
    rows,
    running_worker,
    spin_input,
    status_of,
    wait_for,
)
from ._meta_bundles import (
    BOOT_CALLEE,
    BOOT_CALLS_META,
    CALLS_META,
    COMPUTE_ONLY,
    EMBED,
    FLAG_DIR_VARIABLE,
    GLUE_SLEEP_S,
    LATE,
    LATE_EMBED,
    META,
    NO_OUTPUTS,
    ORPHAN,
    ORPHAN_SUB,
    PARKED,
    REGISTERS_MODEL,
    SCORE,
    SELF_CALL,
    TWO_STAGE_SLOW,
    UNDECLARED,
    add_bad_metas,
    add_calls_meta,
    add_late_pair,
    add_test_metas,
    compute_only_reference,
    copy_bundle,
    embed_reference,
    pipeline_reference,
    release,
)

pytestmark = pytest.mark.slow

META_PLATFORM = "reactantserver_meta"
ITEM_COUNTS = (1, 5, 32)
"""Rows per pipeline request: compiled batch sizes 1, 8 (padded) and 32 for the first stage."""
SPIN_COPIES = ("spin_0", "spin_1", "spin_2")
"""Copies of :data:`SPIN`: one long request each, so that none coalesces with another."""
LONG_SPIN = SPIN_ITERATIONS * 2 // 5
"""About 0.4 s of the dispatch thread per request (the short spin of ``dispatch_held`` is 1)."""
GATE_BUDGET_US = 2_000_000
"""Triton ``timeout`` of a meta that queues for the full gate: long enough to be seen waiting."""
STAGE_BUDGET_US = int(GLUE_SLEEP_S * 1e6) // 2
"""Ends during ``two_stage_slow``'s glue, far after its first sub-call."""
GATE_IN_USE = "reactantserver_worker_meta_gate_in_use"
GATE_WAITING = "reactantserver_worker_meta_gate_waiting"
DISPATCHES = "reactantserver_worker_dispatch_total"
SERVED = "reactantserver_worker_requests_served_total"
QUEUE_DEPTH = "reactantserver_worker_queue_depth"
_TOKENS = itertools.count(1)
"""``x[0, 0]`` of each ``parked`` request: the name of the flag that releases it."""


# -- workers --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def meta_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pipeline`` (and its sub-models), ``spin``, its copies and the test metas."""
    root = tmp_path_factory.mktemp("meta-models")
    export_examples(root, names=["pipeline"])
    add_test_metas(root)
    for name in SPIN_COPIES:
        copy_bundle(root / SPIN, root / name)
    return root


@pytest.fixture(scope="module")
def flag_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where ``parked`` requests look for the flag that releases them."""
    return tmp_path_factory.mktemp("meta-flags")


@pytest.fixture(scope="module")
def meta_worker(
    meta_repo: Path, cache_dir: Path, flag_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """A ``static`` ``fifo`` worker with a meta gate of one permit."""
    env = {
        "REACTANTSERVER_WORKER_CACHE_DIR": str(cache_dir),
        "REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "static",
        "REACTANTSERVER_WORKER_SCHEDULER_DISCIPLINE": "fifo",
        "REACTANTSERVER_WORKER_META_CONCURRENCY": "1",
        FLAG_DIR_VARIABLE: str(flag_dir),
    }
    log = tmp_path_factory.mktemp("meta-logs") / "worker.log"
    with running_worker(meta_repo, log, env) as process:
        yield process


@pytest.fixture(scope="module")
def mclient(meta_worker: WorkerProcess) -> Iterator[Any]:
    """A ``tritonclient.grpc`` client of :func:`meta_worker`."""
    with grpcclient.InferenceServerClient(meta_worker.url) as triton:
        yield triton


@pytest.fixture(scope="module")
def explicit_worker(
    meta_repo: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """An ``explicit`` worker (weight cache on): ``pipeline``, ``compute_only``, bad metas."""
    base = tmp_path_factory.mktemp("meta-explicit")
    root = base / "models"
    root.mkdir()
    for name in (EMBED, SCORE, META, COMPUTE_ONLY):
        shutil.copytree(meta_repo / name, root / name)
    add_bad_metas(root)
    env = {
        "REACTANTSERVER_WORKER_CACHE_DIR": str(cache_dir),
        "REACTANTSERVER_WORKER_MODEL_CONTROL_MODE": "explicit",
        "REACTANTSERVER_WORKER_RUNTIME_WEIGHT_CACHE_MAX_BYTES": "1000000",
    }
    with running_worker(root, base / "worker.log", env) as process:
        yield process


@pytest.fixture(scope="module")
def eclient(explicit_worker: WorkerProcess) -> Iterator[Any]:
    """A ``tritonclient.grpc`` client of :func:`explicit_worker`."""
    with grpcclient.InferenceServerClient(explicit_worker.url) as triton:
        yield triton


# -- helpers --------------------------------------------------------------------------------------


def items(count: int) -> np.ndarray[Any, Any]:
    """``pipeline`` input with ``count`` rows."""
    return rows(count, 16, seed=700 + count)


def items_input(count: int) -> Any:
    """The ``items`` tensor of one ``pipeline`` request."""
    return infer_input("items", items(count), "FP32")


def x_input(x: np.ndarray[Any, Any]) -> Any:
    """The ``x`` tensor of the test metas (and of ``pipeline_embed``)."""
    return infer_input("x", x, "FP32")


def check_pipeline(result: Any, count: int) -> None:
    """``result`` is what the pipeline's glue and stages give for :func:`items` directly."""
    want_scores, want_indices = pipeline_reference(items(count))
    indices, scores = result.as_numpy("indices"), result.as_numpy("scores")
    assert indices.dtype == np.int64
    assert scores.dtype == np.float32
    np.testing.assert_array_equal(indices, want_indices)
    assert_close(scores, want_scores)


def gate_free(worker: WorkerProcess) -> None:
    """Wait until no meta holds or waits for a gate permit."""
    wait_for(
        lambda: worker.metric(GATE_IN_USE) == 0 and worker.metric(GATE_WAITING) == 0,
        "the meta gate to be free",
    )


def index_row(client: Any, model: str) -> Any:
    """``model``'s ``RepositoryIndex`` row, ``None`` when it is not listed."""
    index = client.get_model_repository_index()
    return next((row for row in index.models if row.name == model), None)


def assert_internal_to(client: Any, sub_model: str, meta: str, tensor: Any) -> None:
    """``sub_model`` is hidden: not ready, not listed, ``NOT_FOUND`` naming ``meta``."""
    assert not client.is_model_ready(sub_model)
    assert index_row(client, sub_model) is None
    error = failure(client.infer, sub_model, [tensor])
    assert status_of(error) == "NOT_FOUND", error
    assert f"'{sub_model}' is internal to meta" in message_of(error)
    assert f"'{meta}'" in message_of(error)


# -- the pipeline through tritonclient ------------------------------------------------------------


def test_pipeline_matches_its_stages_run_directly(mclient: Any) -> None:
    before = model_stats(mclient, META)
    for count in ITEM_COUNTS:
        check_pipeline(mclient.infer(META, [items_input(count)]), count)

    answers = Answers(len(ITEM_COUNTS))
    for count in ITEM_COUNTS:
        mclient.async_infer(META, [items_input(count)], answers.callback(str(count)))
    for key, (error, result) in answers.wait().items():
        assert error is None, (key, error)
        check_pipeline(result, int(key))

    streamed: queue.Queue[tuple[Any, Any]] = queue.Queue()
    mclient.start_stream(lambda result, error: streamed.put((result, error)))
    try:
        for count in ITEM_COUNTS:
            mclient.async_stream_infer(META, [items_input(count)], request_id=str(count))
        answered = [streamed.get(timeout=WAIT_S) for _ in ITEM_COUNTS]
    finally:
        mclient.stop_stream()
    ids = []
    for result, error in answered:
        assert error is None, error
        ids.append(result.get_response().id)
        check_pipeline(result, int(ids[-1]))
    assert sorted(ids) == sorted(str(count) for count in ITEM_COUNTS)

    after = model_stats(mclient, META)
    requests = 3 * len(ITEM_COUNTS)
    # Statistics: one dispatch and one row per meta request, whatever its row count
    assert after.execution_count - before.execution_count == requests
    assert after.inference_count - before.inference_count == requests
    assert after.inference_stats.success.count - before.inference_stats.success.count == requests


def test_pipeline_is_one_model_to_clients(mclient: Any) -> None:
    metadata = mclient.get_model_metadata(META)
    assert metadata.platform == META_PLATFORM
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("items", "FP32", [-1, 16])
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
        ("scores", "FP32", [-1]),
        ("indices", "INT64", [-1]),
    ]
    config = mclient.get_model_config(META).config
    assert config.platform == META_PLATFORM
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    assert parameters["kind"] == "meta"
    assert parameters["calls"] == f"{EMBED},{SCORE}"

    assert mclient.is_model_ready(META)
    assert index_row(mclient, META).state == "READY"
    stats = mclient.get_inference_statistics()
    assert {entry.name for entry in stats.model_stats} >= {META, PARKED, SPIN}
    for sub_model, tensor in (
        (EMBED, x_input(rows(2, 16, seed=1))),
        (SCORE, infer_input("emb", rows(2, 8, seed=2), "FP32")),
    ):
        assert_internal_to(mclient, sub_model, META, tensor)
        assert sub_model not in {entry.name for entry in stats.model_stats}
        error = failure(mclient.get_model_metadata, sub_model)
        assert status_of(error) == "NOT_FOUND", error


# -- the meta gate --------------------------------------------------------------------------------


def test_gate_capacity_one_holds_metas_but_not_other_work(
    mclient: Any, meta_worker: WorkerProcess, flag_dir: Path
) -> None:
    gate_free(meta_worker)
    token = next(_TOKENS)
    x = np.zeros((2, 16), np.float32)
    x[0, 0] = token
    embeds = meta_worker.metric(DISPATCHES, model=EMBED)
    parked = Answers(1)
    mclient.async_infer(PARKED, [x_input(x)], parked.callback(PARKED))
    try:
        wait_for(
            lambda: (
                meta_worker.metric(GATE_IN_USE) == 1
                and meta_worker.metric(DISPATCHES, model=EMBED) == embeds + 1
            ),
            "parked to hold the permit in its glue, after its sub-call",
        )
        # The dispatch thread is free while a meta is in its glue: a regular model runs...
        result = mclient.infer(SPIN, [spin_input(1)])
        assert result.as_numpy("y").shape == (1, 16)
        # ...and a compute-only meta needs no permit.
        y = rows(3, 16, seed=3)
        assert_close(
            mclient.infer(COMPUTE_ONLY, [x_input(y)]).as_numpy("y"), compute_only_reference(y)
        )
        # Another gated meta waits for the permit until its budget ends.
        late = Answers(1)
        mclient.async_infer(
            META,
            [items_input(5)],
            late.callback(META),
            timeout=GATE_BUDGET_US,
            client_timeout=WAIT_S,
        )
        wait_for(lambda: meta_worker.metric(GATE_WAITING) == 1, "pipeline to wait for the gate")
        error, _ = late.wait()[META]
        assert error is not None
        assert status_of(error) == "DEADLINE_EXCEEDED", error
        assert "meta gate" in message_of(error)
        assert f"'{META}'" in message_of(error)
        wait_for(lambda: meta_worker.metric(GATE_WAITING) == 0, "the waiter to leave the gate")
        assert meta_worker.metric(GATE_IN_USE) == 1
        assert parked.answers == {}
    finally:
        release(flag_dir, token)
    error, result = parked.wait()[PARKED]
    assert error is None, error
    assert_close(result.as_numpy("emb"), embed_reference(x))
    gate_free(meta_worker)
    check_pipeline(mclient.infer(META, [items_input(5)]), 5)


# -- committed sub-calls --------------------------------------------------------------------------


def test_committed_sub_calls_overtake_queued_work(mclient: Any, meta_worker: WorkerProcess) -> None:
    gate_free(meta_worker)
    done = Answers(len(SPIN_COPIES) + 1)
    with dispatch_held(mclient, meta_worker):
        for name in SPIN_COPIES:
            mclient.async_infer(name, [spin_input(LONG_SPIN)], done.callback(name))
        wait_for(
            lambda: all(meta_worker.metric(QUEUE_DEPTH, model=n) == 1 for n in SPIN_COPIES),
            "the long spin requests to queue behind the held dispatch thread",
        )
        mclient.async_infer(META, [items_input(5)], done.callback(META))
        wait_for(
            lambda: meta_worker.metric(QUEUE_DEPTH, model=EMBED) == 1,
            "the pipeline's first sub-call to queue",
        )
        # Still held (the short spin is queued): everything above is queued behind it.
        assert meta_worker.metric(QUEUE_DEPTH, model=SPIN) == 1
        answers = done.wait()
    for key, (error, _) in answers.items():
        assert error is None, (key, error)
    check_pipeline(answers[META][1], 5)
    # Completion order (Answers keeps it). Under fifo the pipeline's sub-call to
    # pipeline_embed was enqueued after all three spin requests: without committed priority
    # the dispatch thread would run spin_0, spin_1 and spin_2 (about 0.4 s each) first, and
    # then pipeline_score behind whatever queued meanwhile, so the pipeline would finish
    # last (position 3). Committed sub-calls are selected before the discipline scan: embed
    # runs as soon as the hold ends, and score as soon as the dispatch thread is next free,
    # which is after at most one spin request it picked up while the glue ran between the
    # two stages.
    order = list(answers)
    assert order.index(META) <= 1, order


# -- deadlines ------------------------------------------------------------------------------------


def test_deadline_stops_the_meta_at_the_next_stage_boundary(
    mclient: Any, meta_worker: WorkerProcess
) -> None:
    gate_free(meta_worker)
    embeds = meta_worker.metric(DISPATCHES, model=EMBED)
    scores = meta_worker.metric(DISPATCHES, model=SCORE)
    scored = meta_worker.metric(SERVED, model=SCORE)
    x = rows(3, 16, seed=4)
    error = failure(
        mclient.infer,
        TWO_STAGE_SLOW,
        [x_input(x)],
        timeout=STAGE_BUDGET_US,
        client_timeout=WAIT_S,
    )
    assert status_of(error) == "DEADLINE_EXCEEDED", error
    assert f"before sub-call '{SCORE}'" in message_of(error)
    assert f"'{TWO_STAGE_SLOW}'" in message_of(error)
    wait_for(
        lambda: meta_worker.metric(DISPATCHES, model=EMBED) == embeds + 1,
        "the first stage to be counted",
    )
    gate_free(meta_worker)  # run has returned: nothing of it can still reach the scheduler
    assert meta_worker.metric(DISPATCHES, model=SCORE) == scores
    assert meta_worker.metric(SERVED, model=SCORE) == scored


# -- undeclared sub-calls -------------------------------------------------------------------------


def test_undeclared_sub_call_is_internal_and_the_worker_keeps_serving(
    mclient: Any, meta_worker: WorkerProcess
) -> None:
    scores = meta_worker.metric(DISPATCHES, model=SCORE)
    error = failure(mclient.infer, UNDECLARED, [x_input(rows(2, 16, seed=5))])
    assert status_of(error) == "INTERNAL", error
    assert "undeclared" in message_of(error)
    assert f"'{SCORE}'" in message_of(error)
    assert meta_worker.metric(DISPATCHES, model=SCORE) == scores
    gate_free(meta_worker)
    check_pipeline(mclient.infer(META, [items_input(1)]), 1)
    assert mclient.is_model_ready(UNDECLARED)
    assert mclient.is_server_ready()


# -- load-time rules (explicit mode) --------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "cause"),
    [
        (SELF_CALL, "must not call itself"),
        (NO_OUTPUTS, "client_outputs: required and non-empty"),
        (REGISTERS_MODEL, "must call register_meta_model()"),
    ],
)
def test_bad_meta_does_not_load(eclient: Any, model: str, cause: str) -> None:
    row = index_row(eclient, model)
    assert row.state == "UNAVAILABLE"
    assert cause in row.reason
    error = failure(eclient.load_model, model)
    assert status_of(error) == "INTERNAL", error
    assert cause in message_of(error)
    assert f"'{model}'" in message_of(error)
    assert not eclient.is_model_ready(model)
    assert index_row(eclient, model).state == "UNAVAILABLE"


def test_meta_calling_a_loaded_meta_does_not_load(
    eclient: Any, explicit_worker: WorkerProcess
) -> None:
    x = rows(2, 16, seed=6)
    assert eclient.is_model_ready(COMPUTE_ONLY)  # a loaded (compute-only) meta
    add_calls_meta(explicit_worker.repo)  # explicit mode does not watch: only load_model sees it
    error = failure(eclient.load_model, CALLS_META)
    assert status_of(error) == "INTERNAL", error
    assert f"calls '{COMPUTE_ONLY}', which is a meta model" in message_of(error)
    assert not eclient.is_model_ready(CALLS_META)
    assert index_row(eclient, CALLS_META).state == "UNAVAILABLE"
    # the callee is untouched: still visible and serving
    assert eclient.is_model_ready(COMPUTE_ONLY)
    assert_close(eclient.infer(COMPUTE_ONLY, [x_input(x)]).as_numpy("y"), compute_only_reference(x))


def test_meta_calling_a_meta_at_start_up_does_not_hide_its_callee(eclient: Any) -> None:
    # Validation: a meta may call regular models only. Both bundles were there at start-up:
    # the caller fails to load (BundleError, as when the callee was loaded first), and the
    # callee (a valid compute-only meta) stays a model of its own.
    x = rows(2, 16, seed=7)
    row = index_row(eclient, BOOT_CALLS_META)
    assert row.state == "UNAVAILABLE"
    assert f"calls '{BOOT_CALLEE}', which is a meta model" in row.reason
    assert not eclient.is_model_ready(BOOT_CALLS_META)
    error = failure(eclient.infer, BOOT_CALLS_META, [x_input(x)])
    assert status_of(error) == "UNAVAILABLE", error
    assert eclient.is_model_ready(BOOT_CALLEE)
    assert index_row(eclient, BOOT_CALLEE).state == "READY"
    assert_close(eclient.infer(BOOT_CALLEE, [x_input(x)]).as_numpy("y"), compute_only_reference(x))


def test_meta_with_a_missing_callee_waits_for_it(
    eclient: Any, explicit_worker: WorkerProcess
) -> None:
    x = rows(4, 16, seed=8)
    row = index_row(eclient, ORPHAN)
    assert row.state == "UNAVAILABLE"
    assert f"sub-model '{ORPHAN_SUB}' is not loaded" in row.reason
    assert not eclient.is_model_ready(ORPHAN)
    error = failure(eclient.infer, ORPHAN, [x_input(x)])
    assert status_of(error) == "UNAVAILABLE", error
    assert ORPHAN_SUB in message_of(error)

    copy_bundle(explicit_worker.repo / EMBED, explicit_worker.repo / ORPHAN_SUB)
    eclient.load_model(ORPHAN_SUB)
    assert eclient.is_model_ready(ORPHAN)
    assert index_row(eclient, ORPHAN).state == "READY"
    assert_close(eclient.infer(ORPHAN, [x_input(x)]).as_numpy("emb"), embed_reference(x))
    assert_internal_to(eclient, ORPHAN_SUB, ORPHAN, x_input(x))


def test_load_of_a_meta_loads_its_sub_models(eclient: Any, explicit_worker: WorkerProcess) -> None:
    # Loaded at start-up, nothing resident: the meta is not ready until its sub-models are.
    assert not eclient.is_model_ready(META)
    assert f"sub-model '{EMBED}'" in index_row(eclient, META).reason
    eclient.load_model(META)  # pins both sub-models
    assert eclient.is_model_ready(META)
    for count in ITEM_COUNTS:
        check_pipeline(eclient.infer(META, [items_input(count)]), count)

    x = rows(3, 16, seed=9)
    add_late_pair(explicit_worker.repo, explicit_worker.repo / EMBED)  # neither is loaded
    eclient.load_model(LATE)
    assert eclient.is_model_ready(LATE)
    assert_close(eclient.infer(LATE, [x_input(x)]).as_numpy("emb"), embed_reference(x))
    assert_internal_to(eclient, LATE_EMBED, LATE, x_input(x))


def test_unload_of_a_sub_model_of_a_loaded_meta_is_refused(eclient: Any) -> None:
    eclient.load_model(META)
    for sub_model in (EMBED, SCORE):
        error = failure(eclient.unload_model, sub_model)
        assert status_of(error) == "FAILED_PRECONDITION", error
        assert f"sub-model of loaded meta '{META}'" in message_of(error)
    assert eclient.is_model_ready(META)
    check_pipeline(eclient.infer(META, [items_input(5)]), 5)
