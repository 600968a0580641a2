"""Limits on the HTTP ports (management API, Prometheus metrics, Web STOMP), the
settings' side: the ``[http]`` table of the config file and the file-descriptor budget.

Each HTTP port takes at most :meth:`HttpLimits.port_cap` connections: the configured
``max_connections``, and never more than an even share of ``fd_fraction`` of the
process's ``RLIMIT_NOFILE`` soft limit among the HTTP ports that are on. The rest of
the descriptors stay for AMQP and STOMP clients, the store and the logs, so slow or
idle HTTP sockets (a slowloris attack) cannot make AMQP's ``accept()`` fail with
EMFILE, nor one HTTP port starve another. RabbitMQ reserved file handles per
subsystem in the same spirit (its file handle cache gave sockets about 90% of the
limit); Ranch, Cowboy's acceptor pool, caps each listener at ``max_connections``
(1,024 by default). The enforcement is in :mod:`.http_guard`; this module has no
aiohttp import, so reading a config file stays cheap.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Any

from ..config_table import numbers

#: ``[http]`` keys and their types (ints are taken for the float ones)
KEYS: dict[str, type] = {
    "header_timeout": float,
    "keepalive_timeout": float,
    "max_connections": int,
    "fd_fraction": float,
}


def descriptor_limit() -> int | None:
    """The process's ``RLIMIT_NOFILE`` soft limit (file descriptors it may hold), or
    None when unlimited or unknown."""
    try:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else soft


#: the most file descriptors :func:`raise_descriptor_limit` asks for
DESCRIPTOR_CEILING = 1_048_576


def raise_descriptor_limit(ceiling: int = DESCRIPTOR_CEILING) -> tuple[int, int] | None:
    """Raise the ``RLIMIT_NOFILE`` soft limit to the hard limit (at most ``ceiling``), as
    the JVM does at start (so ActiveMQ gets its hard limit) and as RabbitMQ's docs ask
    operators to do by hand: the 1,024 that shells give by default would leave each
    HTTP port 85 connections. Returns ``(old, new)`` soft limits when raised, else None
    (already there, unlimited, or not allowed). ``leveret server`` calls it; an embedded
    broker leaves its host process's limits alone."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
        if soft != resource.RLIM_INFINITY and 0 < soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return soft, target
    except (OSError, ValueError):
        pass
    return None


@dataclass
class HttpLimits:
    """The ``[http]`` table; applies to every HTTP port (management, Prometheus, Web
    STOMP, the standby's 503 port), each port on its own."""

    #: seconds a new connection has to deliver its first complete request head
    #: (request line and headers; for Web STOMP the upgrade request), else it is closed:
    #: with ``408 Request Timeout`` if it sent part of one, silently if it sent
    #: nothing. RabbitMQ's ``management.tcp.request_timeout`` (60 s) plays this part.
    header_timeout: float = 20.0
    #: seconds an idle keep-alive connection waits for its next complete request head
    #: after a response before it is closed (aiohttp's ``keepalive_timeout``; Cowboy's
    #: ``request_timeout`` also covers the time between requests)
    keepalive_timeout: float = 60.0
    #: connections one HTTP port holds at most; beyond it a new one gets ``503`` and
    #: is closed at once (Ranch's ``max_connections`` default is 1,024)
    max_connections: int = 1024
    #: fraction of the ``RLIMIT_NOFILE`` soft limit that all HTTP ports together may
    #: hold, split evenly among them; the rest stays for AMQP/STOMP clients and files
    fd_fraction: float = 0.25

    @classmethod
    def from_table(cls, table: Any) -> HttpLimits:
        """The limits of a config file's ``[http]`` table (ValueError naming the key
        when one is unknown, ill-typed or out of range)."""
        limits = cls(**numbers("http", table, KEYS))  # type: ignore[arg-type]
        limits.check()
        return limits

    def check(self) -> None:
        """ValueError if a limit is out of range."""
        if self.header_timeout <= 0 or self.keepalive_timeout <= 0:
            raise ValueError("http.header_timeout and http.keepalive_timeout must be above 0 seconds")
        if self.max_connections < 1:
            raise ValueError("http.max_connections must be 1 or more")
        if not 0 < self.fd_fraction <= 1:
            raise ValueError("http.fd_fraction must be above 0 and at most 1")

    def port_cap(self, ports: int, nofile: int | None = None) -> int:
        """Connections each of ``ports`` HTTP ports may hold: ``max_connections``, at
        most ``fd_fraction`` × ``nofile`` (default: :func:`descriptor_limit`) ÷
        ``ports``, and at least 1."""
        nofile = descriptor_limit() if nofile is None else nofile
        if nofile is None:
            return self.max_connections
        share = int(nofile * self.fd_fraction) // max(ports, 1)
        return max(1, min(self.max_connections, share))
