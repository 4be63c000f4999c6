"""The model repository: what is on disk becomes what is served.

Start-up (:mod:`.boot`: scan, compile, warm up), the lifecycle of each model afterwards
(:mod:`.lifecycle`: install, reload, unload, rename), the ``dynamic`` mode's watcher
(:mod:`.watcher`, planning in :mod:`.reconcile` over :mod:`.scan` and :mod:`.digest`), and
meta models as groups (:mod:`.groups`).
"""

# The modules are the surface; import from them (e.g. reactantserver.worker.repository.boot).
__all__: list[str] = []
