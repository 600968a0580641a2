"""The HTTP ports' guard against slow and idle sockets (slowloris): a cap on open
connections per port and a header timeout, in front of aiohttp.

aiohttp has no header timeout: before 3.14.5 a connection that never completes its
first request is kept for ever, and since then for ``keepalive_timeout`` (3,630 s by
default). Nor does it cap connections. So each HTTP port listens through
:class:`GuardedSite`, whose sockets get a :class:`GuardedProtocol` wrapped around
aiohttp's own protocol: it passes every callback on, and

- refuses a connection beyond the port's cap (:meth:`.HttpLimits.port_cap`) at once,
  with ``503 Service Unavailable`` and a close, so the descriptor is freed straight
  away (Ranch, under Cowboy, stops accepting instead and leaves them in the backlog);
- closes a connection that has not delivered its first complete request head (request
  line and headers) within ``header_timeout`` seconds: ``408 Request Timeout`` if it
  sent part of one, no reply if it sent nothing. The end of the head is the first
  empty line (CRLF CRLF, or LF LF as aiohttp's parser takes it too), after any empty
  lines before the request line. Later requests on a keep-alive connection are aiohttp's:
  after each response it closes a connection whose next request head is not complete
  within ``keepalive_timeout`` seconds.

A TLS port counts a connection once its handshake is done; the handshake itself is
bounded by ``header_timeout`` too (asyncio's ``ssl_handshake_timeout``). With aiohttp
3.14.5 or later, whose keep-alive timer also runs from the connection's start, the
first request head has the lower of the two timeouts.

Refusals are logged once per episode (the first, then one line when the port takes
connections again); timeouts only at debug level. :attr:`ConnectionGuard.refused`
and :attr:`ConnectionGuard.timed_out` count them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web

from .http_limits import HttpLimits

log = logging.getLogger("leveret.server")

#: the answer to a connection beyond the port's cap
_BUSY = b"Too many open HTTP connections\n"
REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY)
)
#: the answer to a connection that sent part of a request head, too slowly
TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


def _answer_and_close(transport: asyncio.BaseTransport, answer: bytes) -> None:
    """Write ``answer`` (a few bytes: the kernel takes them at once) and close; abort
    if they could not all be handed over, so the descriptor never waits on a peer
    that does not read."""
    stream = cast(asyncio.WriteTransport, transport)
    try:
        stream.write(answer)
    except (OSError, RuntimeError):
        pass
    if stream.get_write_buffer_size():
        stream.abort()
    else:
        stream.close()


class ConnectionGuard:
    """One HTTP port's counts and limits: at most ``cap`` open connections (default:
    ``limits.max_connections``), ``limits.header_timeout`` seconds for the first
    request head. ``name`` names the port in the log."""

    def __init__(self, name: str, limits: HttpLimits | None = None, cap: int | None = None) -> None:
        self.name = name
        self.limits = limits or HttpLimits()
        self.cap = cap if cap is not None else self.limits.max_connections
        #: connections open now (counted from ``connection_made`` to ``connection_lost``)
        self.open = 0
        #: connections refused because the port held :attr:`cap` (since start)
        self.refused = 0
        #: connections closed by the header timeout (since start)
        self.timed_out = 0
        self._refusing = 0  # refusals in the current episode (0: none going on)

    def protocol_factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], GuardedProtocol]:
        """A factory for ``create_server``: ``inner``'s protocols, guarded."""
        return lambda: GuardedProtocol(self, inner())

    def admit(self, transport: asyncio.BaseTransport) -> bool:
        """Count a new connection, or refuse it (503, closed at once) at the cap."""
        if self.open >= self.cap:
            self.refused += 1
            if not self._refusing:
                log.warning(
                    "%s: %d HTTP connections open, the most this port takes (http.max_connections and "
                    "its share of http.fd_fraction); refusing new ones with 503 until some close",
                    self.name,
                    self.open,
                )
            self._refusing += 1
            _answer_and_close(transport, REFUSED)
            return False
        self.open += 1
        return True

    def release(self) -> None:
        """A counted connection closed."""
        self.open -= 1
        if self._refusing and self.open < self.cap:
            log.info("%s: taking HTTP connections again (%d refused)", self.name, self._refusing)
            self._refusing = 0


class GuardedProtocol(asyncio.Protocol):
    """aiohttp's protocol for one socket (``inner``), behind the guard's cap and
    header timeout; every asyncio callback is passed on."""

    __slots__ = ("_counted", "_head_started", "_tail", "_timer", "guard", "inner", "transport")

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._head_started = False  # a byte other than CR/LF has come
        self._tail = b""  # the last bytes seen of the head, to find an empty line across reads
        self._counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self.guard
        if not guard.admit(transport):
            return
        self._counted = True
        self.transport = transport
        self._timer = asyncio.get_running_loop().call_later(guard.limits.header_timeout, self._header_timeout)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self._counted:
            return
        if self._timer is not None:
            self._watch_head(data)
        self.inner.data_received(data)

    def _watch_head(self, data: bytes) -> None:
        """Stop the header timer once the first request head is complete."""
        if not self._head_started:
            data = data.lstrip(b"\r\n")  # empty lines before the request line (RFC 9112 2.2)
            if not data:
                return
            self._head_started = True
        seen = self._tail + data
        if b"\r\n\r\n" in seen or b"\n\n" in seen:
            assert self._timer is not None
            self._timer.cancel()
            self._timer = None
            self._tail = b""
        else:
            self._tail = seen[-3:]

    def _header_timeout(self) -> None:
        self._timer = None
        if self.transport is None or self.transport.is_closing():
            return
        self.guard.timed_out += 1
        log.debug("%s: closing a connection that sent no complete request head in time", self.guard.name)
        if self._head_started:
            _answer_and_close(self.transport, TIMED_OUT)
        else:
            cast(asyncio.WriteTransport, self.transport).abort()

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self._counted else None

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._counted:
            return
        self._counted = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.guard.release()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._counted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self._counted:
            self.inner.resume_writing()


class GuardedSite(web.TCPSite):
    """aiohttp's ``TCPSite`` with its sockets behind ``guard``; a TLS handshake takes
    at most ``guard.limits.header_timeout`` seconds. (Reads ``TCPSite``'s own fields,
    the same from aiohttp 3.9 to 3.14.)"""

    __slots__ = ("guard",)

    def __init__(
        self, runner: web.BaseRunner, host: str | None, port: int, guard: ConnectionGuard, **kwargs: Any
    ):
        super().__init__(runner, host, port, **kwargs)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        extra: dict[str, Any] = {}
        if self._ssl_context is not None:
            extra["ssl_handshake_timeout"] = self.guard.limits.header_timeout
        self._server = await loop.create_server(
            self.guard.protocol_factory(server),
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            **extra,
        )
        if hasattr(self, "_bound_port") and self._server.sockets:  # aiohttp 3.14's TCPSite.port
            self._bound_port = self._server.sockets[0].getsockname()[1]
