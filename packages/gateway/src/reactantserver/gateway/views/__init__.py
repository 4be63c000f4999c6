"""Read-only views of the gateway and its fleet: metrics and the status page.

:mod:`.metrics` (the gateway's own series), :mod:`.exposition` (the workers' expositions
merged into one ``/metrics``) and :mod:`.status` (``/status`` and the page).
"""

# The modules are the surface; import from them (e.g. reactantserver.gateway.views.metrics).
__all__: list[str] = []
