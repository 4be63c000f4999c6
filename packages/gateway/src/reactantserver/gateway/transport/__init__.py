"""The gateway's front: what clients call, translated and forwarded to workers.

The inference service (:mod:`.service`), the ``ModelInfer`` path (:mod:`.proxy`, reading
only the header of the raw bytes it forwards: :mod:`.wire`), fan-outs merged into one answer
(:mod:`.merge`), ``GatewayControl`` (:mod:`.control`), and the HTTP port (:mod:`.http`) with
KServe V2 REST over the same handlers (:mod:`.rest`).
"""

# The modules are the surface; import from them (e.g. reactantserver.gateway.transport.proxy).
__all__: list[str] = []
