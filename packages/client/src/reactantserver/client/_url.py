"""Where a client connects: ``grpc://``, ``grpcs://`` or a bare ``host:port``."""

from __future__ import annotations

import attrs

__all__ = ["Target", "parse_url"]

_PLAIN_SCHEMES = ("grpc",)
_TLS_SCHEMES = ("grpcs",)
#: HTTP's schemes name a REST endpoint (a server's HTTP port, 8000 by Triton's convention);
#: this client speaks gRPC, so it refuses them rather than dial HTTP/2 at an HTTP/1.1 port.
_REST_SCHEMES = {"http": "grpc", "https": "grpcs"}


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

    ``grpc://`` is plain, ``grpcs://`` uses TLS, and a bare ``host:port`` is plain.
    ``http://`` and ``https://`` are refused with a message naming the gRPC scheme to use
    (they name REST endpoints). An IPv6 host is written in brackets (``[::1]:8001``); a
    trailing ``/`` is allowed, any other path is not.
    """
    rest = url.strip()
    tls = False
    if "://" in rest:
        scheme, rest = rest.split("://", 1)
        scheme = scheme.lower()
        if scheme in _REST_SCHEMES:
            raise _invalid(
                url,
                f"{scheme}:// names a REST (HTTP) endpoint and this client speaks gRPC; "
                f"use {_REST_SCHEMES[scheme]}://host:port with the server's gRPC port "
                "(8001 by default), or tritonclient.http for REST",
            )
        if scheme in _TLS_SCHEMES:
            tls = True
        elif scheme not in _PLAIN_SCHEMES:
            raise _invalid(url, f"unsupported scheme {scheme!r} (use grpc or grpcs)")
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
