"""KServe's ModelServer serving the MLPs: one ``kserve.Model`` per MLP, no batching.

Run by ``bench.peers`` in the KServe venv: ``python -m bench._peers.serve_kserve SPEC``. KServe
has no request batching of its own, so every request runs the model on its own rows. Latency
logging is off and the log level is warning (per-request log lines would be the main cost).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import numpy as np

from bench._peers.models import INPUT, OUTPUT
from bench._peers.runner import model_function
from bench._peers.spec import PeerSpec


def _model(spec: PeerSpec, name: str) -> Any:
    import kserve
    from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

    run = model_function(spec, name)

    class Mlp(kserve.Model):  # type: ignore[misc]
        """One MLP: ``x`` in, ``y`` out, raw tensors when the request came raw."""

        def load(self) -> bool:
            self.ready = True
            return True

        async def predict(
            self,
            payload: InferRequest,
            headers: dict[str, str] | None = None,
            response_headers: dict[str, str] | None = None,
        ) -> InferResponse:
            x = payload.get_input_by_name(INPUT).as_numpy()
            y = run(np.ascontiguousarray(x, dtype=np.float32))
            output = InferOutput(OUTPUT, list(y.shape), "FP32")
            output.set_data_from_numpy(y, binary_data=True)
            return InferResponse(
                payload.id,
                self.name,
                [output],
                from_grpc=payload.from_grpc,
                use_binary_outputs=payload.use_binary_outputs,
            )

    model = Mlp(name)
    model.load()
    return model


def main(argv: list[str]) -> int:
    """Serve until SIGINT/SIGTERM."""
    import kserve

    spec = PeerSpec.read(argv[0])
    models = [_model(spec, name) for name in spec.models]
    server = kserve.ModelServer(
        http_port=spec.http_port,
        grpc_port=spec.grpc_port,
        workers=1,
        enable_grpc=True,
        enable_latency_logging=False,
    )
    logging.getLogger().setLevel(logging.WARNING)
    for name in ("kserve", "kserve.trace", "uvicorn", "uvicorn.access"):
        logging.getLogger(name).setLevel(logging.WARNING)
    server.start(models)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
