"""What every federation link shares: the connect-run-retry loop with RabbitMQ's link
states, the AMQP connections (aiormq, as the shovels), and the status row.

A link's life, as RabbitMQ's federation status shows it: ``starting`` while it
connects and declares, ``running`` while it moves messages, ``error`` (with the
failure's text) until the next attempt ``reconnect-delay`` seconds later, and
``shutdown`` once stopped. Each attempt takes the next of the upstream's URIs.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..core.policy import matching
from ..shovel.worker import close_all, resolve_local
from .connect import open_connection
from .errors import describe
from .upstream import Upstream
from .uri import safe_uri

if TYPE_CHECKING:
    from ..core.broker import BrokerCore

log = logging.getLogger("leveret.federation")

CONNECT_TIMEOUT = 10.0  # seconds to connect and open a channel

#: seconds of AMQP heartbeat a link asks for unless its URI says (the Erlang AMQP client's
#: default; aiormq's own is 60, a dead connection noticed after 183 s)
HEARTBEAT = 10


class Link:
    """One upstream of one federated exchange or queue (``name`` in ``vhost``).
    ``local_uri()`` is this broker over AMQP (the shovels' ``amqp://``); ``node`` the
    name this broker gives itself (in ``x-received-from`` and upstream queue names).

    Subclasses set ``kind`` and implement :meth:`_session`."""

    kind = "link"

    def __init__(
        self, vhost: str, name: str, upstream: Upstream, local_uri: Callable[[], str], node: str
    ) -> None:
        self.vhost, self.name, self.upstream, self.node = vhost, name, upstream, node
        self._local_uri_of = local_uri
        self.state = "starting"
        self.error: str | None = None
        self.since = time.time()  # epoch seconds of the last state change
        self.uri = upstream.uris[0]  # the upstream URI of the current attempt
        self.local_connection: str | None = None
        #: This broker's core, set by the manager before :meth:`start` (an exchange link
        #: follows its exchange's bindings there, a queue link its queue's demand).
        self.core: BrokerCore | None = None
        self.forwarded = 0  # messages moved to this broker
        self._task: asyncio.Task | None = None
        self._connections: list[Any] = []
        self._stopped = False
        self._attempt = 0
        #: set (with the error text) when a broker cancels one of the link's consumers
        self._cancelled: asyncio.Future[str] | None = None

    @property
    def id(self) -> str:
        """A stable short id (RabbitMQ's federation ids are opaque too), for
        ``restart_federation_link``."""
        key = f"{self.kind}\x00{self.vhost}\x00{self.name}\x00{self.upstream.name}"
        return hashlib.sha1(key.encode()).hexdigest()[:8]

    # -- life cycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._stopped = False
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stop moving messages and close both connections (unacked upstream messages
        go back to their queue)."""
        self._stopped = True
        task, self._task = self._task, None
        while task is not None and not task.done():  # aiormq may absorb a cancellation
            task.cancel()
            await asyncio.wait([task], timeout=0.1)
        await self._close()
        self._set("shutdown")

    def restart(self) -> None:
        """``restart_federation_link``: drop the connections and start over now (the
        link is ``starting`` from here on, not ``running`` without its connections)."""
        self._set("starting")
        task = self._task
        if task is not None and not task.done():
            task.cancel()
        self._task = asyncio.ensure_future(self._restart(task))

    async def _restart(self, previous: asyncio.Task | None) -> None:
        if previous is not None:
            await asyncio.wait([previous], timeout=5)
        await self._close()
        self._stopped = False
        await self._run()

    def _set(self, state: str, error: str | None = None) -> None:
        self.state, self.error, self.since = state, error, time.time()

    async def _run(self) -> None:
        while not self._stopped:
            uris = self.upstream.uris
            self.uri = uris[self._attempt % len(uris)]
            self._attempt += 1
            self._set("starting")
            self._cancelled = cancelled = asyncio.get_running_loop().create_future()
            session = asyncio.ensure_future(self._session())
            try:
                done, _ = await asyncio.wait([session, cancelled], return_when=asyncio.FIRST_COMPLETED)
                if session in done:
                    session.result()
                    raise ConnectionError("a connection or channel was closed")
                raise ConnectionError(cancelled.result())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # either side failed: try again later
                error = describe(exc, self.uri)
                if self.state != "error" or self.error != error:
                    log.warning(
                        "federation link %s -> %s (%s): %s", self.upstream.name, self.name, self.vhost, error
                    )
                self._set("error", error)
            finally:
                if not session.done():  # a consumer cancelled by its broker, or a stop
                    session.cancel()
                    await asyncio.wait([session], timeout=1)
                await asyncio.shield(self._close())
            await asyncio.sleep(self.upstream.reconnect_delay)

    async def _session(self) -> None:
        """Connect, declare, and move messages until a connection or channel fails
        (raise; returning counts as a failure too)."""
        raise NotImplementedError

    # -- connections -------------------------------------------------------------------
    def local_uri(self) -> str:
        """This broker on the link's vhost."""
        return self._local_uri_of().rsplit("/", 1)[0] + "/" + quote(self.vhost, safe="")

    def upstream_uri(self) -> str:
        """The URI of this attempt (``amqp://`` with no host is this broker)."""
        return resolve_local(self.uri, self._local_uri_of)

    async def _connect(self, uri: str) -> Any:
        """An open connection to ``uri``, its query read as RabbitMQ's client reads it
        (TLS keys, ``heartbeat``, ``connection_timeout`` in ms, ``auth_mechanism``:
        :mod:`.uri`), given up after :data:`CONNECT_TIMEOUT` seconds unless
        ``connection_timeout`` says. Without a ``heartbeat`` in the URI it asks for
        :data:`HEARTBEAT` seconds, so a partition (no RST) is noticed in about half a
        minute, not aiormq's three (a RabbitMQ 3.10 link with no ``heartbeat`` in its URI
        did not notice in 240 s)."""
        if "heartbeat=" not in uri.partition("?")[2]:
            uri += ("&" if "?" in uri else "?") + f"heartbeat={HEARTBEAT}"
        connection = await open_connection(uri, {}, CONNECT_TIMEOUT)
        self._connections.append(connection)
        self._watch_cancels(connection)
        return connection

    def connection_name(self, vhost: Any, kind: str) -> str | None:
        """RabbitMQ's name for a link's connections (the upstream one's
        ``connection_name`` client property, the direct one's too): ``Federation link
        (upstream: U, policy: P)``, P the policy federating ``name`` in ``vhost`` (a
        core vhost; ``kind`` ``exchanges`` or ``queues``); None without one."""
        policy = matching(vhost.policies, vhost.name, self.name, kind) if vhost is not None else None
        if policy is None:
            return None
        return f"Federation link (upstream: {self.upstream.name}, policy: {policy.name})"

    def _watch_cancels(self, connection: Any) -> None:
        """End the session when the broker cancels a consumer of one of this
        connection's channels (``basic.cancel``: its queue was deleted, say), as
        RabbitMQ's link does (``error`` ``basic_cancel``, then a new attempt that
        declares the queue again). A cancel the link asked for (``basic.cancel-ok``)
        does not count."""
        opened = connection.channel

        async def channel(*args: Any, **kwargs: Any) -> Any:
            made = await opened(*args, **kwargs)
            made.on_consumer_cancel_callbacks.add(self._broker_cancelled)
            return made

        connection.channel = channel

    def _broker_cancelled(self, frame: Any) -> None:
        if self._cancelled is not None and not self._cancelled.done():
            tag = getattr(frame, "consumer_tag", "")
            self._cancelled.set_result(
                f"basic_cancel: the broker cancelled consumer '{tag}' (its queue deleted?)"
            )

    async def _close(self) -> None:
        self.local_connection = None  # the direct connection goes with the session
        connections, self._connections = self._connections, []
        await close_all(connections)

    # -- status --------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """This link's ``/api/federation-links`` row (RabbitMQ 3.10's fields)."""
        row: dict[str, Any] = {
            "node": self.node,
            "vhost": self.vhost,
            "id": self.id,
            "upstream": self.upstream.name,
            "type": self.kind,
            "status": self.state,
            "uri": safe_uri(self.uri),  # no credentials, nor a TLS key's password
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)),
        }
        if self.kind == "exchange":
            row["exchange"] = self.name
            row["upstream_exchange"] = self.upstream.exchange or self.name
        else:
            row["queue"] = self.name
            row["upstream_queue"] = self.upstream.queue or self.name
        if self.local_connection is not None:
            row["local_connection"] = self.local_connection
        if self.state == "error" and self.error is not None:
            row["error"] = self.error
        return row
