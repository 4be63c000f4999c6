"""PyTriton serving the MLPs: Triton's C++ server and dynamic batcher in front of jax.

Run by ``bench.peers`` in the PyTriton venv: ``python -m bench._peers.serve_pytriton SPEC``.
Each model is bound with ``max_batch_size`` = ``spec.max_batch`` and a dynamic batcher that
waits up to ``spec.batch_delay_us`` for rows; the batch reaches the model function as one
array of its exact size.
"""

from __future__ import annotations

import os
import signal
import sys
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np

from bench._peers.models import INPUT, MODELS, OUTPUT
from bench._peers.runner import model_function
from bench._peers.spec import STUB_VENV, PeerSpec


def _infer_function(spec: PeerSpec, model: str) -> Any:
    from pytriton.decorators import batch

    run = model_function(spec, model)

    @batch  # type: ignore[untyped-decorator]
    def infer(**inputs: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
        return {OUTPUT: run(inputs[INPUT])}

    return infer


def _own_libpython_first() -> None:
    """Put this interpreter's ``libpython`` first on the loader's path for Triton's children.

    Triton's Python backend stub links ``libpython3.x.so`` and finds the system's first
    (Debian's 3.11.2 here) while it imports this interpreter's stdlib (3.11.7): a mix that
    fails at start-up. The stub inherits the environment through ``tritonserver``.
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir:
        _prepend("LD_LIBRARY_PATH", libdir)


def _stub_venv_first() -> None:
    """Let Triton's stub run in :data:`STUB_VENV` rather than this venv.

    PyTriton puts ``sys.exec_prefix``'s ``bin`` first on ``tritonserver``'s ``PATH``, where the
    stub's embedded interpreter finds its prefix (a ``PYTHONPATH`` for the stub did not change
    the numpy it loaded); PyTriton has no setting for it, so its lookup is replaced here.
    """
    venv = Path(sys.prefix) / STUB_VENV
    if venv.is_dir():
        from pytriton.server import triton_server

        triton_server.get_triton_python_backend_python_env = lambda: venv


def _prepend(variable: str, path: str) -> None:
    os.environ[variable] = ":".join([path, *filter(None, os.environ.get(variable, "").split(":"))])


def main(argv: list[str]) -> int:
    """Serve until SIGINT or SIGTERM."""
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    spec = PeerSpec.read(argv[0])
    # PyTriton's serve() stops Triton cleanly on SIGINT only; the harness stops with SIGTERM.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    _own_libpython_first()
    _stub_venv_first()
    config = TritonConfig(
        grpc_port=spec.grpc_port,
        http_port=spec.http_port,
        metrics_port=spec.metrics_port,
        log_verbose=0,
    )
    workspace = Path(spec.workdir) / "pytriton-workspace"  # the run's, removed with it
    with Triton(config=config, workspace=workspace) as triton:
        for name in spec.models:
            mlp = MODELS[name]
            triton.bind(
                model_name=name,
                infer_func=_infer_function(spec, name),
                inputs=[Tensor(name=INPUT, dtype=np.float32, shape=(mlp.in_features,))],
                outputs=[Tensor(name=OUTPUT, dtype=np.float32, shape=(mlp.out_features,))],
                config=ModelConfig(
                    max_batch_size=spec.max_batch,
                    batcher=DynamicBatcher(max_queue_delay_microseconds=spec.batch_delay_us),
                ),
                strict=False,
            )
        triton.serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
