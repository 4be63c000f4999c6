"""The KServe V2 REST path table: which endpoint a ``/v2/...`` path names, with its arguments.

Paths are matched segment by segment after percent-decoding each segment, so a model name
may hold any character (``/v2/models/a%2Fb`` names model ``a/b``). ``/v2/models/stats`` is
the all-models statistics endpoint, as in Triton, not the metadata of a model named
``stats``. A query string and one trailing slash are ignored.
"""

from __future__ import annotations

import enum
from urllib.parse import unquote

import attrs

from reactantserver.core.rest._json import bad_request

__all__ = ["ALLOWED_METHODS", "Endpoint", "Route", "match_route"]


class Endpoint(enum.Enum):
    """A REST endpoint, valued by the gRPC method it calls."""

    SERVER_METADATA = "ServerMetadata"
    SERVER_LIVE = "ServerLive"
    SERVER_READY = "ServerReady"
    MODEL_METADATA = "ModelMetadata"
    MODEL_READY = "ModelReady"
    MODEL_CONFIG = "ModelConfig"
    MODEL_STATISTICS = "ModelStatistics"
    MODEL_INFER = "ModelInfer"
    REPOSITORY_INDEX = "RepositoryIndex"
    REPOSITORY_LOAD = "RepositoryModelLoad"
    REPOSITORY_UNLOAD = "RepositoryModelUnload"
    SHM_STATUS = "SystemSharedMemoryStatus"
    SHM_REGISTER = "SystemSharedMemoryRegister"
    SHM_UNREGISTER = "SystemSharedMemoryUnregister"
    CUDA_SHM_STATUS = "CudaSharedMemoryStatus"
    CUDA_SHM_REGISTER = "CudaSharedMemoryRegister"
    CUDA_SHM_UNREGISTER = "CudaSharedMemoryUnregister"
    TRACE_SETTING = "TraceSetting"
    LOG_SETTINGS = "LogSettings"


_GET = frozenset({"GET"})
_POST = frozenset({"POST"})
_BOTH = frozenset({"GET", "POST"})

#: The HTTP methods each endpoint answers (others: 405 with ``Allow``, as Triton does).
ALLOWED_METHODS: dict[Endpoint, frozenset[str]] = {
    Endpoint.SERVER_METADATA: _GET,
    Endpoint.SERVER_LIVE: _GET,
    Endpoint.SERVER_READY: _GET,
    Endpoint.MODEL_METADATA: _GET,
    Endpoint.MODEL_READY: _GET,
    Endpoint.MODEL_CONFIG: _GET,
    Endpoint.MODEL_STATISTICS: _GET,
    Endpoint.MODEL_INFER: _POST,
    Endpoint.REPOSITORY_INDEX: _POST,
    Endpoint.REPOSITORY_LOAD: _POST,
    Endpoint.REPOSITORY_UNLOAD: _POST,
    Endpoint.SHM_STATUS: _GET,
    Endpoint.SHM_REGISTER: _POST,
    Endpoint.SHM_UNREGISTER: _POST,
    Endpoint.CUDA_SHM_STATUS: _GET,
    Endpoint.CUDA_SHM_REGISTER: _POST,
    Endpoint.CUDA_SHM_UNREGISTER: _POST,
    Endpoint.TRACE_SETTING: _BOTH,
    Endpoint.LOG_SETTINGS: _BOTH,
}

_MODEL_TAILS = {
    (): Endpoint.MODEL_METADATA,
    ("ready",): Endpoint.MODEL_READY,
    ("config",): Endpoint.MODEL_CONFIG,
    ("stats",): Endpoint.MODEL_STATISTICS,
    ("infer",): Endpoint.MODEL_INFER,
    ("trace", "setting"): Endpoint.TRACE_SETTING,
}
_SHM = {
    "systemsharedmemory": (Endpoint.SHM_STATUS, Endpoint.SHM_REGISTER, Endpoint.SHM_UNREGISTER),
    "cudasharedmemory": (
        Endpoint.CUDA_SHM_STATUS,
        Endpoint.CUDA_SHM_REGISTER,
        Endpoint.CUDA_SHM_UNREGISTER,
    ),
}


@attrs.frozen
class Route:
    """A matched path: the endpoint and the names its path carried (decoded)."""

    endpoint: Endpoint
    model: str = ""
    version: str = ""
    region: str = ""
    repository: str = ""


def match_route(path: str) -> Route | None:
    """The route ``path`` (raw, percent-encoded, query allowed) names, or ``None``.

    A segment that does not decode as UTF-8 is a 400 (:class:`RestCallError`).
    """
    raw = path.split("?", 1)[0].split("#", 1)[0]
    if raw.endswith("/") and raw != "/":
        raw = raw[:-1]
    parts = raw.split("/")
    if len(parts) < 2 or parts[0] != "" or parts[1] != "v2":
        return None
    try:
        segments = tuple(unquote(part, errors="strict") for part in parts[2:])
    except UnicodeDecodeError:
        raise bad_request(f"path {path!r} is not valid percent-encoded UTF-8") from None
    if any(not segment for segment in segments):
        return None
    return _match(segments)


def _match(s: tuple[str, ...]) -> Route | None:  # noqa: PLR0911 - one return per path shape
    if not s:
        return Route(Endpoint.SERVER_METADATA)
    head, rest = s[0], s[1:]
    if head == "health" and rest in (("live",), ("ready",)):
        return Route(Endpoint.SERVER_LIVE if rest[0] == "live" else Endpoint.SERVER_READY)
    if head == "models":
        return _match_model(rest)
    if head == "repository":
        return _match_repository(rest)
    if head in _SHM:
        return _match_shm(_SHM[head], rest)
    if s == ("trace", "setting"):
        return Route(Endpoint.TRACE_SETTING)
    if s == ("logging",):
        return Route(Endpoint.LOG_SETTINGS)
    return None


def _match_model(s: tuple[str, ...]) -> Route | None:
    if s == ("stats",):
        return Route(Endpoint.MODEL_STATISTICS)
    if not s:
        return None
    model, tail, version = s[0], s[1:], ""
    if len(tail) >= 2 and tail[0] == "versions":
        version, tail = tail[1], tail[2:]
    endpoint = _MODEL_TAILS.get(tail)
    if endpoint is None:
        return None
    return Route(endpoint, model=model, version=version)


def _match_repository(s: tuple[str, ...]) -> Route | None:
    repository = ""
    if (len(s) == 2 and s[1] == "index") or (len(s) == 4 and s[1] == "models"):
        # /v2/repository/{repository}/... names the repository (ignored by the service).
        repository, s = s[0], s[1:]
    if s == ("index",):
        return Route(Endpoint.REPOSITORY_INDEX, repository=repository)
    if len(s) == 3 and s[0] == "models" and s[2] in ("load", "unload"):
        endpoint = Endpoint.REPOSITORY_LOAD if s[2] == "load" else Endpoint.REPOSITORY_UNLOAD
        return Route(endpoint, model=s[1], repository=repository)
    return None


def _match_shm(endpoints: tuple[Endpoint, Endpoint, Endpoint], s: tuple[str, ...]) -> Route | None:
    status, register, unregister = endpoints
    region = ""
    if len(s) == 3 and s[0] == "region":
        region, s = s[1], s[2:]
    if s == ("status",):
        return Route(status, region=region)
    if s == ("unregister",):
        return Route(unregister, region=region)
    if s == ("register",) and region:
        return Route(register, region=region)
    return None
