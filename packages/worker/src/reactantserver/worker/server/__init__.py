"""The worker process: gRPC services, HTTP endpoints and the start-up/shutdown sequence.

:class:`WorkerServer` is what ``reactantserver-worker`` runs; :class:`WorkerState` is what
every service reads.
"""

from __future__ import annotations

from reactantserver.worker.server.app import WorkerServer
from reactantserver.worker.server.inference import InferenceService
from reactantserver.worker.server.metrics import WorkerMetrics
from reactantserver.worker.server.state import (
    ModelLoadRecord,
    RequestObserver,
    Runtime,
    WorkerState,
)

__all__ = [
    "InferenceService",
    "ModelLoadRecord",
    "RequestObserver",
    "Runtime",
    "WorkerMetrics",
    "WorkerServer",
    "WorkerState",
]
