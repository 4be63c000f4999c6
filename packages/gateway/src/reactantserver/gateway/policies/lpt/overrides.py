"""Per-model placement overrides and ``SetModelPlacement``.

Pure, like :mod:`.knobs`: the control service keeps one overrides map (seeded from
``scheduling.models``) and installs the one this returns::

    result = apply_placement_request(
        overrides, request, known_models=routed, ready_workers=3, knobs=knobs
    )
    overrides = result.overrides
    quantum = fill_quantum(result.fill_factor, max_batch)
    return result.to_response(quantum, memory_warnings)
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType

import attrs

from reactantserver.core.protocol import control_pb2
from reactantserver.gateway.policies.knobs import (
    FILL_MODES,
    INFLIGHT_HAZARD,
    KnobError,
    SchedulingKnobs,
    UnknownModelError,
)
from reactantserver.gateway.policies.lpt.packing import Replicas

__all__ = [
    "ModelOverride",
    "PlacementResult",
    "apply_placement_request",
    "fill_quantum",
]


def _inherit_is_none(value: str | None) -> str | None:
    return None if value == "inherit" else value


@attrs.frozen
class ModelOverride:
    """``scheduling.models.<m>``: ``None`` inherits (``fill_mode`` ``"inherit"`` reads as ``None``).

    Raises :class:`KnobError` for replicas not ``>= 1``/``"all"``, an unknown fill mode or a fill
    factor not ``> 0``.
    """

    replicas: Replicas | None = None
    fill_mode: str | None = attrs.field(default=None, converter=_inherit_is_none)
    fill_factor: float | None = None

    def __attrs_post_init__(self) -> None:
        problems: list[tuple[str, str]] = []
        r = self.replicas
        if r is not None and r != "all" and not (type(r) is int and r >= 1):
            problems.append(("replicas", f"replicas must be an int >= 1 or 'all', got {r!r}"))
        if self.fill_mode is not None and self.fill_mode not in FILL_MODES:
            rule = "|".join((*FILL_MODES, "inherit"))
            problems.append(("fill_mode", f"fill_mode must be one of {rule}"))
        f = self.fill_factor
        if f is not None and not (isinstance(f, int | float) and math.isfinite(f) and f > 0):
            problems.append(("fill_factor", f"fill_factor must be a finite number > 0, got {f!r}"))
        if problems:
            raise KnobError("; ".join(p for _, p in problems), [n for n, _ in problems])

    @property
    def is_default(self) -> bool:
        """Whether every field inherits (such an override is deleted, not stored)."""
        return self.replicas is None and self.fill_mode is None and self.fill_factor is None


def fill_quantum(fill_factor: float, max_batch: int) -> int:
    """``Q = max(1, round(factor x max_batch))`` when ``max_batch > 0``, else 1."""
    return max(1, round(fill_factor * max_batch)) if max_batch > 0 else 1


@attrs.frozen
class PlacementResult:
    """The outcome of one ``SetModelPlacement``, for the caller to install and answer with.

    ``overrides`` is the whole new map (install it); ``override`` this model's entry (``None``
    when it inherits everything); ``configured_replicas`` the override on the wire (> 0, -1 all,
    0 none: inherits ``default_replicas``); ``effective_replicas`` what the next repack places,
    clamped to the ready workers; ``fill_mode`` and ``fill_factor`` the resolved fill plan, from
    which the caller computes the quantum (:func:`fill_quantum`) and any memory warning.
    """

    name: str
    overrides: Mapping[str, ModelOverride]
    override: ModelOverride | None
    configured_replicas: int
    effective_replicas: int
    fill_mode: str
    fill_factor: float
    warnings: tuple[str, ...]

    def to_response(
        self, fill_quantum: int, extra_warnings: Sequence[str] = ()
    ) -> control_pb2.SetModelPlacementResponse:
        """The wire response (``persisted`` is always false)."""
        return control_pb2.SetModelPlacementResponse(
            name=self.name,
            configured_replicas=self.configured_replicas,
            effective_replicas=self.effective_replicas,
            fill_mode=self.fill_mode,
            fill_quantum=fill_quantum,
            warnings=[*self.warnings, *extra_warnings],
            persisted=False,
        )


def _request_problems(request: control_pb2.SetModelPlacementRequest) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if request.replicas < -1:
        problems.append(
            ("replicas", f"replicas must be > 0, -1 (all) or 0 (clear), got {request.replicas}")
        )
    if request.fill_mode not in ("", "inherit", *FILL_MODES):
        rule = "|".join((*FILL_MODES, "inherit"))
        problems.append(("fill_mode", f"fill_mode must be one of {rule} or empty (unchanged)"))
    if not math.isfinite(request.fill_factor):
        problems.append(("fill_factor", "fill_factor must be finite"))
    return problems


def apply_placement_request(
    overrides: Mapping[str, ModelOverride],
    request: control_pb2.SetModelPlacementRequest,
    *,
    known_models: Collection[str],
    ready_workers: int,
    knobs: SchedulingKnobs | None = None,
) -> PlacementResult:
    """``SetModelPlacement`` over the current per-model overrides.

    ``known_models`` are the routed models; ``ready_workers`` the count of the last tick;
    ``knobs`` (default: the defaults) supplies ``default_replicas`` and the fill defaults.
    ``replicas`` 0 clears, -1 is all; ``fill_mode`` ``""`` keeps, ``inherit`` clears;
    ``fill_factor`` < 0 keeps, 0 clears. An override left all-default is deleted.

    Raises:
        KnobError: empty name, replicas < -1, an unknown fill mode, a non-finite fill factor.
        UnknownModelError: the model is not routed and ``allow_unknown_model`` is false.
    """
    knobs = knobs or SchedulingKnobs()
    name = request.name
    if not name:
        raise KnobError("name is empty", ["name"])
    if problems := _request_problems(request):
        raise KnobError("; ".join(p for _, p in problems), [n for n, _ in problems])
    warnings: list[str] = []
    if name not in known_models:
        if not request.allow_unknown_model:
            raise UnknownModelError(
                f"model {name!r} is not routed by any worker; set allow_unknown_model to store "
                "the override anyway"
            )
        warnings.append(f"model {name!r} is not routed now; the override is stored for later")
    old = overrides.get(name, ModelOverride())
    wire = request.replicas
    new = ModelOverride(
        replicas=None if wire == 0 else ("all" if wire == -1 else wire),
        fill_mode=old.fill_mode if request.fill_mode == "" else request.fill_mode,
        fill_factor=(
            old.fill_factor
            if request.fill_factor < 0
            else (None if request.fill_factor == 0 else request.fill_factor)
        ),
    )
    updated = {k: v for k, v in overrides.items() if k != name}
    if not new.is_default:
        updated[name] = new
    if new.replicas != old.replicas:
        warnings.append("replica changes take effect at the next repack")
    wanted = new.replicas if new.replicas is not None else knobs.default_replicas
    effective = ready_workers if wanted == "all" else min(wanted, ready_workers)
    if ready_workers <= 0:
        warnings.append("no worker was ready at the last tick: effective replicas 0")
    elif wanted != "all" and wanted > ready_workers:
        warnings.append(
            f"{wanted} replicas configured but only {ready_workers} workers were ready at the "
            f"last tick: effective {effective}"
        )
    fill_mode = new.fill_mode or knobs.routing_fill_mode
    if fill_mode == "inflight":
        warnings.append(INFLIGHT_HAZARD)
    return PlacementResult(
        name=name,
        overrides=MappingProxyType(updated),
        override=None if new.is_default else new,
        configured_replicas=-1 if new.replicas == "all" else (new.replicas or 0),
        effective_replicas=max(0, effective),
        fill_mode=fill_mode,
        fill_factor=new.fill_factor or knobs.routing_fill_factor,
        warnings=tuple(warnings),
    )
