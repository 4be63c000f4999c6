"""Where a client connects: ``grpc://``, ``grpcs://``, ``http(s)://`` or bare ``host:port``."""

from __future__ import annotations

import attrs

__all__ = ["Target", "parse_url"]

_PLAIN_SCHEMES = ("grpc", "http")
_TLS_SCHEMES = ("grpcs", "https")


@attrs.frozen
class Target:
    """A parsed endpoint: lower-cased host, port, and whether the channel uses TLS."""

    host: str
    port: int
    tls: bool

    @property
    def address(self) -> str:
        """``host:port`` as gRPC wants it (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def _invalid(url: str, why: str) -> ValueError:
    return ValueError(f"invalid gRPC URL {url!r}: {why}")


def parse_url(url: str) -> Target:
    """The :class:`Target` ``url`` names; ``ValueError`` ("invalid gRPC URL") otherwise.

    ``grpc://`` and ``http://`` are plain, ``grpcs://`` and ``https://`` use TLS, and a bare
    ``host:port`` is plain. An IPv6 host is written in brackets (``[::1]:8001``); a trailing
    ``/`` is allowed, any other path is not.
    """
    rest = url.strip()
    tls = False
    if "://" in rest:
        scheme, rest = rest.split("://", 1)
        scheme = scheme.lower()
        if scheme in _TLS_SCHEMES:
            tls = True
        elif scheme not in _PLAIN_SCHEMES:
            raise _invalid(url, f"unsupported scheme {scheme!r} (use grpc, grpcs, http, https)")
    rest = rest.removesuffix("/")
    if rest.startswith("["):
        host, bracket, port_text = rest[1:].partition("]")
        if not bracket or not port_text.startswith(":"):
            raise _invalid(url, "expected [ipv6-host]:port")
        port_text = port_text[1:]
    else:
        host, colon, port_text = rest.partition(":")
        if not colon:
            raise _invalid(url, "missing port")
        if ":" in port_text:
            raise _invalid(url, "too many ':' (write an IPv6 host in brackets)")
    if not host or "/" in host or any(ch.isspace() for ch in host):
        raise _invalid(url, "missing or malformed host")
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        raise _invalid(url, f"port must be a number in 1..65535, got {port_text!r}")
    return Target(host.lower(), int(port_text), tls)
