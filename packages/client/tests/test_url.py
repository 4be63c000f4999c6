"""parse_url: every accepted form, and every rejected one."""

from __future__ import annotations

import pytest

from reactantserver.client import Target, parse_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("grpc://127.0.0.1:8001", Target("127.0.0.1", 8001, tls=False)),
        ("grpcs://example.com:443", Target("example.com", 443, tls=True)),
        ("localhost:8001", Target("localhost", 8001, tls=False)),
        ("127.0.0.1:1", Target("127.0.0.1", 1, tls=False)),
        ("host:65535", Target("host", 65535, tls=False)),
        # Host lower-cased, whatever the scheme.
        ("grpc://Inference.Example.COM:8001", Target("inference.example.com", 8001, tls=False)),
        ("grpcs://GPU-Box:443", Target("gpu-box", 443, tls=True)),
        ("LocalHost:8001", Target("localhost", 8001, tls=False)),
        # IPv6 hosts in brackets; the brackets are not part of the host.
        ("[::1]:8001", Target("::1", 8001, tls=False)),
        ("grpc://[::1]:8001", Target("::1", 8001, tls=False)),
        ("grpcs://[FE80::1]:443", Target("fe80::1", 443, tls=True)),
        # A trailing slash is allowed.
        ("grpc://127.0.0.1:8001/", Target("127.0.0.1", 8001, tls=False)),
        ("grpcs://example.com:443/", Target("example.com", 443, tls=True)),
        ("localhost:8001/", Target("localhost", 8001, tls=False)),
        ("grpc://[::1]:8001/", Target("::1", 8001, tls=False)),
    ],
)
def test_accepted(url: str, expected: Target) -> None:
    assert parse_url(url) == expected


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("grpc://Example.com:8001", "example.com:8001"),
        ("[::1]:8001", "[::1]:8001"),
        ("grpcs://[FE80::1]:443/", "[fe80::1]:443"),
    ],
)
def test_address_is_what_grpc_dials(url: str, address: str) -> None:
    assert parse_url(url).address == address


@pytest.mark.parametrize(
    "url",
    [
        # Unsupported schemes.
        "ftp://host:8001",
        "unix:///tmp/socket",
        "ws://host:8001",
        # Missing port.
        "host",
        "grpc://host",
        "grpc://host:",
        "grpcs://example.com/",
        "[::1]",
        "grpc://[::1]",
        # Non-numeric port.
        "host:http",
        "grpc://host:80a",
        "host:-1",
        "host:+1",
        "host: 8001",
        "host:8001.0",
        # Port out of range.
        "host:0",
        "grpc://host:65536",
        "host:99999",
        # Extra colons (an IPv6 host must be bracketed).
        "host:8001:1",
        "grpc://a:b:8001",
        "::1:8001",
        "fe80::1",
        # Empty host.
        ":8001",
        "grpc://:8001",
        "[]:8001",
        "",
        "grpc://",
        # A path other than a trailing slash.
        "grpc://host:8001/v2",
        "host:8001//",
        # Broken brackets.
        "[::1:8001",
        "[::1]8001",
    ],
)
def test_rejected(url: str) -> None:
    with pytest.raises(ValueError, match="invalid gRPC URL"):
        parse_url(url)


def test_rejected_superscript_port() -> None:
    with pytest.raises(ValueError, match="invalid gRPC URL"):
        parse_url("host:²")


def test_message_names_the_url() -> None:
    with pytest.raises(ValueError, match="ftp://host:8001"):
        parse_url("ftp://host:8001")


@pytest.mark.parametrize(
    ("url", "instead"),
    [
        ("http://localhost:8001", "grpc://"),
        ("HTTPS://example.com:8443", "grpcs://"),
        ("http://[::1]:8000/", "grpc://"),
    ],
)
def test_http_urls_are_refused_with_the_grpc_scheme_to_use(url: str, instead: str) -> None:
    with pytest.raises(ValueError, match="invalid gRPC URL") as refused:
        parse_url(url)
    message = str(refused.value)
    assert "REST" in message
    assert f"use {instead}host:port" in message
