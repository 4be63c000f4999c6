"""The ``peers`` benchmark's parts: the shared MLPs, the peer servers and their venvs, the report.

Everything a peer's server script imports from here (:mod:`bench._peers.models`,
:mod:`bench._peers.counters`) needs only numpy and jax, so the peer venvs never install our
distributions.
"""
