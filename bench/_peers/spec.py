"""What the harness tells a peer's server script: ports, models, batching, where to count.

Written by the harness as JSON and read by the script (its only argument), so no peer's own
command line parser sees our options. Stdlib only: the scripts run in the peers' venvs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

__all__ = ["BATCH_DELAY_US", "STUB_VENV", "PeerSpec"]

#: The peers' batching window where they have one (Triton's ``max_queue_delay_microseconds``,
#: MLServer's ``max_batch_time``): 1 ms, as the issue asks.
BATCH_DELAY_US = 1000
#: A venv inside the PyTriton venv with numpy < 2 for Triton's Python backend stub, made by
#: ``bench.peers --prepare``: on the venv's numpy 2 the stub answered every request with empty
#: output tensors (PyTriton 0.7.0 pins numpy < 2), and jax needs numpy 2 in the process that
#: runs the model.
STUB_VENV = "triton-stub-venv"


@dataclasses.dataclass(frozen=True)
class PeerSpec:
    """One peer server's settings."""

    server: str
    grpc_port: int
    http_port: int
    metrics_port: int
    models: tuple[str, ...]
    workdir: str
    """The run's folder: the :class:`~bench._peers.counters.Counter` files, scratch space."""
    max_batch: int
    batch_delay_us: int = BATCH_DELAY_US

    def write(self, path: Path) -> Path:
        """Save as JSON at ``path``; returns it."""
        path.write_text(json.dumps(dataclasses.asdict(self)))
        return path

    @classmethod
    def read(cls, path: str | Path) -> PeerSpec:
        """The spec saved at ``path``."""
        fields = json.loads(Path(path).read_text())
        return cls(**{**fields, "models": tuple(fields["models"])})
