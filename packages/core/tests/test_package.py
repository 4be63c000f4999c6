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


def test_mlir_element_types_round_trip() -> None:
    from reactantserver.core.dtypes import DType

    for member in DType:
        if member is DType.BYTES:
            continue
        assert DType.from_mlir(member.mlir) is member
    assert DType.BOOL.mlir == "i1"
    assert DType.F8_E4M3.mlir == "f8E4M3FN"
