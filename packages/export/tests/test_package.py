"""reactantserver.export installs as its own distribution in the shared namespace."""

from __future__ import annotations

from importlib.metadata import version

import reactantserver.export as package


def test_version_is_the_distribution_version() -> None:
    assert package.__version__ == version("reactantserver-export")
