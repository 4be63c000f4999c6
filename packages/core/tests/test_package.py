"""reactantserver.core installs as its own distribution, jax-free."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import reactantserver.core as package


def test_version_is_the_distribution_version() -> None:
    assert package.__version__ == version("reactantserver-core")


def test_core_import_leaves_jax_out() -> None:
    code = (
        "import sys, reactantserver.core, reactantserver.core.protocol;"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
