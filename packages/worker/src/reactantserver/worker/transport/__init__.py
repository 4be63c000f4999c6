"""The worker's wire edges: they translate, nothing more.

gRPC (:mod:`.inference`, :mod:`.stream`, :mod:`.control`), the gateway's forwarding lane
(:mod:`.lane`), KServe V2 REST (:mod:`.rest`) and the HTTP port (:mod:`.http`) turn wire
messages into typed requests for the data plane and its errors into statuses, once, here.
"""

# The modules are the surface; import from them (e.g. reactantserver.worker.transport.inference).
__all__: list[str] = []
