"""Live scheduling knobs and the semantics of the GatewayControl mutators.

Pure: no I/O, no clocks, no locks. The control service holds one :class:`SchedulingKnobs`
snapshot and one overrides map, and swaps in what these functions return::

    knobs = SchedulingKnobs.from_values({"rebalance_compute_seconds": 120})
    knobs, warnings = apply_policy_request(
        knobs, request, mode="lpt_packing", compute_accumulated=40.0, first_repack_done=True
    )
    wait, warnings = validate_repack_wait(repack_request.wait_seconds)

Per-model overrides (``SetModelPlacement``) live in :mod:`.overrides`. Rejections carry their
gRPC status (core ``errors``): :class:`KnobError` ``INVALID_ARGUMENT``, :class:`KnobModeError`
``FAILED_PRECONDITION``, :class:`UnknownModelError` ``NOT_FOUND``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import attrs

from reactantserver.core.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    ModelNotFoundError,
)
from reactantserver.core.protocol import control_pb2
from reactantserver.gateway.config import Replicas

__all__ = [
    "COMPACTION_MODES",
    "FILL_MODES",
    "INFLIGHT_HAZARD",
    "MAX_REPACK_WAIT_SECONDS",
    "ROUTING_POLICIES",
    "RPC_MODES",
    "SCHEDULING_MODES",
    "WORK_BASES",
    "KnobError",
    "KnobModeError",
    "SchedulingKnobs",
    "UnknownModelError",
    "apply_policy_request",
    "apply_policy_update",
    "check_mode",
    "to_proto",
    "validate_repack_wait",
]

SCHEDULING_MODES = ("round_robin", "lpt_packing", "model_aware")
ROUTING_POLICIES = ("fill_least", "fill_rr")
FILL_MODES = ("run", "spread", "inflight")
COMPACTION_MODES = ("off", "eager", "scheduled")
WORK_BASES = ("compute", "items", "requests")
#: ``Repack.wait_seconds`` above this is clamped (with a warning).
MAX_REPACK_WAIT_SECONDS = 120.0
#: The warning for the legacy ``inflight`` fill mode (start-up, status and policy changes).
INFLIGHT_HAZARD = (
    "fill mode 'inflight' (legacy) keeps a model whose concurrency stays between 2 and its fill "
    "quantum on one replica; prefer 'run' or 'spread'"
)
#: The scheduling modes each GatewayControl mutator serves (else ``FAILED_PRECONDITION``).
RPC_MODES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "SetSchedulingPolicy": ("lpt_packing", "model_aware"),
        "SetModelPlacement": ("lpt_packing",),
        "Repack": ("lpt_packing",),
    }
)

_LPT_FIELDS = frozenset(
    {
        "rebalance_compute_seconds",
        "first_rebalance_compute_seconds",
        "hysteresis",
        "ema_halflife_compute_seconds",
        "default_replicas",
        "routing_policy",
        "routing_fill_factor",
        "routing_fill_mode",
        "compaction_mode",
        "compaction_interval",
        "forbid_memory_oversubscription",
        "work_basis",
    }
)
# model_aware weighs requests by compute only (work_basis does not apply) but its cost per item
# comes from the RoutingMeta EWMA, so the half-life applies.
_MODEL_AWARE_FIELDS = frozenset(
    {
        "ema_halflife_compute_seconds",
        "cold_load_penalty",
        "default_load_bandwidth_bytes_per_second",
        "load_overhead_seconds",
    }
)
_SETTABLE = {"lpt_packing": _LPT_FIELDS, "model_aware": _MODEL_AWARE_FIELDS}
_STARTUP_ONLY = frozenset({"mode", "scheduling_mode", "endpoints", "listen"})
_BUDGETS = frozenset({"rebalance_compute_seconds", "first_rebalance_compute_seconds"})

_NUMBER_RULES: Mapping[str, tuple[Callable[[float], bool], str]] = {
    "rebalance_compute_seconds": (lambda v: v > 0, "> 0"),
    "first_rebalance_compute_seconds": (lambda v: v >= 0, ">= 0"),
    "hysteresis": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "ema_halflife_compute_seconds": (lambda v: v >= 0, ">= 0"),
    "routing_fill_factor": (lambda v: v > 0, "> 0"),
    "compaction_interval": (lambda v: v >= 0, ">= 0"),
    "cold_load_penalty": (lambda v: v >= 1.0, ">= 1.0"),
    "default_load_bandwidth_bytes_per_second": (lambda v: v > 0, "> 0"),
    "load_overhead_seconds": (lambda v: v >= 0, ">= 0"),
    "generation": (lambda v: v >= 0, ">= 0"),
}
_CHOICES: Mapping[str, tuple[str, ...]] = {
    "routing_policy": ROUTING_POLICIES,
    "routing_fill_mode": FILL_MODES,
    "compaction_mode": COMPACTION_MODES,
    "work_basis": WORK_BASES,
}
_INTS = frozenset({"compaction_interval", "generation"})


class KnobError(InvalidArgumentError, ValueError):
    """A knob value, update mask or placement request breaks the rules; ``fields`` names them."""

    def __init__(self, message: str, fields: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.fields = tuple(fields)


class KnobModeError(FailedPreconditionError):
    """The running scheduling mode does not serve this control RPC."""


class UnknownModelError(ModelNotFoundError):
    """``SetModelPlacement`` names a model no worker routes (and unknown models are not allowed)."""


def _problem(name: str, value: object) -> str | None:
    """The rule ``value`` breaks for knob ``name``, or ``None`` when it is valid."""
    if name in _CHOICES:
        choices = _CHOICES[name]
        return None if value in choices else f"{name} must be one of {'|'.join(choices)}"
    if name == "default_replicas":
        ok = value == "all" or (type(value) is int and value >= 1)
        return None if ok else "default_replicas must be an int >= 1 or 'all' (-1 on the wire)"
    if name == "forbid_memory_oversubscription":
        return None if isinstance(value, bool) else f"{name} must be true or false"
    check, rule = _NUMBER_RULES[name]
    kind = "an int" if name in _INTS else "a finite number"
    wrong = f"{name} must be {kind} {rule}, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, int if name in _INTS else int | float):
        return wrong
    return None if math.isfinite(value) and check(value) else wrong


@attrs.frozen
class SchedulingKnobs:
    """One immutable snapshot of the live scheduling knobs.

    Construction validates every field against the YAML bounds and raises :class:`KnobError`
    naming all offending fields. ``generation`` is 0 as configured, +1 per accepted mutation.
    """

    rebalance_compute_seconds: float = 300.0
    first_rebalance_compute_seconds: float = 60.0
    hysteresis: float = 0.0
    ema_halflife_compute_seconds: float = 0.0
    default_replicas: Replicas = 1
    routing_policy: str = "fill_least"
    routing_fill_factor: float = 1.0
    routing_fill_mode: str = "run"
    compaction_mode: str = "eager"
    compaction_interval: int = 1
    forbid_memory_oversubscription: bool = True
    work_basis: str = "compute"
    cold_load_penalty: float = 1.0
    default_load_bandwidth_bytes_per_second: float = 8e9
    load_overhead_seconds: float = 0.005
    generation: int = 0

    def __attrs_post_init__(self) -> None:
        problems = [
            (a.name, p)
            for a in attrs.fields(SchedulingKnobs)
            if (p := _problem(a.name, getattr(self, a.name))) is not None
        ]
        if problems:
            raise KnobError("; ".join(p for _, p in problems), [n for n, _ in problems])

    @classmethod
    def from_values(cls, values: Mapping[str, object]) -> SchedulingKnobs:
        """Build knobs from plain (YAML or env) values keyed by field name; the rest default.

        Numbers may be numeric strings, booleans ``true``/``false`` strings; ``work_basis`` and
        ``default_replicas: all`` are case-insensitive. Unknown or ill-typed keys raise
        :class:`KnobError`, as do out-of-bounds values.
        """
        known = {a.name: a for a in attrs.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise KnobError(f"unknown scheduling knobs: {', '.join(unknown)}", unknown)
        converted: dict[str, object] = {}
        bad: list[str] = []
        for name, value in values.items():
            try:
                converted[name] = _plain(name, value)
            except (KeyError, TypeError, ValueError):
                bad.append(name)
        if bad:
            raise KnobError(f"ill-typed scheduling knobs: {', '.join(sorted(bad))}", sorted(bad))
        return cls(**converted)  # type: ignore[arg-type]

    @property
    def halflife(self) -> float:
        """The EWMA half-life in compute-seconds: the knob if > 0, else the rebalance budget."""
        if self.ema_halflife_compute_seconds > 0:
            return self.ema_halflife_compute_seconds
        return self.rebalance_compute_seconds

    def active_threshold(self, first_repack_done: bool) -> float:
        """The compute budget of the next tick-driven repack."""
        if not first_repack_done and self.first_rebalance_compute_seconds > 0:
            return self.first_rebalance_compute_seconds
        return self.rebalance_compute_seconds


def _plain(name: str, value: object) -> object:
    """Convert one plain value to the knob's type (raises on a type that cannot be one)."""
    if not isinstance(value, str):
        if isinstance(value, bool) or not isinstance(value, int | float):
            if name == "forbid_memory_oversubscription" or name in _CHOICES:
                return value  # validation names the rule
            raise TypeError(name)
        return value if name in _INTS or name == "default_replicas" else float(value)
    text = value.strip()
    if name in _CHOICES:
        return text.lower() if name == "work_basis" else text
    if name == "forbid_memory_oversubscription":
        return {"true": True, "false": False}[text.lower()]
    if name == "default_replicas" and text.lower() == "all":
        return "all"
    return int(text) if name in _INTS or name == "default_replicas" else float(text)


def to_proto(knobs: SchedulingKnobs) -> control_pb2.SchedulingPolicy:
    """The wire form: ``default_replicas`` ``all`` is -1, the half-life is resolved."""
    return control_pb2.SchedulingPolicy(
        rebalance_compute_seconds=knobs.rebalance_compute_seconds,
        first_rebalance_compute_seconds=knobs.first_rebalance_compute_seconds,
        hysteresis=knobs.hysteresis,
        ema_halflife_compute_seconds=knobs.halflife,
        default_replicas=-1 if knobs.default_replicas == "all" else knobs.default_replicas,
        routing_policy=knobs.routing_policy,
        routing_fill_factor=knobs.routing_fill_factor,
        routing_fill_mode=knobs.routing_fill_mode,
        compaction_mode=knobs.compaction_mode,
        compaction_interval=knobs.compaction_interval,
        forbid_memory_oversubscription=knobs.forbid_memory_oversubscription,
        generation=knobs.generation,
        work_basis=knobs.work_basis,
        cold_load_penalty=knobs.cold_load_penalty,
        default_load_bandwidth_bytes_per_second=knobs.default_load_bandwidth_bytes_per_second,
        load_overhead_seconds=knobs.load_overhead_seconds,
    )


def check_mode(rpc: str, mode: str) -> None:
    """Raise :class:`KnobModeError` unless scheduling ``mode`` serves control ``rpc``."""
    if mode not in SCHEDULING_MODES:
        raise ValueError(f"unknown scheduling mode {mode!r}")
    if mode not in RPC_MODES[rpc]:
        served = " and ".join(RPC_MODES[rpc])
        raise KnobModeError(f"{rpc} needs scheduling mode {served}; the gateway runs {mode}")


def _from_wire(name: str, policy: control_pb2.SchedulingPolicy) -> object:
    value: object = getattr(policy, name)
    if name == "default_replicas":
        return "all" if value == -1 else value
    if name == "work_basis":
        return str(value).lower()
    return value


def _mask_problems(names: Sequence[str], mode: str) -> list[tuple[str, str]]:
    """(field, rule) for every mask entry that cannot be set in ``mode``."""
    problems: list[tuple[str, str]] = []
    for name in names:
        if name in _STARTUP_ONLY:
            problems.append((name, f"{name} is start-up only; restart the gateway to change it"))
        elif name == "generation":
            problems.append((name, "generation is read only"))
        elif name not in _LPT_FIELDS | _MODEL_AWARE_FIELDS:
            problems.append((name, f"unknown field {name!r}"))
        elif name not in _SETTABLE[mode]:
            problems.append((name, f"{name} does not apply to scheduling mode {mode}"))
    return problems


def apply_policy_update(
    knobs: SchedulingKnobs,
    mask: Sequence[str],
    policy: control_pb2.SchedulingPolicy | None,
    *,
    mode: str,
    compute_accumulated: float,
    first_repack_done: bool,
) -> tuple[SchedulingKnobs, list[str]]:
    """``SetSchedulingPolicy``: the new snapshot (``generation + 1``) and warnings for the caller.

    ``policy`` is ``None`` when the request leaves it unset. All-or-nothing: any bad mask entry
    or value raises :class:`KnobError` listing every problem, and ``knobs`` stays in force.
    ``lpt_packing`` takes fields 1-11 and 13; ``model_aware`` takes 4 and 14-16.

    Raises:
        KnobModeError: ``mode`` is ``round_robin``.
        KnobError: empty mask, unset policy, a mask entry that is unknown, start-up only, read
            only or not of this mode, or a value outside its configured bounds.
    """
    check_mode("SetSchedulingPolicy", mode)
    if policy is None:
        raise KnobError("policy is not set", ["policy"])
    if not mask:
        raise KnobError("update_mask is empty: name the fields to change", ["update_mask"])
    names = list(dict.fromkeys(mask))
    if problems := _mask_problems(names, mode):
        raise KnobError("; ".join(p for _, p in problems), [n for n, _ in problems])
    changes = {name: _from_wire(name, policy) for name in names}
    new = attrs.evolve(knobs, generation=knobs.generation + 1, **changes)  # type: ignore[arg-type]
    warnings: list[str] = []
    if _BUDGETS & set(names):
        threshold = new.active_threshold(first_repack_done)
        if compute_accumulated >= threshold:
            warnings.append(
                f"accumulated compute {compute_accumulated:g} s already reaches the new budget "
                f"{threshold:g} s: a repack runs on the next tick"
            )
        if "first_rebalance_compute_seconds" in names and first_repack_done:
            warnings.append(
                "the first-repack budget is already consumed: first_rebalance_compute_seconds "
                "has no effect until the gateway restarts"
            )
    if new.halflife != knobs.halflife:
        warnings.append(
            f"EWMA half-life {knobs.halflife:g} -> {new.halflife:g} compute-seconds applies to "
            "new samples only; history is not re-folded"
        )
    if "routing_fill_mode" in names and new.routing_fill_mode == "inflight":
        warnings.append(INFLIGHT_HAZARD)
    return new, warnings


def apply_policy_request(
    knobs: SchedulingKnobs,
    request: control_pb2.SetSchedulingPolicyRequest,
    *,
    mode: str,
    compute_accumulated: float,
    first_repack_done: bool,
) -> tuple[SchedulingKnobs, list[str]]:
    """:func:`apply_policy_update` on a wire request (an unset ``policy`` field is rejected)."""
    return apply_policy_update(
        knobs,
        list(request.update_mask),
        request.policy if request.HasField("policy") else None,
        mode=mode,
        compute_accumulated=compute_accumulated,
        first_repack_done=first_repack_done,
    )


def validate_repack_wait(wait_seconds: float) -> tuple[float, list[str]]:
    """``Repack.wait_seconds``: < 0 (or NaN) raises :class:`KnobError`; > 120 s is clamped."""
    if not wait_seconds >= 0:
        raise KnobError(f"wait_seconds must be >= 0, got {wait_seconds!r}", ["wait_seconds"])
    if wait_seconds > MAX_REPACK_WAIT_SECONDS:
        return MAX_REPACK_WAIT_SECONDS, [
            f"wait_seconds {wait_seconds:g} clamped to {MAX_REPACK_WAIT_SECONDS:g}"
        ]
    return wait_seconds, []
