"""Read-only views of a running worker: nothing here changes what the worker does.

``/metrics`` (:mod:`.metrics`), the ``/status`` document and page (:mod:`.status`), and the
model metadata, configuration and statistics messages (:mod:`.model_info`).
"""

# The modules are the surface; import from them (e.g. reactantserver.worker.views.metrics).
__all__: list[str] = []
