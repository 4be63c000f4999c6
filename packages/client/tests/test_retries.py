"""Retries against a server that sheds on script.

Requests here are inline (plain ``InferInput``), so only the retry rules are in play. The server
records every attempt's gRPC timeout and ``reactant_timeout_ns``.
"""

from __future__ import annotations

import itertools
import time

import grpc
import numpy as np
import pytest

from reactantserver.client import InferInput, InferOutput, KServeModel, RetryPolicy

from ._scripted import (
    KINDS,
    ScriptedServer,
    code_of,
    run_infer,
)

FAST = RetryPolicy(initial_backoff=0.01)
NS = 1_000_000_000
# gRPC rounds the grpc-timeout header *up* to a coarse unit (it compresses better), so the
# server may see up to ~1 % more than the client asked for.
HEADER_ROUNDING_S = 0.25


def infer(kind: str, server: ScriptedServer, *, deadline: float = 10.0, retry: RetryPolicy) -> None:
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    with KServeModel(server.url, "echo", deadline=deadline, retry=retry) as model:
        response = run_infer(kind, model, [InferInput("x", data)])
    assert response is not None
    np.testing.assert_array_equal(InferOutput(response, "x_out"), data)


def statuses(server: ScriptedServer) -> list[grpc.StatusCode]:
    return [call.status for call in server.infers]


@pytest.mark.parametrize("code", [grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE])
@pytest.mark.parametrize("kind", KINDS)
def test_sheds_are_retried_until_success(
    kind: str, code: grpc.StatusCode, server: ScriptedServer
) -> None:
    server.fail_infer(code, times=3)
    infer(kind, server, retry=FAST)
    assert statuses(server) == [code, code, code, grpc.StatusCode.OK]


@pytest.mark.parametrize("kind", KINDS)
def test_unavailable_is_final_without_retry_unavailable(kind: str, server: ScriptedServer) -> None:
    server.fail_infer(grpc.StatusCode.UNAVAILABLE)
    policy = RetryPolicy(initial_backoff=0.01, retry_unavailable=False)
    with pytest.raises(grpc.RpcError) as raised:
        infer(kind, server, retry=policy)
    assert code_of(raised.value) is grpc.StatusCode.UNAVAILABLE
    assert server.count("ModelInfer") == 1


@pytest.mark.parametrize("kind", KINDS)
def test_overload_is_still_retried_without_retry_unavailable(
    kind: str, server: ScriptedServer
) -> None:
    server.fail_infer(grpc.StatusCode.RESOURCE_EXHAUSTED, times=2)
    infer(kind, server, retry=RetryPolicy(initial_backoff=0.01, retry_unavailable=False))
    assert server.count("ModelInfer") == 3


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,  # no region in the request: not a stale one
        grpc.StatusCode.INTERNAL,
    ],
    ids=lambda code: code.name,
)
@pytest.mark.parametrize("kind", KINDS)
def test_final_statuses_are_raised_after_one_attempt(
    kind: str, code: grpc.StatusCode, server: ScriptedServer
) -> None:
    server.fail_infer(code, times=5, details=f"scripted {code.name}")
    with pytest.raises(grpc.RpcError) as raised:
        infer(kind, server, retry=FAST)
    assert code_of(raised.value) is code
    assert server.count("ModelInfer") == 1
    assert server.count("SystemSharedMemoryRegister") == 0


@pytest.mark.parametrize("kind", KINDS)
def test_every_attempt_sends_the_remaining_budget(kind: str, server: ScriptedServer) -> None:
    deadline = 5.0
    spacing = 0.15  # no jitter: attempts are at least this far apart
    server.fail_infer(grpc.StatusCode.RESOURCE_EXHAUSTED, times=3)
    policy = RetryPolicy(initial_backoff=spacing, factor=1.0, jitter=False)
    infer(kind, server, deadline=deadline, retry=policy)
    calls = server.infers
    assert len(calls) == 4
    budgets = [call.reactant_timeout_ns for call in calls]
    timeouts = [call.timeout for call in calls]
    assert all(b is not None for b in budgets)
    assert all(t is not None for t in timeouts)
    ns = [b for b in budgets if b is not None]
    seconds = [t for t in timeouts if t is not None]
    assert 0 < ns[0] <= deadline * NS
    for before, after in itertools.pairwise(ns):
        assert before - after >= spacing * NS  # what was slept is gone from the budget
    for earlier, later in itertools.pairwise(seconds):
        assert later < earlier
    for budget, timeout in zip(ns, seconds, strict=True):
        assert 0 < timeout <= budget / NS + HEADER_ROUNDING_S
        assert timeout <= deadline + HEADER_ROUNDING_S


@pytest.mark.parametrize("kind", KINDS)
def test_a_server_that_always_sheds_gets_the_last_error_within_the_budget(
    kind: str, server: ScriptedServer
) -> None:
    deadline = 1.0
    # No jitter: waits 0.2 s, 0.4 s, then 0.8 s would end past deadline - min_budget: give up.
    policy = RetryPolicy(initial_backoff=0.2, jitter=False)
    server.fail_infer(grpc.StatusCode.RESOURCE_EXHAUSTED, times=1000)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as raised:
        infer(kind, server, deadline=deadline, retry=policy)
    elapsed = time.monotonic() - started
    # The shed itself comes back, not DEADLINE_EXCEEDED: the client gave up in time.
    assert code_of(raised.value) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert 2 <= server.count("ModelInfer") <= 3
    assert elapsed < deadline + 2.0  # generous: the give-up rule keeps it under the deadline
    for call in server.infers:
        assert call.reactant_timeout_ns is not None
        assert 0 < call.reactant_timeout_ns <= deadline * NS


@pytest.mark.parametrize("kind", KINDS)
def test_jittered_giving_up_respects_the_budget(kind: str, server: ScriptedServer) -> None:
    deadline = 0.6
    server.fail_infer(grpc.StatusCode.UNAVAILABLE, times=1000)
    with pytest.raises(grpc.RpcError) as raised:
        infer(kind, server, deadline=deadline, retry=RetryPolicy(initial_backoff=0.05))
    assert code_of(raised.value) is grpc.StatusCode.UNAVAILABLE
    # The first wait is below 0.05 s, far inside the budget: there is always a second try.
    assert server.count("ModelInfer") >= 2
    budgets = [call.reactant_timeout_ns or 0 for call in server.infers]
    assert all(0 < b <= deadline * NS for b in budgets)
    assert budgets == sorted(budgets, reverse=True)


@pytest.mark.parametrize("kind", KINDS)
def test_a_disabled_policy_makes_one_attempt_with_the_full_budget(
    kind: str, server: ScriptedServer
) -> None:
    deadline = 5.0
    server.fail_infer(grpc.StatusCode.RESOURCE_EXHAUSTED, times=2)
    with pytest.raises(grpc.RpcError) as raised:
        infer(kind, server, deadline=deadline, retry=RetryPolicy(enabled=False))
    assert code_of(raised.value) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert server.count("ModelInfer") == 1
    budget = server.infers[0].reactant_timeout_ns
    assert budget is not None
    assert deadline * NS - NS < budget <= deadline * NS
