"""The ``lpt_packing`` policy: pure placement logic beside its run-time glue.

Pure, no I/O and no clocks: :mod:`.packing` (greedy two-dimensional LPT of models onto
workers), :mod:`.fill` (fill plans and per-request replica choice) and :mod:`.overrides`
(per-model placement overrides). Glue: :mod:`.policy` (ticks, repacks, routing) and
:mod:`.control` (its ``GatewayControl`` methods).
"""

# The modules are the surface; import from them (e.g. reactantserver.gateway.policies.lpt.fill).
__all__: list[str] = []
