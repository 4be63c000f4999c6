"""``reactantserver-gateway ctl`` against a real in-process GatewayControl server."""

from __future__ import annotations

import io
import json
import socket
import time
from collections.abc import Iterator
from concurrent import futures
from typing import TypeVar

import grpc
import pytest
from google.protobuf.message import Message

from reactantserver.core.protocol import control_pb2, control_pb2_grpc
from reactantserver.gateway import _ctl
from reactantserver.gateway._ctl import ctl_main

M = TypeVar("M", bound=Message)
Reply = Message | tuple[grpc.StatusCode, str]


class Scripted(control_pb2_grpc.GatewayControlServicer):
    """Answers each RPC with a scripted reply (or aborts) and records what it was sent."""

    def __init__(self) -> None:
        self.requests: list[Message] = []
        self.time_remaining: list[float] = []
        self.replies: dict[str, Reply] = {}

    def _answer(
        self, method: str, request: Message, context: grpc.ServicerContext, kind: type[M]
    ) -> M:
        self.requests.append(request)
        self.time_remaining.append(context.time_remaining())
        reply = self.replies.get(method, kind())
        if isinstance(reply, tuple):
            context.abort(*reply)
        assert isinstance(reply, kind)
        return reply

    def GetSchedulingStatus(
        self, request: control_pb2.GetSchedulingStatusRequest, context: grpc.ServicerContext
    ) -> control_pb2.GetSchedulingStatusResponse:
        kind = control_pb2.GetSchedulingStatusResponse
        return self._answer("GetSchedulingStatus", request, context, kind)

    def SetSchedulingPolicy(
        self, request: control_pb2.SetSchedulingPolicyRequest, context: grpc.ServicerContext
    ) -> control_pb2.SetSchedulingPolicyResponse:
        kind = control_pb2.SetSchedulingPolicyResponse
        return self._answer("SetSchedulingPolicy", request, context, kind)

    def SetModelPlacement(
        self, request: control_pb2.SetModelPlacementRequest, context: grpc.ServicerContext
    ) -> control_pb2.SetModelPlacementResponse:
        kind = control_pb2.SetModelPlacementResponse
        return self._answer("SetModelPlacement", request, context, kind)

    def Repack(
        self, request: control_pb2.RepackRequest, context: grpc.ServicerContext
    ) -> control_pb2.RepackResponse:
        return self._answer("Repack", request, context, control_pb2.RepackResponse)


@pytest.fixture
def gateway() -> Iterator[tuple[Scripted, str]]:
    servicer = Scripted()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    control_pb2_grpc.add_GatewayControlServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def ctl(target: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = ctl_main(["--target", target, *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


LPT_STATUS = control_pb2.GetSchedulingStatusResponse(
    mode="lpt_packing",
    policy=control_pb2.SchedulingPolicy(
        rebalance_compute_seconds=300,
        ema_halflife_compute_seconds=300,
        default_replicas=-1,
        routing_fill_mode="run",
        forbid_memory_oversubscription=True,
        generation=2,
    ),
    repack=control_pb2.RepackStatus(
        last_trigger="compute",
        repack_count=4,
        last_models_placed=2,
        last_models_moved=1,
        compute_accumulated_seconds=12.5,
        active_threshold_seconds=300,
        first_tick_repack_done=True,
    ),
    models=[
        control_pb2.ModelSchedulingStatus(
            name="resnet",
            configured_replicas=2,
            effective_replicas=2,
            replicas=[
                control_pb2.ReplicaPlacement(worker="w0:8001", weight=0.5, outstanding=3),
                control_pb2.ReplicaPlacement(worker="w1:8001", weight=0.5, outstanding=1),
            ],
            utilization=0.25,
            fill_mode="run",
            fill_quantum=32,
            placed=True,
        ),
        control_pb2.ModelSchedulingStatus(name="bert", effective_replicas=1, drifted=True),
    ],
    workers=[
        control_pb2.WorkerSchedulingStatus(
            worker="w0:8001", ready=True, models_placed=1, weight_budget_bytes=10**9
        ),
        control_pb2.WorkerSchedulingStatus(worker="w1:8001", oversubscribed=True),
    ],
    warnings=["model bert is drifted"],
)


def test_status_prints_a_readable_table(gateway: tuple[Scripted, str]) -> None:
    servicer, target = gateway
    servicer.replies["GetSchedulingStatus"] = LPT_STATUS
    code, out, err = ctl(target, "status")
    assert (code, err) == (0, "")
    assert servicer.requests == [control_pb2.GetSchedulingStatusRequest()]
    lines = out.splitlines()
    assert lines[0] == "mode: lpt_packing"
    assert lines[1] == "policy (generation 2):"
    assert any(line.split() == ["default_replicas", "all"] for line in lines)
    assert any(line.split() == ["forbid_memory_oversubscription", "true"] for line in lines)
    assert any(line.split() == ["rebalance_compute_seconds", "300"] for line in lines)
    assert not any(line.split()[:1] == ["generation"] for line in lines)
    assert "repack: 4 done, last by compute (placed 2, moved 1)" in lines
    assert "  compute 12.5 / 300 s; operator repacks 0/0" in lines
    resnet = next(line for line in lines if line.strip().startswith("resnet"))
    assert resnet.split() == [
        "resnet", "2", "2", "w0:8001(3),w1:8001(1)", "0.250", "0", "0", "run", "32", "placed"
    ]  # fmt: skip
    bert = next(line for line in lines if line.strip().startswith("bert"))
    assert bert.split() == ["bert", "default", "1", "-", "0.000", "0", "0", "0", "drifted"]
    w0 = next(line for line in lines if line.strip().startswith("w0:8001"))
    assert w0.split() == ["w0:8001", "yes", "1", "0", "0", "1000000000", "no"]
    w1 = next(line for line in lines if line.strip().startswith("w1:8001"))
    assert w1.split() == ["w1:8001", "no", "0", "0", "0", "-", "yes"]
    assert lines[-1] == "warning: model bert is drifted"


def test_status_says_how_long_ago_the_last_repack_ran(gateway: tuple[Scripted, str]) -> None:
    servicer, target = gateway
    status = control_pb2.GetSchedulingStatusResponse()
    status.CopyFrom(LPT_STATUS)
    status.repack.last_repack_unix_seconds = time.time() - 42.2
    status.repack.first_tick_repack_done = False
    servicer.replies["GetSchedulingStatus"] = status
    lines = ctl(target, "status")[1].splitlines()
    assert "repack: 4 done, last by compute 42 s ago (placed 2, moved 1)" in lines
    assert "  compute 12.5 / 300 s (first budget); operator repacks 0/0" in lines


def test_status_in_round_robin_shows_only_the_mode(gateway: tuple[Scripted, str]) -> None:
    servicer, target = gateway
    servicer.replies["GetSchedulingStatus"] = control_pb2.GetSchedulingStatusResponse(
        mode="round_robin"
    )
    assert ctl(target, "status") == (0, "mode: round_robin\n", "")


def test_status_json_is_the_message(gateway: tuple[Scripted, str]) -> None:
    servicer, target = gateway
    servicer.replies["GetSchedulingStatus"] = LPT_STATUS
    code, out, _ = ctl(target, "status", "--json")
    assert code == 0
    parsed = json.loads(out)
    assert parsed["mode"] == "lpt_packing"
    assert parsed["policy"]["default_replicas"] == "-1"  # int64 is a JSON string
    assert parsed["policy"]["hysteresis"] == 0.0  # zero fields are printed too
    assert parsed["models"][0]["replicas"][1]["worker"] == "w1:8001"


def test_repack_waits_and_extends_the_deadline(gateway: tuple[Scripted, str]) -> None:
    servicer, target = gateway
    servicer.replies["Repack"] = control_pb2.RepackResponse(
        sequence=5, completed_sequence=5, completed=True, waited_seconds=0.25
    )
    code, out, _ = ctl(target, "--timeout", "3", "repack", "--wait", "30")
    assert code == 0
    assert servicer.requests == [control_pb2.RepackRequest(wait_seconds=30)]
    assert 30 < servicer.time_remaining[0] < 34
    assert out == "repack #5 completed (completed through #5, waited 0.25 s)\n"


def test_repack_without_wait_reports_pending_and_warnings(gateway: tuple[Scripted, str]) -> None:
    servicer, target = gateway
    servicer.replies["Repack"] = control_pb2.RepackResponse(
        sequence=6, completed_sequence=5, warnings=["wait clamped"]
    )
    code, out, _ = ctl(target, "repack")
    assert code == 0
    assert servicer.requests == [control_pb2.RepackRequest(wait_seconds=0)]
    assert servicer.time_remaining[0] < _ctl.DEFAULT_TIMEOUT_SECONDS + 1  # deadline jitter
    assert out.splitlines() == [
        "repack #6 pending (completed through #5, waited 0.00 s)",
        "warning: wait clamped",
    ]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["m", "3"], control_pb2.SetModelPlacementRequest(name="m", replicas=3, fill_factor=-1)),
        (["m", "ALL"], control_pb2.SetModelPlacementRequest(name="m", replicas=-1, fill_factor=-1)),
        (["m", "default"], control_pb2.SetModelPlacementRequest(name="m", fill_factor=-1)),
        (
            ["m", "all", "--fill-mode", "spread", "--fill-factor", "0.5", "--allow-unknown"],
            control_pb2.SetModelPlacementRequest(
                name="m",
                replicas=-1,
                fill_mode="spread",
                fill_factor=0.5,
                allow_unknown_model=True,
            ),
        ),
        (
            ["m", "2", "--fill-mode", "inherit", "--fill-factor", "default"],
            control_pb2.SetModelPlacementRequest(name="m", replicas=2, fill_mode="inherit"),
        ),
    ],
)
def test_set_replicas_sends_the_exact_request(
    gateway: tuple[Scripted, str],
    argv: list[str],
    expected: control_pb2.SetModelPlacementRequest,
) -> None:
    servicer, target = gateway
    assert ctl(target, "set-replicas", *argv)[0] == 0
    assert servicer.requests == [expected]


def test_set_replicas_prints_the_answer(gateway: tuple[Scripted, str]) -> None:
    servicer, target = gateway
    servicer.replies["SetModelPlacement"] = control_pb2.SetModelPlacementResponse(
        name="m",
        configured_replicas=-1,
        effective_replicas=3,
        fill_mode="spread",
        fill_quantum=16,
        warnings=["replica changes take effect at the next repack"],
    )
    code, out, _ = ctl(target, "set-replicas", "m", "all")
    assert code == 0
    assert out.splitlines() == [
        "m: replicas all (effective 3), fill spread (quantum 16)",
        "warning: replica changes take effect at the next repack",
    ]


def test_set_policy_builds_the_mask_from_typed_pairs(gateway: tuple[Scripted, str]) -> None:
    servicer, target = gateway
    servicer.replies["SetSchedulingPolicy"] = control_pb2.SetSchedulingPolicyResponse(
        applied=control_pb2.SchedulingPolicy(
            hysteresis=0.2, default_replicas=-1, forbid_memory_oversubscription=False, generation=3
        ),
        warnings=["half-life"],
    )
    code, out, _ = ctl(
        target,
        "set-policy",
        "hysteresis=0.1",
        "default_replicas=all",
        "forbid_memory_oversubscription=False",
        "routing_fill_mode=spread",
        "compaction_interval=3",
        "hysteresis=0.2",
    )
    assert code == 0
    assert servicer.requests == [
        control_pb2.SetSchedulingPolicyRequest(
            update_mask=[
                "hysteresis",
                "default_replicas",
                "forbid_memory_oversubscription",
                "routing_fill_mode",
                "compaction_interval",
            ],
            policy=control_pb2.SchedulingPolicy(
                hysteresis=0.2,
                default_replicas=-1,
                forbid_memory_oversubscription=False,
                routing_fill_mode="spread",
                compaction_interval=3,
            ),
        )
    ]
    assert out.splitlines()[:4] == [
        "applied (generation 3, not persisted):",
        "  hysteresis = 0.2",
        "  default_replicas = all",
        "  forbid_memory_oversubscription = false",
    ]
    assert out.splitlines()[-1] == "warning: half-life"


def test_set_policy_json(gateway: tuple[Scripted, str]) -> None:
    servicer, target = gateway
    code, out, _ = ctl(target, "set-policy", "--json", "work_basis=items")
    assert code == 0
    assert json.loads(out)["persisted"] is False
    assert servicer.requests == [
        control_pb2.SetSchedulingPolicyRequest(
            update_mask=["work_basis"], policy=control_pb2.SchedulingPolicy(work_basis="items")
        )
    ]


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["set-policy"],
        ["set-policy", "hysteresis"],
        ["set-policy", "nonsense=1"],
        ["set-policy", "hysteresis=high"],
        ["set-policy", "forbid_memory_oversubscription=yes"],
        ["set-policy", "compaction_interval=1.5"],
        ["set-replicas", "m"],
        ["set-replicas", "m", "0"],
        ["set-replicas", "m", "-1"],
        ["set-replicas", "m", "two"],
        ["set-replicas", "m", "2", "--fill-mode", "fast"],
        ["set-replicas", "m", "2", "--fill-factor", "-1"],
        ["repack", "--wait", "-1"],
        ["repack", "--wait", "soon"],
    ],
)
def test_usage_errors_exit_2_without_calling(
    gateway: tuple[Scripted, str], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    servicer, target = gateway
    assert ctl(target, *argv)[0] == 2
    assert servicer.requests == []
    assert "usage: reactantserver-gateway ctl" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert ctl_main(["set-policy", "--help"]) == 0
    assert "KEY=VALUE" in capsys.readouterr().out


def test_grpc_errors_print_code_and_details(gateway: tuple[Scripted, str]) -> None:
    servicer, target = gateway
    servicer.replies["SetSchedulingPolicy"] = (
        grpc.StatusCode.INVALID_ARGUMENT,
        "hysteresis must be a finite number in [0, 1), got 1.5",
    )
    code, out, err = ctl(target, "set-policy", "hysteresis=1.5")
    assert (code, out) == (1, "")
    assert err == "error: INVALID_ARGUMENT: hysteresis must be a finite number in [0, 1), got 1.5\n"
    servicer.replies["Repack"] = (grpc.StatusCode.FAILED_PRECONDITION, "needs lpt_packing")
    assert ctl(target, "repack")[1:] == ("", "error: FAILED_PRECONDITION: needs lpt_packing\n")


def test_unreachable_gateway_is_unavailable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, out, err = ctl(f"127.0.0.1:{port}", "--timeout", "5", "status")
    assert (code, out) == (1, "")
    assert err.startswith("error: UNAVAILABLE: ")


def test_default_target_is_the_local_gateway() -> None:
    assert _ctl.DEFAULT_TARGET == "127.0.0.1:8001"
