"""Meta models: Python orchestration over the worker's models.

:class:`MetaModel` is a meta's servable generation, :class:`MetaRunner` serves its requests
(gate, ``run`` in the hook pool, statistics), :class:`MetaCallSession` is the ``call`` its
``run`` receives (committed sub-calls, scratch) and :class:`MetaGate` bounds how many gated
metas run at once.
"""

from reactantserver.worker.meta.call import MetaCallSession, RequestCancelledError, scratch_span
from reactantserver.worker.meta.gate import MetaGate
from reactantserver.worker.meta.runner import MetaRunner
from reactantserver.worker.registry import MetaModel

__all__ = [
    "MetaCallSession",
    "MetaGate",
    "MetaModel",
    "MetaRunner",
    "RequestCancelledError",
    "scratch_span",
]
