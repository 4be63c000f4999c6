"""The operator status page and the ``/status`` JSON document it renders (issue 16).

Worker and gateway both serve :func:`page` on ``GET /`` (:data:`PAGE_PATH`) and a status
document on ``GET /status`` (:data:`STATUS_PATH`); the page fetches the document every
:data:`REFRESH_SECONDS` and renders whichever kind it gets. The page is one self-contained
HTML file (inline CSS and JavaScript, no external assets) shipped as package data::

    from reactantserver.core import status

    body = status.page()                          # serve with status.PAGE_CONTENT_TYPE
    doc: status.WorkerStatus = {"kind": "worker", ...}

The TypedDicts below are the document's schema; every field is always present (``None``
where ``null`` is allowed).
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Literal, TypeAlias, TypedDict

__all__ = [
    "PAGE_CONTENT_TYPE",
    "PAGE_PATH",
    "REFRESH_SECONDS",
    "STATUS_PATH",
    "DeviceStatus",
    "GatewayStatus",
    "GatewayWorker",
    "LastRepack",
    "ModelStatus",
    "PlacementRow",
    "ResidencyName",
    "StatusDocument",
    "WorkerStatus",
    "page",
]

STATUS_PATH = "/status"
"""The JSON document's path on the HTTP port (not under ``/v2``: that is KServe REST's)."""

PAGE_PATH = "/"
"""The status page's path on the HTTP port."""

PAGE_CONTENT_TYPE = "text/html; charset=utf-8"
"""``Content-Type`` of :func:`page`."""

REFRESH_SECONDS = 2.0
"""How often the page fetches :data:`STATUS_PATH` (it keeps retrying after a failure)."""

ResidencyName: TypeAlias = Literal["device", "host", "pinned"]
"""Where a model's weights are: kept on the device, on it now, or not on it."""


class DeviceStatus(TypedDict):
    """The worker's device: weight bytes resident vs the on-demand budget."""

    weight_bytes_resident: int
    """Bytes of every model weight on the device now, pinned ones included."""
    weight_budget_bytes: int | None
    """The on-demand weight budget (``None``: no on-demand cache, every weight stays)."""
    pinned_bytes: int
    """Bytes of ``PINNED_DEVICE`` weights (outside the budget)."""


class ModelStatus(TypedDict):
    """One model on a worker: state, residency, queue, shares, waits and churn."""

    name: str
    version: str
    state: str
    """``READY``, ``LOADING`` or ``UNAVAILABLE``."""
    residency: ResidencyName
    """``pinned`` (kept on the device), ``device`` (on it now) or ``host`` (not on it)."""
    weight_bytes: int
    queue_depth: int
    requests: int
    """Inference requests finished (successes plus failures)."""
    failures: int
    executions: int
    """Device executions (a coalesced batch counts once)."""
    device_time_share: float | None
    """Fraction of the recent device time this model used (``None``: no recent compute)."""
    weight: float
    """The model's fair-share scheduler weight."""
    queue_wait_p50_seconds: float | None
    queue_wait_p99_seconds: float | None
    batch_sizes: dict[str, int]
    """Executions per compiled batch size (the size as a string key)."""
    loads: int
    """Times its weights went to the device."""
    evictions: int
    """Times its weights were evicted to make room."""


class WorkerStatus(TypedDict):
    """A worker's status document (``kind == "worker"``)."""

    kind: Literal["worker"]
    name: str
    version: str
    ready: bool
    uptime_seconds: float
    platform: str
    """``cpu`` or ``cuda``."""
    discipline: str
    """``fair``, ``fifo`` or ``edf``."""
    model_control_mode: str
    device: DeviceStatus
    models: list[ModelStatus]


class LastRepack(TypedDict):
    """The gateway's last placement repack."""

    generation: int
    seconds_ago: float | None
    reason: str | None


class PlacementRow(TypedDict):
    """Which workers serve one model."""

    model: str
    workers: list[str]


class GatewayWorker(TypedDict):
    """One worker as the gateway sees it, with its own document when it could be fetched."""

    name: str
    endpoint: str
    ready: bool
    status: WorkerStatus | None
    error: str | None


class GatewayStatus(TypedDict):
    """A gateway's status document (``kind == "gateway"``)."""

    kind: Literal["gateway"]
    version: str
    ready: bool
    uptime_seconds: float
    policy: str
    """``round_robin``, ``lpt_packing`` or ``model_aware``."""
    last_repack: LastRepack | None
    placement: list[PlacementRow]
    workers: list[GatewayWorker]


StatusDocument: TypeAlias = WorkerStatus | GatewayStatus
"""Either document kind (the page dispatches on ``kind``)."""


@functools.cache
def page() -> bytes:
    """The status page's HTML (UTF-8), read once from the package data."""
    return resources.files("reactantserver.core").joinpath("_static", "status.html").read_bytes()
