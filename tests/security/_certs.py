"""Self-signed certificates for the TLS tests, made with the ``openssl`` command line.

The same recipe as the worker's unit tests (``packages/worker/tests/test_server.py``),
which this suite cannot import: every certificate names ``localhost`` and ``127.0.0.1``, a CA
is self-signed with ``CA:TRUE`` and leaf certificates are signed by it::

    ca = certificate(tmp, "ca")
    server_key, server_cert = certificate(tmp, "server", ca=ca)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["certificate", "needs_openssl"]

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
"""Skip a test (or module) where the ``openssl`` command is not installed."""

_NAMES = "subjectAltName=DNS:localhost,IP:127.0.0.1"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def certificate(
    directory: Path, name: str, *, ca: tuple[Path, Path] | None = None
) -> tuple[Path, Path]:
    """``(key, cert)`` PEM files for ``CN=name``: a self-signed CA, or a leaf signed by ``ca``."""
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    subject = f"/CN={name}"
    if ca is None:
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(key), "-out", str(cert), "-subj", subject,
            "-addext", _NAMES, "-addext", "basicConstraints=critical,CA:TRUE",
        )  # fmt: skip
        return key, cert
    request = directory / f"{name}.csr"
    extensions = directory / f"{name}.ext"
    extensions.write_text(_NAMES + "\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request),
        "-subj", subject,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca[1]), "-CAkey", str(ca[0]),
        "-CAcreateserial", "-days", "2", "-out", str(cert), "-extfile", str(extensions),
    )  # fmt: skip
    return key, cert
