"""One gRPC endpoint over many ReactantServer workers.

:class:`GatewayServer` is what ``reactantserver-gateway`` runs: a ``grpc.aio`` reverse proxy
that forwards ``ModelInfer`` bodies as raw bytes to the worker its policy picks
(``round_robin``, ``lpt_packing`` or ``model_aware``), serves the whole inference service,
``GatewayControl`` and an aggregated ``/metrics``::

    config = load_gateway_config(None, os.environ)
    server = GatewayServer(config, version=__version__)
    await server.start()
"""

from __future__ import annotations

from importlib.metadata import version as _version

from reactantserver.gateway.config import (
    GatewayConfig,
    SchedulingMode,
    gateway_config_from_mapping,
    gateway_config_to_dict,
    load_gateway_config,
)
from reactantserver.gateway.server import GatewayServer

__version__ = _version("reactantserver-gateway")

__all__ = [
    "GatewayConfig",
    "GatewayServer",
    "SchedulingMode",
    "__version__",
    "gateway_config_from_mapping",
    "gateway_config_to_dict",
    "load_gateway_config",
]
