"""``reactantserver-gateway ctl``: the operator CLI over ``GatewayControl``.

``argv`` is what follows ``ctl`` on the command line::

    reactantserver-gateway ctl --target gw:8001 status [--json]
    reactantserver-gateway ctl repack --wait 30
    reactantserver-gateway ctl set-replicas resnet all --fill-mode spread
    reactantserver-gateway ctl set-policy hysteresis=0.1 default_replicas=all

Exit status: 0 on success, 1 when the gateway answers with an error (printed to stderr as
``error: <CODE>: <details>``), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from reactantserver.core.protocol import control_pb2, control_pb2_grpc

__all__ = ["DEFAULT_TARGET", "DEFAULT_TIMEOUT_SECONDS", "ctl_main"]

#: The gateway's default ``listen.grpc`` as seen from the same host.
DEFAULT_TARGET = "127.0.0.1:8001"
#: Deadline of one control call; ``repack --wait S`` adds ``S`` to it.
DEFAULT_TIMEOUT_SECONDS = 10.0

_Stub = Any  # control_pb2_grpc.GatewayControlStub (grpc is untyped here)
_POLICY_FIELDS = control_pb2.SchedulingPolicy.DESCRIPTOR.fields_by_name
_FILL_MODES = ("run", "spread", "inflight", "inherit")


def _policy_text(name: str, value: object) -> str:
    if name == "default_replicas" and value == -1:
        return "all"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _assignment(text: str) -> tuple[str, object]:
    """Parse one ``KEY=VALUE`` of ``set-policy`` by the ``SchedulingPolicy`` field's type."""
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    field = _POLICY_FIELDS.get(key)
    if not sep or field is None:
        known = ", ".join(_POLICY_FIELDS)
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE with KEY one of {known}: {text!r}")
    try:
        if field.type == FieldDescriptor.TYPE_DOUBLE:
            return key, float(raw)
        if field.type == FieldDescriptor.TYPE_BOOL:
            return key, {"true": True, "false": False}[raw.lower()]
        if field.type in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64):
            return key, -1 if key == "default_replicas" and raw.lower() == "all" else int(raw)
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"bad value for {key}: {raw!r}") from None
    return key, raw


def _replicas(text: str) -> int:
    """``n`` (>= 1), ``all`` (-1) or ``default`` (0: clear the override)."""
    special = {"all": -1, "default": 0}
    if text.lower() in special:
        return special[text.lower()]
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, 'all' or 'default': {text!r}")
    return value


def _fill_factor(text: str) -> float:
    """A factor > 0, or ``0``/``default`` to clear the override."""
    if text.lower() in ("default", "inherit"):
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0 or 'default': {text!r}")
    return value


def _wait(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0: {text!r}")
    return value


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in (headers, *rows)
    ]


def _print_status(response: control_pb2.GetSchedulingStatusResponse, out: TextIO) -> None:
    lines = [f"mode: {response.mode}"]
    if response.HasField("policy"):
        policy = response.policy
        lines.append(f"policy (generation {policy.generation}):")
        width = max(len(n) for n in _POLICY_FIELDS)
        for name in _POLICY_FIELDS:
            if name != "generation":
                value = _policy_text(name, getattr(policy, name))
                lines.append(f"  {name.ljust(width)}  {value}")
    if response.HasField("repack"):
        r = response.repack
        ago = time.time() - r.last_repack_unix_seconds
        when = f" {ago:.0f} s ago" if r.last_repack_unix_seconds else ""
        lines += [
            f"repack: {r.repack_count} done, last by {r.last_trigger or 'none'}{when} "
            f"(placed {r.last_models_placed}, moved {r.last_models_moved})",
            f"  compute {r.compute_accumulated_seconds:g} / {r.active_threshold_seconds:g} s"
            f"{'' if r.first_tick_repack_done else ' (first budget)'}; operator repacks "
            f"{r.operator_repacks_completed}/{r.operator_repacks_requested}",
        ]
    if response.models:
        lines.append("models:")
        headers: tuple[str, ...] = ("MODEL", "REPLICAS", "EFFECTIVE", "WORKERS", "UTIL")
        headers += ("RATE/S", "COST_S", "FILL", "Q", "STATE")
        rows: list[tuple[str, ...]] = [
            (
                m.name,
                _policy_text("default_replicas", m.configured_replicas)
                if m.configured_replicas
                else "default",
                str(m.effective_replicas),
                ",".join(f"{p.worker}({p.outstanding})" for p in m.replicas) or "-",
                f"{m.utilization:.3f}",
                f"{m.arrival_rate:.3g}",
                f"{m.cost_seconds:.3g}",
                m.fill_mode,
                str(m.fill_quantum),
                "drifted" if m.drifted else ("placed" if m.placed else "unplaced"),
            )
            for m in response.models
        ]
        lines += [f"  {line}" for line in _table(headers, rows)]
    if response.workers:
        lines.append("workers:")
        headers = ("WORKER", "READY", "MODELS", "INFLIGHT_S", "ASSIGNED_B", "BUDGET_B", "OVER")
        rows = [
            (
                w.worker,
                "yes" if w.ready else "no",
                str(w.models_placed),
                f"{w.inflight_compute:.3g}",
                str(w.assigned_weight_bytes),
                str(w.weight_budget_bytes) if w.weight_budget_bytes else "-",
                "yes" if w.oversubscribed else "no",
            )
            for w in response.workers
        ]
        lines += [f"  {line}" for line in _table(headers, rows)]
    lines += [f"warning: {w}" for w in response.warnings]
    print("\n".join(lines), file=out)


def _status(stub: _Stub, args: argparse.Namespace, out: TextIO) -> Message:
    response = stub.GetSchedulingStatus(
        control_pb2.GetSchedulingStatusRequest(), timeout=args.timeout
    )
    if not args.json:
        _print_status(response, out)
    return response  # type: ignore[no-any-return]


def _repack(stub: _Stub, args: argparse.Namespace, out: TextIO) -> Message:
    request = control_pb2.RepackRequest(wait_seconds=args.wait)
    response = stub.Repack(request, timeout=args.timeout + args.wait)
    if not args.json:
        state = "completed" if response.completed else "pending"
        print(
            f"repack #{response.sequence} {state} (completed through "
            f"#{response.completed_sequence}, waited {response.waited_seconds:.2f} s)",
            file=out,
        )
        for warning in response.warnings:
            print(f"warning: {warning}", file=out)
    return response  # type: ignore[no-any-return]


def _set_replicas(stub: _Stub, args: argparse.Namespace, out: TextIO) -> Message:
    request = control_pb2.SetModelPlacementRequest(
        name=args.model,
        replicas=args.replicas,
        fill_mode=args.fill_mode or "",
        fill_factor=-1.0 if args.fill_factor is None else args.fill_factor,
        allow_unknown_model=args.allow_unknown,
    )
    response = stub.SetModelPlacement(request, timeout=args.timeout)
    if not args.json:
        configured = response.configured_replicas
        print(
            f"{response.name}: replicas "
            f"{_policy_text('default_replicas', configured) if configured else 'default'}"
            f" (effective {response.effective_replicas}), fill {response.fill_mode}"
            f" (quantum {response.fill_quantum})",
            file=out,
        )
        for warning in response.warnings:
            print(f"warning: {warning}", file=out)
    return response  # type: ignore[no-any-return]


def _set_policy(stub: _Stub, args: argparse.Namespace, out: TextIO) -> Message:
    values = dict(args.assignments)  # a repeated key: the last value wins
    request = control_pb2.SetSchedulingPolicyRequest(
        update_mask=list(values), policy=control_pb2.SchedulingPolicy(**values)
    )
    response = stub.SetSchedulingPolicy(request, timeout=args.timeout)
    if not args.json:
        applied = response.applied
        print(f"applied (generation {applied.generation}, not persisted):", file=out)
        for name in values:
            print(f"  {name} = {_policy_text(name, getattr(applied, name))}", file=out)
        for warning in response.warnings:
            print(f"warning: {warning}", file=out)
    return response  # type: ignore[no-any-return]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reactantserver-gateway ctl", description="Inspect and steer a running gateway."
    )
    parser.add_argument("--target", default=DEFAULT_TARGET, help="gateway host:port")
    parser.add_argument(
        "--timeout", type=_wait, default=DEFAULT_TIMEOUT_SECONDS, help="call deadline (s)"
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the response as JSON")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = commands.add_parser("status", parents=[common], help="scheduling status")
    status.set_defaults(run=_status)
    repack = commands.add_parser("repack", parents=[common], help="request a repack")
    repack.add_argument("--wait", type=_wait, default=0.0, help="seconds to wait (max 120)")
    repack.set_defaults(run=_repack)
    replicas = commands.add_parser("set-replicas", parents=[common], help="per-model override")
    replicas.add_argument("model")
    replicas.add_argument("replicas", type=_replicas, metavar="n|all|default")
    replicas.add_argument("--fill-mode", choices=_FILL_MODES)
    replicas.add_argument("--fill-factor", type=_fill_factor, metavar="F|default")
    replicas.add_argument("--allow-unknown", action="store_true", help="store for a new model")
    replicas.set_defaults(run=_set_replicas)
    policy = commands.add_parser("set-policy", parents=[common], help="change live knobs")
    policy.add_argument("assignments", nargs="+", type=_assignment, metavar="KEY=VALUE")
    policy.set_defaults(run=_set_policy)
    return parser


def ctl_main(argv: Sequence[str], *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``ctl`` with the arguments after ``ctl``; returns the exit status (0, 1 or 2).

    ``out`` and ``err`` default to the ``sys`` streams at call time.
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exc:  # argparse: usage error (2) or --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    run: Callable[[_Stub, argparse.Namespace, TextIO], Message] = args.run
    try:
        with grpc.insecure_channel(args.target) as channel:
            response = run(control_pb2_grpc.GatewayControlStub(channel), args, out)
    except grpc.RpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=err)
        return 1
    if args.json:
        text = json_format.MessageToJson(
            response,
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )
        print(text, file=out)
    return 0
