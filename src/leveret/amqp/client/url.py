"""AMQP URLs: parsing ``amqp://user:pass@host:port/vhost`` and hiding passwords in logs."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

from .errors import ClientError


def safe_url(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


@dataclass
class URLParams:
    host: str
    port: int
    user: str
    password: str
    vhost: str


def parse_url(url: str) -> URLParams:
    """``amqp://user:pass@host:port/vhost`` (vhost percent-encoded; empty path means
    ``/``; user and password default to guest, the port to 5672). Raises ClientError
    for anything else."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ClientError(f"invalid AMQP URL {safe_url(url)!r}: {exc}") from None
    if parts.scheme != "amqp":
        raise ClientError(f"invalid AMQP URL {safe_url(url)!r}: the scheme must be amqp://")
    if not parts.hostname:
        raise ClientError(f"invalid AMQP URL {safe_url(url)!r}: no host")
    path = parts.path.removeprefix("/")
    vhost = urllib.parse.unquote(path) if path else "/"
    return URLParams(
        parts.hostname,
        port or 5672,
        urllib.parse.unquote(parts.username or "guest"),
        urllib.parse.unquote(parts.password or "guest"),
        vhost,
    )
