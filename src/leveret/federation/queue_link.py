"""A queue federation link: the downstream queue pulls from the upstream queue of the
same name (or the upstream's ``queue``) only while it has consumers with room.

As RabbitMQ's ``rabbit_federation_queue_link`` (3.10): the link consumes from the
upstream queue with ``x-priority`` -1, so a consumer of the upstream queue itself is
always served first and messages move only to where the consumers are; it consumes
while the downstream queue is empty and one of its consumers of priority >= 0 can take
a delivery (:meth:`leveret.core.queues.base.Queue.has_demand`), and cancels that
consumer (the link "pauses") as soon as it is not. A paused link holds no consumer
upstream, so nothing moves; messages already delivered to it are still forwarded. At
most ``prefetch-count`` messages are unacknowledged upstream, so a burst after the
downstream consumers filled up is bounded by it (as in RabbitMQ).

How the link learns of demand (no cost on the publish or delivery path):

* a downstream consume or cancel: ``VirtualHost.consumer_watchers`` (called when the
  queue hands back its ``ConsumerChanged`` action);
* a downstream consumer filling up, or none left: after every forwarded message the link
  looks at the queue (a message left waiting there means nobody could take it);
* the queue draining while paused: the link looks after :data:`POLL_INTERVAL` seconds,
  then at doubling intervals up to :data:`POLL_MAX` while nothing changes (a timer
  callback, no task), and only while paused with downstream consumers (a federated
  queue without consumers costs nothing).

RabbitMQ gets the last two as events from its queue process (``consumer blocked``,
``queue empty``); here they would cost a check per delivery and per acknowledgement in
the queue, for every queue, so the link polls instead.

Each message is republished to the default exchange with the downstream queue's name as
routing key, through this broker's core (:class:`~.local_publish.LocalPublisher`, a
direct connection as RabbitMQ's link has: no AMQP connection to itself), with RabbitMQ's
headers: ``x-received-from`` (an array of tables ``uri``,
``queue``, ``redelivered``, ``visit-count``, the newest first, one per upstream it came
through), and on its first move ``x-original-exchange`` and ``x-original-routing-key``;
a ``CC`` header becomes ``x-original-cc``; ``user_id`` is cleared unless
``trust-user-id``. Queue federation has no ``max-hops`` (RabbitMQ's ignores it too:
messages may go back and forth between queues federated both ways, following the
consumers).

Ack modes: ``on-confirm`` acks upstream once the downstream broker confirmed the
publish (a confirmed message is never lost; one unconfirmed goes back to the upstream
queue when the link's connection drops: at-least-once), ``on-publish`` right after the
publish, ``no-ack`` consumes without acknowledgements (and without a prefetch limit,
as RabbitMQ). The acks of one event-loop turn go as one ``basic.ack multiple=True``
(:class:`~.acks.UpstreamAcks`), held while a pause's ``basic.cancel`` is on its way.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import commands
from yarl import URL

from .acks import UpstreamAcks
from .links import Link
from .local_publish import LocalPublisher

log = logging.getLogger("leveret.federation")

#: Seconds between looks at a paused link's downstream queue while it has consumers.
POLL_INTERVAL = 0.02
#: The longest interval between those looks, in seconds (consumers busy for a long time).
POLL_MAX = 0.16
#: The priority of the link's consumer on the upstream queue (RabbitMQ's).
UPSTREAM_PRIORITY = -1


class QueueLink(Link):
    """One upstream of one federated queue (``name`` in ``vhost``): see the module."""

    kind = "queue"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: True while the link holds a consumer on the upstream queue.
        self.consuming = False
        self._wake: asyncio.Event | None = None
        self._poller: asyncio.TimerHandle | None = None
        self._poll_interval = POLL_INTERVAL

    # -- names ----------------------------------------------------------------------------
    @property
    def upstream_queue(self) -> str:
        """The queue consumed from upstream: the upstream's ``queue``, else the same name."""
        return self.upstream.queue or self.name

    @property
    def consumer_tag(self) -> str:
        """The link's consumer tag upstream: ``consumer-tag``, else RabbitMQ's
        ``federation-link-<upstream name>``."""
        return self.upstream.consumer_tag or f"federation-link-{self.upstream.name}"

    def status(self) -> dict[str, Any]:
        """The ``/api/federation-links`` row, with RabbitMQ's ``consumer_tag``."""
        row = super().status()
        row["consumer_tag"] = self.consumer_tag
        return row

    # -- demand (read from the local queue: the link runs in its broker's loop) ------------
    def _vhost_object(self) -> Any:
        assert self.core is not None, "the manager gives a queue link its broker's core"
        return self.core.vhosts.get(self.vhost)

    def _queue(self) -> Any:
        vhost = self._vhost_object()
        queue = vhost.queues.get(self.name) if vhost is not None else None
        return None if queue is None or queue.deleted else queue

    def _wanted(self) -> bool:
        queue = self._queue()
        return queue is not None and queue.has_demand()

    def _notice(self) -> None:
        """A consumer came or went downstream (called inside the broker: only schedules)."""
        if self._wake is not None:
            self._wake.set()

    def _poll(self) -> None:
        """While paused with consumers: wake the link once the queue wants messages, else
        look again later (backing off to :data:`POLL_MAX`)."""
        self._poller = None
        if self._wake is None:
            return
        if self._wanted():
            self._wake.set()
            return
        self._poll_interval = min(self._poll_interval * 2, POLL_MAX)
        self._poller = asyncio.get_running_loop().call_later(self._poll_interval, self._poll)

    def _keep_polling(self, wanted: bool) -> None:
        """Start the looks when the link is paused with consumers, stop them otherwise."""
        if wanted:
            if self._poller is None:
                self._poll_interval = POLL_INTERVAL
                self._poller = asyncio.get_running_loop().call_later(self._poll_interval, self._poll)
        elif self._poller is not None:
            self._poller.cancel()
            self._poller = None

    def _named(self, uri: str) -> str:
        """``uri`` with RabbitMQ's name for the link's upstream connection (its
        ``connection_name`` client property): ``Federation link (upstream: U, policy: P)``."""
        name = self.connection_name(self._vhost_object(), "queues")
        return uri if name is None else str(URL(uri).update_query(name=name))

    # -- one connected session ----------------------------------------------------------------
    async def _session(self) -> None:
        """Connect both sides, declare the upstream queue if missing, then consume or pause
        as demand says until a connection or channel fails (raises)."""
        upstream = self.upstream
        queue = self._queue()
        if queue is None:
            raise ConnectionError(f"no queue '{self.name}' in vhost '{self.vhost}'")
        assert self.core is not None
        remote = await self._connect(self._named(self.upstream_uri()))
        capabilities = (remote.server_properties or {}).get("capabilities") or {}
        if not capabilities.get("consumer_priorities"):
            raise ConnectionError("upstream_lacks_consumer_priorities")
        channel = await remote.channel(publisher_confirms=False)
        # into this broker through core, not over AMQP to itself (local_publish.py)
        downstream = LocalPublisher(
            self.core,
            self.vhost,
            confirms=upstream.ack_mode == "on-confirm",
            node=self.node,
            connection_name=self.connection_name(self._vhost_object(), "queues"),
        )
        self._connections.append(downstream)  # closed with the connections
        self.local_connection = downstream.name  # its direct connection (direct.py)
        await _ensure_upstream_queue(remote, self.upstream_queue, queue)
        no_ack = upstream.ack_mode == "no-ack"
        if not no_ack:
            await channel.basic_qos(prefetch_count=upstream.prefetch_count)
        acks = UpstreamAcks(channel)  # one basic.ack multiple=True per loop turn (acks.py)
        forward = self._forwarder(channel, downstream, acks)
        cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_cancel(frame: Any) -> None:  # the upstream queue was deleted, say
            if not cancelled.done():
                cancelled.set_result(None)

        channel.on_consumer_cancel_callbacks.add(on_cancel)
        self._wake = wake = asyncio.Event()
        watchers = self._vhost_object().consumer_watchers.setdefault(self.name, [])
        watchers.append(self._notice)
        closed = [asyncio.ensure_future(c.closing) for c in (remote, channel)]
        closed.append(asyncio.ensure_future(_failure(downstream.closing)))
        closed.append(cancelled)
        self._set("running")
        waiter: asyncio.Future[Any] | None = None
        try:
            while True:
                wanted = self._wanted()
                if wanted and not self.consuming:
                    await channel.basic_consume(
                        self.upstream_queue,
                        forward,
                        no_ack=no_ack,
                        consumer_tag=self.consumer_tag,
                        arguments={"x-priority": UPSTREAM_PRIORITY},
                    )
                    self.consuming = True
                elif not wanted and self.consuming:
                    # deliveries before cancel-ok still reach ``forward`` (and are moved)
                    await channel.basic_cancel(self.consumer_tag)
                    self.consuming = False
                acks.release()  # a pause is carried out (or demand is back): ack again
                queue = self._queue()
                self._keep_polling(not self.consuming and queue is not None and bool(queue.consumers))
                waiter = asyncio.ensure_future(wake.wait())
                done, _ = await asyncio.wait([waiter, *closed], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                wake.clear()
                if any(future in done for future in closed):
                    break
        finally:
            if waiter is not None:
                waiter.cancel()
            self._keep_polling(False)
            self.consuming = False
            self._wake = None
            if self._notice in watchers:
                watchers.remove(self._notice)
            if not watchers and self._vhost_object().consumer_watchers.get(self.name) is watchers:
                del self._vhost_object().consumer_watchers[self.name]
            for future in closed:
                future.cancel()
        if cancelled.done():
            raise ConnectionError("the upstream broker cancelled the link's consumer")
        for future in closed:
            if future.done() and not future.cancelled():
                error = future.exception() or future.result()
                if error is not None:
                    raise ConnectionError(str(error))
        raise ConnectionError("a connection or channel was closed")

    def _forwarder(self, channel: Any, downstream: LocalPublisher, acks: UpstreamAcks) -> Any:
        """The consumer callback: republish one upstream delivery to the downstream queue
        through core, acknowledge it upstream as the ack mode says (in batches:
        :class:`~.acks.UpstreamAcks`), and pause when it found no consumer with room.

        Pausing holds the upstream acks until the link's ``basic.cancel`` is answered:
        an ack sent before the cancel would reopen the upstream's prefetch window, and the
        upstream would deliver up to ``prefetch-count`` more on top (the publish through
        core settles a message in the same loop turn, so the acks of the deliveries
        behind the one that found no room would otherwise overtake the cancel). So at
        most ``prefetch-count`` messages move past that one, RabbitMQ's bound."""
        ack_mode = self.upstream.ack_mode
        no_ack = ack_mode == "no-ack"
        wake = self._notice

        async def forward(message: DeliveredMessage) -> None:
            try:
                await move(message)
            except (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError, ConnectionError):
                pass  # a side went away: the session ends, unacked messages go back upstream

        async def move(message: DeliveredMessage) -> None:
            tag = getattr(message.delivery, "delivery_tag", 0)
            result = await downstream.basic_publish(
                message.body, exchange="", routing_key=self.name, properties=self._properties(message)
            )
            if ack_mode == "on-confirm" and not isinstance(result, commands.Basic.Ack):
                await channel.basic_nack(tag, multiple=False, requeue=True)  # back upstream
                acks.settled(tag)
                return
            self.forwarded += 1
            if self.consuming:
                queue = self._queue()
                if queue is None or queue.message_count:  # nobody could take it: pause
                    acks.hold()  # until the cancel is answered (see above)
                    wake()
            if not no_ack:
                acks.ack(tag)

        return forward

    def _properties(self, message: DeliveredMessage) -> Any:
        """The message's properties with RabbitMQ's queue federation headers."""
        properties = message.header.properties
        headers: dict[str, Any] = dict(properties.headers or {})
        delivery = message.delivery
        been = headers.get("x-received-from")
        here = {"uri": _redact(self.uri), "queue": self.name}
        count = 0
        if isinstance(been, list):
            others = []
            for entry in been:
                if isinstance(entry, dict) and all(
                    entry.get(k) == here.get(k) for k in ("uri", "virtual_host", "queue")
                ):
                    visits = entry.get("visit-count")
                    count = visits if isinstance(visits, int) else 0
                else:
                    others.append(entry)
            been = others
        else:  # first move (or a header a client set: ignored, as RabbitMQ)
            headers["x-original-exchange"] = getattr(delivery, "exchange", "") or ""
            headers["x-original-routing-key"] = getattr(delivery, "routing_key", "") or ""
            been = []
        if "CC" in headers:
            headers["x-original-cc"] = headers.pop("CC")
        redelivered = bool(getattr(delivery, "redelivered", False))
        headers["x-received-from"] = [{**here, "redelivered": redelivered, "visit-count": count + 1}, *been]
        properties.headers = headers
        if not self.upstream.trust_user_id:
            properties.user_id = None
        return properties


async def _failure(closing: asyncio.Future[None]) -> BaseException | None:
    """The failure that closed a local publisher (a future of our own to cancel, not
    the publisher's)."""
    try:
        await asyncio.shield(closing)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return exc
    return None


async def _ensure_upstream_queue(connection: Any, name: str, downstream: Any) -> None:
    """RabbitMQ's link: an upstream queue that exists is used as it is; a missing one is
    declared as the downstream queue is (durable, auto-delete, arguments). A passive
    declare on a channel of its own finds out, since a 404 closes that channel."""
    probe = await connection.channel(publisher_confirms=False)
    try:
        await probe.queue_declare(name, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        declare = await connection.channel(publisher_confirms=False)
        await declare.queue_declare(
            name,
            durable=downstream.durable,
            auto_delete=downstream.auto_delete,
            arguments=dict(downstream.arguments) or None,
        )
        await declare.close()
        return
    await probe.close()


def _redact(uri: str) -> str:
    """A URI without its password (RabbitMQ's ``safe_uri``: no user either)."""
    if "@" not in uri or "://" not in uri:
        return uri
    scheme, rest = uri.split("://", 1)
    return f"{scheme}://{rest.rsplit('@', 1)[1]}"
