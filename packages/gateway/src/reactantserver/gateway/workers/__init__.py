"""The gateway's side of each worker: one link, discovery and health, the forwarding lane.

:mod:`.link` (a ``grpc.aio`` channel per worker, raw-byte calls), :mod:`.discovery` (which
workers are ready and which models each serves) and :mod:`.lane` (the short cut to a worker
on the same host).
"""

# The modules are the surface; import from them (e.g. reactantserver.gateway.workers.link).
__all__: list[str] = []
