"""Fixtures of the tracing suite: a traced worker and two traced gateways in-process.

Module-scoped: the servers (and the worker's dispatch thread) stop after each test file, so
no thread of theirs outlives the suite into the tests the session runs next.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ._servers import Servers, running_servers


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """The running servers; the span list is emptied before each test that uses them."""
    yield from running_servers(tmp_path_factory.mktemp("tracing"))


@pytest.fixture
def traced(servers: Servers) -> Servers:
    """:func:`servers` with no span recorded yet and the trace settings as configured."""
    servers.spans.clear()
    return servers
