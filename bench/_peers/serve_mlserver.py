"""MLServer serving the MLPs: a custom ``MLModel`` runtime with adaptive batching.

Run by ``bench.peers`` in the MLServer venv: ``python -m bench._peers.serve_mlserver SPEC``.
Each model has ``max_batch_size`` = ``spec.max_batch`` and ``max_batch_time`` =
``spec.batch_delay_us``; MLServer's defaults otherwise, so inference runs in its one parallel
worker process (``parallel_workers`` = 1) behind the main process's gRPC server and batcher.
The worker process imports :class:`MlpRuntime` by name, so ``bench`` must be importable there
(the harness puts the repository root on ``PYTHONPATH``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
from mlserver import MLModel

from bench._peers.models import INPUT, OUTPUT
from bench._peers.runner import model_function
from bench._peers.spec import PeerSpec


class MlpRuntime(MLModel):  # type: ignore[misc]
    """One MLP as an MLServer runtime; ``parameters.extra`` names the spec file and model."""

    async def load(self) -> bool:
        """Compile every batch size and open the counter."""
        extra = self.settings.parameters.extra
        self._run = model_function(PeerSpec.read(extra["spec"]), extra["model"])
        return True

    async def predict(self, payload: Any) -> Any:
        """``y`` for the (batched) request's ``x``."""
        from mlserver.codecs import NumpyCodec
        from mlserver.types import InferenceResponse

        [request_input] = [i for i in payload.inputs if i.name == INPUT]
        x = NumpyCodec.decode_input(request_input)
        y = self._run(np.ascontiguousarray(x, dtype=np.float32))
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output(OUTPUT, y)]
        )


async def _serve(spec_path: str) -> None:
    from mlserver import MLServer
    from mlserver.settings import ModelParameters, ModelSettings, Settings

    spec = PeerSpec.read(spec_path)
    settings = Settings(
        debug=False,
        http_port=spec.http_port,
        grpc_port=spec.grpc_port,
        metrics_port=spec.metrics_port,
        metrics_dir=str(Path(spec.workdir) / "mlserver-metrics"),  # not ./.metrics
    )
    models = [
        ModelSettings(
            name=name,
            implementation=MlpRuntime,
            max_batch_size=spec.max_batch,
            max_batch_time=spec.batch_delay_us / 1e6,
            parameters=ModelParameters(extra={"spec": spec_path, "model": name}),
        )
        for name in spec.models
    ]
    logging.getLogger("mlserver").setLevel(logging.WARNING)
    await MLServer(settings).start(models)


def main(argv: list[str]) -> int:
    """Serve until SIGINT/SIGTERM, on uvloop as ``mlserver start`` does."""
    from mlserver.utils import install_uvloop_event_loop

    install_uvloop_event_loop()
    asyncio.run(_serve(argv[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
