"""A model at an endpoint, with everything a call to it needs."""

from __future__ import annotations

import logging
import os
import threading
import time
from types import TracebackType

from reactantserver.client._channels import CHANNELS, ChannelKey
from reactantserver.client._flow import Flow, Unary, run_sync
from reactantserver.client._retry import RetryPolicy, retrying_flow
from reactantserver.client._spec import ModelIOSpec
from reactantserver.client._staging import StagingPool, default_pool
from reactantserver.client._transport import ENDPOINTS, Endpoint, SharedMemoryMode
from reactantserver.client._url import parse_url
from reactantserver.core.config import CLIENT_MAX_RECV_VARIABLE, CLIENT_MAX_SEND_VARIABLE, lookup
from reactantserver.core.protocol import INFERENCE_METHODS
from reactantserver.core.protocol import grpc_service_pb2 as pb

__all__ = [
    "DEFAULT_MESSAGE_BYTES",
    "DEFAULT_REPROBE_INTERVAL_S",
    "MAX_RECV_ENV",
    "MAX_SEND_ENV",
    "KServeModel",
    "message_limit",
]

DEFAULT_MESSAGE_BYTES = 512 * 1024 * 1024
MAX_SEND_ENV = CLIENT_MAX_SEND_VARIABLE
MAX_RECV_ENV = CLIENT_MAX_RECV_VARIABLE
DEFAULT_REPROBE_INTERVAL_S = 60.0
"""How often a pool latched to inline re-probes its endpoint (``shm_reprobe_interval``)."""

_METADATA = INFERENCE_METHODS["ModelMetadata"]
_MODES = ("auto", "on", "off")


_log = logging.getLogger("reactantserver.client")
#: Older variable names already reported in this process (one warning each).
_DEPRECATED_SEEN: set[str] = set()


def message_limit(explicit: int | None, env: str) -> int:
    """A message-size limit: the argument, else ``env`` (or its older name), else 512 MiB."""
    if explicit is not None:
        value, source = explicit, "argument"
    else:
        text, name = lookup(os.environ, env)
        if text is None:
            return DEFAULT_MESSAGE_BYTES
        if name != env and name not in _DEPRECATED_SEEN:
            _DEPRECATED_SEEN.add(name)
            _log.warning("%s is deprecated; use %s", name, env)
        try:
            value, source = int(text), name
        except ValueError:
            raise ValueError(f"{name} must be an integer number of bytes, got {text!r}") from None
    if value < 1:
        raise ValueError(f"message limit from {source} must be >= 1 byte, got {value}")
    return value


class KServeModel:
    """One model at one endpoint: ``KServeModel("grpc://127.0.0.1:8001", "mlp")``.

    ``deadline`` is the budget of each call in seconds (the whole batch for IO drivers);
    ``max_batch_size`` caps items per chunk for IO drivers; ``shared_memory`` chooses how staging
    pools travel (``auto`` probes the server); ``pool`` is the staging pool for IO drivers
    (default: one 256 MiB SHM pool per process, created on first use). Use as a context
    manager, or call :meth:`close`.
    """

    def __init__(
        self,
        url: str,
        model_name: str,
        *,
        deadline: float = 10.0,
        max_batch_size: int = 1,
        shared_memory: SharedMemoryMode = "auto",
        retry: RetryPolicy | None = None,
        max_send_message_length: int | None = None,
        max_receive_message_length: int | None = None,
        root_certificates: bytes | None = None,
        private_key: bytes | None = None,
        certificate_chain: bytes | None = None,
        pool: StagingPool | None = None,
        shm_reprobe_interval: float = DEFAULT_REPROBE_INTERVAL_S,
    ) -> None:
        target = parse_url(url)
        if not model_name:
            raise ValueError("model_name must not be empty")
        if not deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {deadline}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if shared_memory not in _MODES:
            raise ValueError(f"shared_memory must be one of {_MODES}, got {shared_memory!r}")
        if not target.tls and (root_certificates or private_key or certificate_chain):
            raise ValueError(f"TLS material given for a plain URL {url!r} (use grpcs://)")
        if not shm_reprobe_interval > 0:
            raise ValueError(f"shm_reprobe_interval must be > 0, got {shm_reprobe_interval}")
        self.url = url
        self.model_name = model_name
        self.deadline = float(deadline)
        self.max_batch_size = max_batch_size
        self.shared_memory: SharedMemoryMode = shared_memory
        self.retry = RetryPolicy() if retry is None else retry
        self.shm_reprobe_interval = shm_reprobe_interval
        self.key = ChannelKey(
            target,
            message_limit(max_send_message_length, MAX_SEND_ENV),
            message_limit(max_receive_message_length, MAX_RECV_ENV),
            root_certificates,
            private_key,
            certificate_chain,
        )
        self._pool = pool
        self._metadata: ModelIOSpec | None = None
        self._lock = threading.Lock()
        self._closed = False
        CHANNELS.attach(self.key)

    @property
    def endpoint(self) -> Endpoint:
        """Shared-memory state of this model's endpoint."""
        return ENDPOINTS.of(self.key)

    @property
    def pool(self) -> StagingPool:
        """The staging pool IO drivers use."""
        with self._lock:
            if self._pool is None or self._pool.closed:
                self._pool = default_pool()
            return self._pool

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._closed

    def check_open(self) -> None:
        """Raise ``ValueError`` once the model is closed."""
        if self._closed:
            raise ValueError(f"{self!r} is closed")

    def metadata_flow(self) -> Flow[ModelIOSpec]:
        """``ModelMetadata`` once (retried like an inference), then the cached answer."""
        if self._metadata is None:
            request = pb.ModelMetadataRequest(name=self.model_name)
            deadline_ns = time.monotonic_ns() + int(self.deadline * 1e9)

            def attempt() -> Flow[pb.ModelMetadataResponse]:
                remaining = (deadline_ns - time.monotonic_ns()) / 1e9
                reply: pb.ModelMetadataResponse = yield Unary(
                    self.key, _METADATA, request, remaining
                )
                return reply

            reply = yield from retrying_flow(self.retry, deadline_ns, attempt)
            self._metadata = ModelIOSpec.from_metadata(reply)
        return self._metadata

    def metadata(self) -> ModelIOSpec:
        """The model's inputs and outputs (fetched once, also through a gateway)."""
        self.check_open()
        return run_sync(self.metadata_flow())

    def close(self) -> None:
        """Stop using the channel; the last model on it closes it. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        CHANNELS.detach(self.key)

    def __enter__(self) -> KServeModel:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KServeModel({self.url!r}, {self.model_name!r})"
