"""Fixtures shared by the client tests that talk to a scripted in-process gRPC server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from reactantserver.client import shutdown

from ._scripted import Pools, ScriptedServer, client_session, scripted_server


@pytest.fixture
def pools() -> Iterator[Pools]:
    """Staging pools made through the session; all closed, and /dev/shm checked, at the end."""
    with client_session() as made:
        yield made


@pytest.fixture
def server(pools: Pools) -> Iterator[ScriptedServer]:
    """A scripted server on its own port; the client shuts down while it still answers."""
    with scripted_server() as scripted:
        yield scripted
        shutdown()
