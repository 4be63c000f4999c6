"""How the gateway picks the worker for each request: one folder per ``scheduling.mode``.

- :mod:`.policy`: what the ``ModelInfer`` path asks of a policy, and ``round_robin``;
- :mod:`.lpt`: ``lpt_packing`` (pure packing, fill plans and overrides beside the run-time
  policy and its control service);
- :mod:`.model_aware`: ``model_aware`` (the pure latency estimate beside the glue that feeds it
  status polls);
- :mod:`.modes`: the policy of a configured mode and its start-up preconditions;
- :mod:`.knobs` and :mod:`.routing_meta`: live knobs and per-model routing facts, shared by
  the policies.

The pure modules do no I/O and read no clocks; the ``policy`` modules are their glue.
"""

from __future__ import annotations

from reactantserver.gateway.policies.policy import Choice, Policy, RoundRobin, Routes

__all__ = ["Choice", "Policy", "RoundRobin", "Routes"]
