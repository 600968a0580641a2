"""Publishing a link's messages into this broker directly, through core's publish path,
as RabbitMQ's federation publishes over a direct (in-VM) connection: no AMQP connection
from the broker to itself, so no frames to encode and parse and no socket writes and
reads for the downstream half of each move (issue 31's bench: this half was most of a
leveret downstream's CPU per message).

:class:`LocalPublisher` offers the part of an aiormq channel a link uses:
``basic_publish(body, exchange=..., routing_key=..., properties=...)``, answering as a
channel in confirm mode does: ``Basic.Ack`` once core confirms the message (at once when
it reached no durable queue as a persistent message, once on disk otherwise),
``Basic.Nack`` when core refuses it (a full ``x-overflow: reject-publish`` queue, a failed
store write); without confirms, ``None`` once published. ``closing`` is a future that
fails as a channel closed by the broker would, on a refusal of the publish itself (404
for a deleted exchange, 403 for a permission): the link's session then ends and it
reconnects after ``reconnect-delay``.

Permissions are ``user``'s (``guest``, what the shovels' and RabbitMQ's local ``amqp://``
means), checked as an AMQP client's. While a resource alarm is raised or the store's
flow control holds publishers, the next publish waits, as an AMQP publisher is blocked
(unconfirmed messages stay unacknowledged upstream, at most ``prefetch-count``).

The publisher shows among the broker's connections as RabbitMQ's link's direct
connection does (:class:`~.direct.DirectConnection`: ``type`` ``direct``, protocol
``Direct 0-9-1``, one channel); an operator closing it fails ``closing`` with
``CONNECTION_FORCED - <reason>``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

from pamqp import commands

from ..core.access import Access
from ..core.connections import ChannelFacts
from ..core.errors import BrokerError
from ..core.message import PROPERTY_NAMES, Message, Properties
from ..core.publish import Publisher
from ..core.session import Session
from .direct import DirectConnection

if TYPE_CHECKING:
    from ..core.broker import BrokerCore

#: pamqp's ``BasicProperties`` names that core's :class:`Properties` shares.
_SHARED = tuple(name for name in PROPERTY_NAMES if name != "type")


def core_properties(properties: Any) -> Properties:
    """Core's properties from pamqp's ``BasicProperties`` (whose ``message_type`` is
    AMQP's ``type``; ``cluster_id``, deprecated, is not carried, as RabbitMQ 3.10 keeps
    it but nothing reads it)."""
    if properties is None:
        return Properties()
    out = Properties(**{name: getattr(properties, name, None) for name in _SHARED})
    out.type = getattr(properties, "message_type", None)
    return out


class LocalPublisher:
    """Publishes into ``vhost`` of ``core`` as ``user``, with confirms when ``confirms``
    (see the module doc). Use it on the broker's event loop; :meth:`close` when done
    (a link puts it among its connections, which its session's end closes). Its direct
    connection (:attr:`connection`) is named after ``node`` (this broker's cluster
    name) and carries ``connection_name`` (RabbitMQ's ``Federation link (upstream: U,
    policy: P)``) as its client property."""

    def __init__(
        self,
        core: BrokerCore,
        vhost: str,
        confirms: bool,
        user: str = "guest",
        node: str = "leveret",
        connection_name: str | None = None,
    ) -> None:
        found = core.users.users.get(user)
        if found is None:  # as a refused login to this broker over amqp://
            raise ConnectionError(f"ACCESS_REFUSED - user '{user}' not found on this broker")
        if vhost not in core.vhosts:
            raise ConnectionError(f"NOT_ALLOWED - vhost '{vhost}' not found")
        self.core = core
        self.confirms = confirms
        session = Session(core.vhosts[vhost], Access(core.users, found, vhost), self)
        self.publisher = Publisher(session, self)
        if confirms:
            self.publisher.select_confirms()
        loop = asyncio.get_running_loop()
        self.closing: asyncio.Future[None] = loop.create_future()
        self._waiting: deque[tuple[int, asyncio.Future[Any]]] = deque()  # (seq, its answer), in order
        self._held: asyncio.Future[None] | None = None  # set while an alarm or flow control holds us
        try:
            self.connection = DirectConnection(
                core, vhost, user, node, connection_name, self._channel_facts, self._forced
            )
        except BrokerError as exc:  # the vhost's or user's connection limit
            self.publisher.close()
            raise ConnectionError(f"{exc.condition.upper()} - {exc.text}") from None

    @property
    def name(self) -> str:
        """The direct connection's name (``local_connection`` of the link's row)."""
        return self.connection.name

    async def basic_publish(
        self, body: bytes, exchange: str = "", routing_key: str = "", properties: Any = None
    ) -> Any:
        """Publish one message (see the module doc for the answer). Raises the failure
        ``closing`` got on a refused publish (ConnectionError with RabbitMQ's text)."""
        core = self.core
        while core.alarm_active or core.flow.active:
            await self._hold()
        if self.closing.done():
            raise ConnectionError("the link's local publisher is closed")
        publisher = self.publisher
        try:
            target = publisher.exchange(exchange, routing_key)
            message = Message.build(exchange, routing_key, body, core_properties(properties))
            answer: asyncio.Future[Any] | None = None
            if self.confirms:
                answer = asyncio.get_running_loop().create_future()
                self._waiting.append((publisher.seq + 1, answer))
            publisher.publish(target, message)
        except BrokerError as exc:  # what would close an AMQP channel: end the link's session
            error = ConnectionError(f"{exc.condition.upper()} - {exc.text}")
            self._fail(error)
            raise error from None
        return None if answer is None else await answer

    async def close(self) -> None:
        """Stop: later answers never come (the upstream gets its unacked messages back).
        A coroutine, as an aiormq connection's ``close``: a link closes it with them."""
        self._release()
        self.publisher.close()
        self.connection.close()
        self._fail(ConnectionError("the link's local publisher is closed"))

    def _forced(self, reason: str) -> None:
        """An operator closed the direct connection (or its vhost went): the link's
        session ends on ``closing``; the connection leaves the registry at once."""
        self.connection.close()
        self._fail(ConnectionError(reason))

    def _channel_facts(self) -> ChannelFacts:
        """The direct connection's one channel, as ``/api/channels`` shows it."""
        return ChannelFacts(
            number=1,
            confirm=self.confirms,
            messages_unconfirmed=len(self._waiting),
            state="closing" if self.closing.done() else "running",
        )

    # -- holding back -----------------------------------------------------------------
    async def _hold(self) -> None:
        """Wait while an alarm is raised or flow control is on (listening to core only
        meanwhile, so a publisher that is never held leaves nothing registered)."""
        core = self.core
        if self._held is None or self._held.done():
            self._held = asyncio.get_running_loop().create_future()
            if core.alarm_active:
                core.alarm_listeners.append(self._on_alarm)
            elif core.flow.active:
                core.flow.hold(self)
        await asyncio.wait([self._held, self.closing], return_when=asyncio.FIRST_COMPLETED)
        if self.closing.done():
            raise ConnectionError("the link's local publisher is closed")

    def _on_alarm(self, active: bool) -> None:
        if not active:
            self._release()

    def flow_released(self) -> None:
        """Core's flow control ended (:class:`~leveret.core.flow.Held`)."""
        self._release()

    def _release(self) -> None:
        """Stop listening; the publish waiting looks again (alarm and flow)."""
        if self._on_alarm in self.core.alarm_listeners:
            self.core.alarm_listeners.remove(self._on_alarm)
        self.core.flow.forget(self)
        if self._held is not None and not self._held.done():
            self._held.set_result(None)

    # -- core's publisher events --------------------------------------------------------
    def confirms_ready(self) -> None:
        taken = self.publisher.take_confirms()
        if taken is not None:
            self._answer(taken[0], commands.Basic.Ack())

    def rejected(self, seq: int, before: tuple[int, bool] | None) -> None:
        if before is not None:
            self._answer(before[0], commands.Basic.Ack())
        self._answer(seq, commands.Basic.Nack())

    def returned(self, exchange: str, message: Message) -> None:
        """Never called: the link does not publish ``mandatory``."""

    def _answer(self, upto: int, answer: Any) -> None:
        waiting = self._waiting
        while waiting and waiting[0][0] <= upto:
            _, future = waiting.popleft()
            if not future.done():
                future.set_result(answer)

    def _fail(self, error: BaseException) -> None:
        if not self.closing.done():
            self.closing.set_exception(error)
            self.closing.exception()  # retrieved: the link may not be waiting on it yet
        while self._waiting:
            _, future = self._waiting.popleft()
            if not future.done():
                future.set_exception(error)
                future.exception()
