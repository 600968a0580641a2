"""One AMQP channel: its methods (AMQP 0-9-1 §1.5-1.9 with RabbitMQ's extensions),
publishing with confirms or transactions, consumers, prefetch and acknowledgements.

Errors raised from a handler as :class:`ChannelError` close just this channel; the
connection (:mod:`.connection`) turns them into channel.close with the failing method's
class and method id.
"""

from __future__ import annotations

import base64
import os
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeGuard

from pamqp import commands
from pamqp.base import Frame as Method

from ...amqp import properties as wire
from ...amqp.errors import (
    COMMAND_INVALID,
    FRAME_ERROR,
    INTERNAL_ERROR,
    NO_ROUTE,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    UNEXPECTED_FRAME,
    AMQPConnectionError,
    ChannelError,
    from_reply,
)
from ...amqp.frames import encode_content, encode_method
from ...core.errors import NotImplementedFeature, access_refused, not_found, precondition_failed
from ...core.message import Message
from ...core.publish import REPLY_TO, REPLY_TO_PREFIX, Publisher
from ...core.queues import Queue, QueuedMessage
from ...core.queues.remote import RemoteQueue
from .ack_timeout import AckTimeouts
from .consumer import ChannelConsumer
from .message import AMQP, content_header, from_publish, replace_reply_to, with_delivery_headers

if TYPE_CHECKING:
    from .connection import Connection


def _new_tag(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


#: An unacknowledged delivery: its queue (None: direct reply-to), entry and consumer
#: (None: basic.get).
Unacked = tuple[Queue | None, QueuedMessage, ChannelConsumer | None]


_REPLY_TO_HIGH_BITS = wire.REPLY_TO_FLAG >> 8  # reply_to's bit in the first flag byte
#: Methods that may save or delete a durable definition (their -ok waits for the disk).
_DEFINING = frozenset(
    (
        commands.Exchange.Declare,
        commands.Exchange.Delete,
        commands.Exchange.Bind,
        commands.Exchange.Unbind,
        commands.Queue.Declare,
        commands.Queue.Delete,
        commands.Queue.Bind,
        commands.Queue.Unbind,
    )
)


class Channel:
    """Channel ``number`` of ``connection``; created by channel.open."""

    def __init__(self, connection: Connection, number: int) -> None:
        self.connection = connection
        self.number = number
        vhost = connection.vhost
        assert vhost is not None  # channel.open is refused before connection.open
        self.vhost = vhost
        self.closing = False  # channel.close sent, awaiting close-ok
        self.active = True  # channel.flow
        self.consumers: dict[str, ChannelConsumer] = {}
        self.unacked: OrderedDict[int, Unacked] = OrderedDict()
        self.delivery_tag = 0
        self.prefetch_count = 0  # per consumer (basic.qos global=false)
        self.global_prefetch = 0  # per channel (global=true)
        #: unacknowledged deliveries of consumers with their own window instead of the
        #: channel's (``_own_prefetch``): not counted against ``global_prefetch``
        self.own_unacked = 0
        self.ack_timeouts = AckTimeouts(self)  # consumer timeouts (ack_timeout.py)
        session = connection.session
        assert session is not None  # made with the vhost, at connection.open
        self.session = session
        self.publisher = Publisher(session, self)
        session.vhost.metrics.channels_opened += 1
        self.last_queue = ""
        self.reply_to_key: str | None = None
        self._held_replies: list[Method] | None = None  # replies waiting for the store
        #: While this channel deletes a queue: the basic.cancel its own consumers of that
        #: queue get, sent after delete-ok (see :meth:`_queue_delete`).
        self.deferred_cancels: list[Method] | None = None
        # content being assembled: publish method, header, remaining size, body chunks
        self._publish: commands.Basic.Publish | None = None
        self._header = b""
        self._facts: tuple[int | None, int | None, str | None] = (None, None, None)
        self._remaining = 0
        self._chunks: list[bytes] = []
        self._handlers: dict[type, Callable[[Any], None]] = {
            commands.Channel.Flow: self._channel_flow,
            commands.Channel.FlowOk: lambda m: None,
            commands.Exchange.Declare: self._exchange_declare,
            commands.Exchange.Delete: self._exchange_delete,
            commands.Exchange.Bind: self._exchange_bind,
            commands.Exchange.Unbind: self._exchange_unbind,
            commands.Queue.Declare: self._queue_declare,
            commands.Queue.Bind: self._queue_bind,
            commands.Queue.Unbind: self._queue_unbind,
            commands.Queue.Purge: self._queue_purge,
            commands.Queue.Delete: self._queue_delete,
            commands.Basic.Qos: self._basic_qos,
            commands.Basic.Consume: self._basic_consume,
            commands.Basic.Cancel: self._basic_cancel,
            commands.Basic.Publish: self._basic_publish,
            commands.Basic.Get: self._basic_get,
            commands.Basic.Ack: self._basic_ack,
            commands.Basic.Reject: self._basic_reject,
            commands.Basic.Nack: self._basic_nack,
            commands.Basic.Recover: self._basic_recover,
            commands.Basic.RecoverAsync: self._basic_recover,
            commands.Confirm.Select: self._confirm_select,
            commands.Tx.Select: self._tx_select,
            commands.Tx.Commit: self._tx_commit,
            commands.Tx.Rollback: self._tx_rollback,
        }

    # -- frames in ------------------------------------------------------------------
    @property
    def expecting_content(self) -> bool:
        """Whether a basic.publish waits for its content header and body frames (any
        other method is then a 505 UNEXPECTED_FRAME)."""
        return self._publish is not None

    def handle_method(self, method: Method) -> None:
        """Carry out one method received on this channel. Raises AMQPConnectionError 503 for
        a method a client may not send, the handlers' ChannelError/AMQPConnectionError, and
        core's neutral errors (the connection maps them, :func:`.errors.to_amqp`)."""
        handler = self._handlers.get(type(method))
        if handler is None:  # a server-only method, or connection.* off channel 0
            raise AMQPConnectionError(COMMAND_INVALID, f"unimplemented method {method.name}")
        store = self.vhost.store
        if store is None or type(method) not in _DEFINING:
            handler(method)
            return
        # A durable definition changed: its -ok promises it is on disk, so the reply
        # waits for the store (and the connection reads nothing more meanwhile), as
        # RabbitMQ's channel waits for its database.
        before = store.definition_changes
        self._held_replies = []
        try:
            handler(method)
        finally:
            replies, self._held_replies = self._held_replies, None
        if store.definition_changes == before:
            for reply in replies:
                self.send_method(reply)
        else:
            self.connection.wait_for_store(store, lambda ok: self._stored(ok, replies, method))

    def _stored(self, ok: bool, replies: list[Method], method: Method) -> None:
        """The definitions a method changed are on disk (``ok``), or could not be
        written: then the channel is closed with 406 instead of the -ok."""
        if self.closing or self.connection.channels.get(self.number) is not self:
            return
        if ok:
            for reply in replies:
                self.send_method(reply)
            return
        error = ChannelError(PRECONDITION_FAILED, f"{method.name} could not be written to disk")
        self.connection._channel_error(self.number, error, None)

    def handle_header(self, payload: bytes) -> None:
        """A content header frame's payload (§4.2.6) for the pending basic.publish.
        AMQPConnectionError 505 without one or for a class other than 60, 501 if too short,
        502 for undecodable properties; PreconditionFailed (406) over
        ``max_message_size`` bytes."""
        if self._publish is None or self._header:
            raise AMQPConnectionError(
                UNEXPECTED_FRAME, f"unexpected content header frame on channel {self.number}"
            )
        if len(payload) < 14:
            raise AMQPConnectionError(FRAME_ERROR, "content header frame too short")
        size = wire.declared_body_size(payload)
        class_id = int.from_bytes(payload[:2], "big")
        if class_id != 60:
            raise AMQPConnectionError(UNEXPECTED_FRAME, f"content header for class {class_id}, expected 60")
        limit = self.connection.core.limits.max_message_size
        if size > limit:
            self._publish = None
            raise precondition_failed(f"message size {size} is larger than configured max size {limit}")
        self._facts = wire.scan(payload)  # 502 now rather than a consumer unable to decode it
        self._header = payload
        self._remaining = size
        if size == 0:
            self._content_complete()

    def handle_body(self, payload: bytes) -> None:
        """A content body frame's payload; the message is published once the body
        size the header declared has arrived. AMQPConnectionError 505 without a header or
        for more bytes than declared."""
        if not self._header:
            raise AMQPConnectionError(
                UNEXPECTED_FRAME, f"unexpected content body frame on channel {self.number}"
            )
        self._remaining -= len(payload)
        if self._remaining < 0:
            raise AMQPConnectionError(UNEXPECTED_FRAME, "content body exceeds the size in its header")
        self._chunks.append(payload)
        if self._remaining == 0:
            self._content_complete()

    # -- frames out -----------------------------------------------------------------
    def send_method(self, method: Method) -> None:
        """Queue ``method`` on this channel (written at the connection's next flush;
        held back while a definition is being written, see :meth:`handle_method`)."""
        if self._held_replies is not None:
            self._held_replies.append(method)
            return
        self.connection.send(encode_method(self.number, method))

    def _send_content(self, method: Method, message: Message, header: bytes | None = None) -> None:
        connection = self.connection
        parts = encode_content(
            self.number, header or content_header(message), message.body, connection.frame_max
        )
        parts.insert(0, encode_method(self.number, method))
        connection.send_parts(parts, len(message.body))

    # -- channel --------------------------------------------------------------------
    def _channel_flow(self, method: commands.Channel.Flow) -> None:
        if not method.active:
            # RabbitMQ 3.x: clients may not pause deliveries this way (it throttles
            # publishers with connection.blocked instead).
            raise AMQPConnectionError(NOT_IMPLEMENTED, "active=false")
        self.active = method.active
        self.send_method(commands.Channel.FlowOk(active=method.active))
        if self.active:
            self.resume()

    def resume(self) -> None:
        """Ask the queues of this channel's consumers to deliver (prefetch room or
        flow reopened)."""
        for consumer in list(self.consumers.values()):
            if consumer.queue is not None:
                consumer.queue.drain()

    def release(self, vanished: bool = False) -> None:
        """The channel is closing or its connection is gone: cancel its consumers and
        requeue everything unacknowledged (AMQP 0-9-1 §1.5.2.5), drop an open tx.
        Plain returns, but for a client that ``vanished`` (no connection.close):
        failed deliveries then."""
        for consumer in self.consumers.values():
            if consumer.queue is not None:
                consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        self.ack_timeouts.close()
        if self.reply_to_key is not None:
            self.vhost.reply_consumers.pop(self.reply_to_key, None)
        if not self.publisher.closed:  # released once, however the channel ends
            self.session.vhost.metrics.channels_closed += 1
        # Acks of an uncommitted transaction never happened: those messages come back too.
        uncommitted = self._deferred_settlements(self.publisher.close())
        self._publish = None
        unacked, self.unacked = self.unacked, OrderedDict()
        self.own_unacked = 0
        self._requeue([(tag, *item) for tag, item in unacked.items()] + uncommitted, vanished)

    # -- exchanges ------------------------------------------------------------------
    def _exchange_declare(self, m: commands.Exchange.Declare) -> None:
        self.session.declare_exchange(
            m.exchange, m.exchange_type, m.passive, m.durable, m.auto_delete, m.internal, m.arguments
        )
        if not m.nowait:
            self.send_method(commands.Exchange.DeclareOk())

    def _exchange_delete(self, m: commands.Exchange.Delete) -> None:
        self.session.delete_exchange(m.exchange, m.if_unused)
        if not m.nowait:
            self.send_method(commands.Exchange.DeleteOk())

    def _exchange_bind(self, m: commands.Exchange.Bind) -> None:
        self.session.bind(m.source, "exchange", m.destination, m.routing_key, m.arguments)
        if not m.nowait:
            self.send_method(commands.Exchange.BindOk())

    def _exchange_unbind(self, m: commands.Exchange.Unbind) -> None:
        self.session.unbind(m.source, "exchange", m.destination, m.routing_key, m.arguments)
        if not m.nowait:
            self.send_method(commands.Exchange.UnbindOk())

    # -- queues ---------------------------------------------------------------------
    def _queue_name(self, name: str) -> str:
        """An empty queue name means the channel's last declared queue (§1.8.2.3)."""
        if name:
            return name
        if not self.last_queue:
            raise not_found("no previously declared queue")
        return self.last_queue

    def _readable_queue(self, name: str) -> Queue:
        return self.session.readable_queue(self._queue_name(name))

    def _queue_declare(self, m: commands.Queue.Declare) -> None:
        if m.passive and m.queue == REPLY_TO:
            self.send_method(commands.Queue.DeclareOk(queue=REPLY_TO, message_count=0, consumer_count=0))
            return
        name = self._queue_name(m.queue) if m.passive else m.queue
        queue = self.session.declare_queue(
            name, m.passive, m.durable, m.exclusive, m.auto_delete, m.arguments
        )
        self.last_queue = queue.name
        if not m.nowait:
            self.send_method(
                commands.Queue.DeclareOk(
                    queue=queue.name, message_count=queue.message_count, consumer_count=len(queue.consumers)
                )
            )

    def _queue_bind(self, m: commands.Queue.Bind) -> None:
        self.session.bind(m.exchange, "queue", self._queue_name(m.queue), m.routing_key, m.arguments)
        if not m.nowait:
            self.send_method(commands.Queue.BindOk())

    def _queue_unbind(self, m: commands.Queue.Unbind) -> None:
        self.session.unbind(m.exchange, "queue", self._queue_name(m.queue), m.routing_key, m.arguments)
        self.send_method(commands.Queue.UnbindOk())

    def _queue_purge(self, m: commands.Queue.Purge) -> None:
        count = self._readable_queue(m.queue).purge()
        if not m.nowait:
            self.send_method(commands.Queue.PurgeOk(message_count=count))

    def _queue_delete(self, m: commands.Queue.Delete) -> None:
        name = self._queue_name(m.queue)
        queue = self.session.vhost.queues.get(name)
        if (m.if_unused or m.if_empty) and isinstance(queue, RemoteQueue) and queue.link is not None:
            # another cluster node owns it: only the owner knows whether it is empty or
            # unused (docs/cluster.md); it deletes it, or refuses (406, or 404 unreachable)
            self.session.access.configure("queue", name)
            link = queue.link
            answer: list[tuple[int, tuple[int, str] | None]] = []

            def register(done: Callable[[bool], None]) -> None:
                def replied(count: int, refusal: tuple[int, str] | None) -> None:
                    answer.append((count, refusal))
                    done(True)

                link.delete(name, m.if_unused, m.if_empty, replied)

            self.connection.wait_for(register, lambda ok: self._deleted_on_owner(queue, m, *answer[0]))
            return
        self._delete_here(m, name)

    def _deleted_on_owner(
        self, queue: Queue, m: commands.Queue.Delete, count: int, refusal: tuple[int, str] | None
    ) -> None:
        if refusal is not None:
            error = from_reply(ChannelError, *refusal)
            assert isinstance(error, ChannelError)
            self.connection.fail(error, self.number, (50, 40))
        elif not self.closing and self.connection.channels.get(self.number) is self:
            self._delete_here(m, queue.name, count)  # (gone here already when the owner's change came first)

    def _delete_here(self, m: commands.Queue.Delete, name: str, owner_count: int | None = None) -> None:
        """queue.delete on this node (``owner_count``: the owner deleted it already,
        with that many messages: no more checks here)."""
        # RabbitMQ's channel hears that the queue is gone only once it has replied, so
        # its own consumers' basic.cancel follow delete-ok. A client waiting for the
        # delete-ok would otherwise meet the cancel first: py-amqp (kombu) raises
        # ConsumerCancelled from queue_delete. Other channels' cancels go out at once.
        self.deferred_cancels = []
        try:
            if owner_count is None:
                count = self.session.delete_queue(name, m.if_unused, m.if_empty)
            else:
                self.session.delete_queue(name)
                count = owner_count
        finally:
            cancels, self.deferred_cancels = self.deferred_cancels, None
        if not m.nowait:
            self.send_method(commands.Queue.DeleteOk(message_count=count))
        for cancel in cancels:  # held with the delete-ok while a durable queue's removal is written
            self.send_method(cancel)

    # -- consuming ------------------------------------------------------------------
    def _basic_qos(self, m: commands.Basic.Qos) -> None:
        if m.prefetch_size:
            raise AMQPConnectionError(NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})")
        if m.global_:
            self.global_prefetch = m.prefetch_count
        else:
            self.prefetch_count = m.prefetch_count
        self.send_method(commands.Basic.QosOk())
        self.resume()

    def _basic_consume(self, m: commands.Basic.Consume) -> None:
        name = self._queue_name(m.queue)
        tag = m.consumer_tag or _new_tag("amq.ctag-")
        if tag in self.consumers:
            raise AMQPConnectionError(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        if name == REPLY_TO:
            self._consume_reply_to(m, tag)
            return
        queue = self.session.readable_queue(name)
        arguments = m.arguments or {}
        if "x-lease-group" in arguments:
            self._read_lease(queue, m, tag, arguments)
            return
        if queue.has_exclusive_consumer or (m.exclusive and queue.consumers):
            raise access_refused(f"queue '{name}' in vhost '{self.vhost.name}' in exclusive use")
        consumer = ChannelConsumer(self, queue, tag, m.no_ack, m.exclusive, arguments)
        self.ack_timeouts.subscribe(consumer, queue, arguments)
        if self.global_prefetch and not queue.channel_prefetch:
            self._own_prefetch(consumer, queue)
        queue.prepare_consumer(consumer)
        self.consumers[tag] = consumer
        if not m.nowait:
            self.send_method(commands.Basic.ConsumeOk(consumer_tag=tag))
        queue.add_consumer(consumer)

    def _own_prefetch(self, consumer: ChannelConsumer, queue: Queue) -> None:
        """A channel-wide prefetch on a queue without one (quorum, stream): the
        consumer's own prefetch (the channel's unless basic.qos global=false set one),
        or 540 NOT_IMPLEMENTED as RabbitMQ, by ``Limits.global_qos``."""
        if self.connection.core.limits.global_qos == "refuse":
            where = f"queue '{queue.name}' in vhost '{self.vhost.name}'"
            raise NotImplementedFeature(f"{where} does not support global qos")
        consumer.prefetch = consumer.prefetch or self.global_prefetch
        consumer.channel_window = False

    def _read_lease(self, queue: Queue, m: commands.Basic.Consume, tag: str, arguments: dict) -> None:
        """leveret's leased read (see core.queues.features.leases): deliver the range of sequence numbers
        ``x-lease-from`` … ``x-lease-to`` (exclusive) still held by consumer group
        ``x-lease-group``, each with header ``x-lease-seq``, then cancel the consumer."""
        group, start, end = (arguments.get(k) for k in ("x-lease-group", "x-lease-from", "x-lease-to"))
        if not m.no_ack:
            raise precondition_failed("a leased read must use no-ack: acknowledge with lease.ack")
        if isinstance(group, bytes):
            group = group.decode()
        if not isinstance(group, str) or not _is_integer(start) or not _is_integer(end):
            raise precondition_failed("x-lease-group must be a string, x-lease-from and x-lease-to integers")
        consumer = ChannelConsumer(self, None, tag, True, False, arguments)
        if not m.nowait:
            self.send_method(commands.Basic.ConsumeOk(consumer_tag=tag))
        for seq, entry in queue.lease(group).read(start, end):
            self.delivery_tag += 1
            message = entry.message
            header = with_delivery_headers(content_header(message), (("x-lease-seq", seq),))
            self.connection.send_delivery(
                self.number,
                consumer.encoded_tag,
                self.delivery_tag,
                entry.redelivered,
                message.exchange,
                message.routing_key,
                header,
                message.body,
            )
        self.send_method(commands.Basic.Cancel(consumer_tag=tag, nowait=True))

    def _consume_reply_to(self, m: commands.Basic.Consume, tag: str) -> None:
        """RabbitMQ's direct reply-to: a pseudo-queue consumed with no-ack."""
        if not m.no_ack:
            raise precondition_failed("reply consumer cannot acknowledge")
        if self.reply_to_key is not None:
            raise precondition_failed("reply consumer already set")
        self.reply_to_key = _new_tag("")
        consumer = ChannelConsumer(self, None, tag, True, False, {})
        self.consumers[tag] = consumer
        self.vhost.reply_consumers[self.reply_to_key] = consumer
        if not m.nowait:
            self.send_method(commands.Basic.ConsumeOk(consumer_tag=tag))

    def _basic_cancel(self, m: commands.Basic.Cancel) -> None:
        assert m.consumer_tag is not None  # decoded from the wire: pamqp's None is a default
        consumer = self.consumers.pop(m.consumer_tag, None)
        if consumer is not None:
            if consumer.queue is not None:
                consumer.queue.remove_consumer(consumer)
            elif self.reply_to_key is not None:
                self.vhost.reply_consumers.pop(self.reply_to_key, None)
                self.reply_to_key = None
        if not m.nowait:
            self.send_method(commands.Basic.CancelOk(consumer_tag=m.consumer_tag))

    def deliver(self, consumer: ChannelConsumer, queue: Queue | None, entry: QueuedMessage) -> None:
        """basic.deliver one message to ``consumer`` (called by the queue)."""
        self.delivery_tag += 1
        tag = self.delivery_tag
        message = entry.message
        # content_header's common case inlined: this runs once per delivery
        header = message.encoded if message.format is AMQP and not message.deaths else content_header(message)
        if queue is not None:
            extra = queue.delivery_headers(entry)
            if extra:
                header = with_delivery_headers(header, extra)
        if not consumer.no_ack:
            self.unacked[tag] = (queue, entry, consumer)
            consumer.unacked += 1
            if not consumer.channel_window:
                self.own_unacked += 1
            deadlines = consumer.deadline_group  # consumer timeouts (ack_timeout.py)
            if deadlines is not None:
                now = deadlines.monotonic()  # delivered(tag), inlined: once per delivery
                if now >= deadlines.mark_until:
                    deadlines.mark(tag, now)
            if queue is not None:
                counters = queue.counters
                counters.delivered_consume_manual_ack += 1
                if entry.redelivered:
                    counters.redelivered += 1
        elif queue is not None:  # no_ack: delivered means acknowledged
            queue.ack(entry)
            counters = queue.counters
            counters.delivered_consume_auto_ack += 1
            if entry.redelivered:
                counters.redelivered += 1
        self.connection.send_delivery(
            self.number,
            consumer.encoded_tag,
            tag,
            entry.redelivered,
            message.exchange,
            message.routing_key,
            header,
            message.body,
        )

    def _basic_get(self, m: commands.Basic.Get) -> None:
        self._get_from(self._readable_queue(m.queue), m)

    def _get_from(self, queue: Queue, m: commands.Basic.Get) -> None:
        """basic.get-ok with the head message, or get-empty; when the next messages are
        on their way from the store (nothing in memory), the reply waits for them and
        the connection reads nothing more meanwhile, as for a durable declare."""
        if self.closing or self.connection.channels.get(self.number) is not self:
            return
        entry = queue.get()
        if entry is None and queue.paging_in():
            self.connection.wait_for(queue.when_paged_in, lambda ok: self._get_from(queue, m))
            return
        counters = queue.counters
        if entry is None:
            counters.get_empty += 1
            self.send_method(commands.Basic.GetEmpty())
            return
        self.delivery_tag += 1
        message = entry.message
        header = with_delivery_headers(content_header(message), queue.delivery_headers(entry))
        if not m.no_ack:
            self.unacked[self.delivery_tag] = (queue, entry, None)
            self.ack_timeouts.got(queue, self.delivery_tag)
            counters.delivered_get_manual_ack += 1
        else:  # no_ack: delivered means acknowledged
            queue.ack(entry)
            counters.delivered_get_auto_ack += 1
        if entry.redelivered:
            counters.redelivered += 1
        self._send_content(
            commands.Basic.GetOk(
                self.delivery_tag,
                entry.redelivered,
                message.exchange,
                message.routing_key,
                queue.message_count,
            ),
            message,
            header,
        )

    # -- acknowledgements -------------------------------------------------------------
    def _take_unacked(self, tag: int, multiple: bool) -> list[tuple]:
        """Remove and return, as (tag, queue, entry, consumer), the unacknowledged
        deliveries an ack/nack/reject names; 406 for an unknown delivery tag, as RabbitMQ."""
        unacked = self.unacked
        timed_out = self.ack_timeouts.timed_out
        if timed_out and self.ack_timeouts.forget(tag, multiple) and tag not in unacked:
            # graceful consumer timeout: that delivery was returned already
            taken = []
            while multiple and unacked and next(iter(unacked)) < tag:
                current, item = unacked.popitem(last=False)
                taken.append((current, *item))
        elif multiple and tag == 0:
            taken = [(t, *item) for t, item in unacked.items()]
            unacked.clear()
        elif tag not in unacked:
            raise precondition_failed(f"unknown delivery tag {tag}")
        elif multiple:
            taken = []
            while True:
                current, item = unacked.popitem(last=False)
                taken.append((current, *item))
                if current == tag:
                    break
        else:
            taken = [(tag, *unacked.pop(tag))]
        for _, _, _, consumer in taken:
            if consumer is not None:
                consumer.unacked -= 1
                if not consumer.channel_window:
                    self.own_unacked -= 1
        return taken

    def _settle(self, taken: list[tuple], requeue: bool | None, failed: bool = False) -> None:
        """ack (requeue None), requeue (True) or discard (False) taken deliveries;
        ``failed``: a requeue counts as a failed delivery (basic.reject and basic.nack;
        basic.recover returns without counting; RabbitMQ 4.3 counts reject only)."""
        if requeue is None:
            for _, queue, entry, _ in taken:
                if queue is not None:
                    queue.ack(entry)
                    queue.counters.acknowledged += 1
        elif requeue:
            self._requeue(taken, failed)  # the queues drain themselves
            if not self.global_prefetch:
                return
        else:
            for _, queue, entry, _ in taken:
                if queue is not None:
                    queue.discard(entry, "rejected")
        self.resume()

    def return_deliveries(self, taken: list[tuple]) -> None:
        """Return deliveries ``(tag, queue, entry, consumer)`` taken from
        :attr:`unacked` to their queues (a consumer timeout's): plain returns, as a
        cancel or a closed channel makes them, never failures (nack/reject)."""
        self._requeue(taken)

    def _requeue(self, taken: list[tuple], failed: bool = False) -> None:
        by_queue: dict[Queue, list[QueuedMessage]] = {}
        for _, queue, entry, _ in taken:
            if queue is not None:
                by_queue.setdefault(queue, []).append(entry)
        for queue, entries in by_queue.items():
            queue.requeue(entries, failed)

    def _acknowledge(self, tag: int, multiple: bool, requeue: bool | None, failed: bool = False) -> None:
        taken = self._take_unacked(tag, multiple)
        if not self.publisher.defer(self._settle, taken, requeue, failed):
            self._settle(taken, requeue, failed)

    def _basic_ack(self, m: commands.Basic.Ack) -> None:
        self._acknowledge(m.delivery_tag, m.multiple, None)

    def _basic_reject(self, m: commands.Basic.Reject) -> None:
        assert m.delivery_tag is not None  # decoded from the wire: pamqp's None is a default
        # RabbitMQ 4.3: a failure; but from another node of the cluster a plain return (an
        # AMQP 1.0 released there, cluster/peers.py: its failures come as basic.nack)
        failed = not self.publisher.local_only
        self._acknowledge(m.delivery_tag, False, m.requeue, failed=failed)

    def _basic_nack(self, m: commands.Basic.Nack) -> None:
        # a failure, as basic.reject: RabbitMQ 4.3 counts reject only, which leaves the
        # clients that nack to retry (pika's examples, aio-pika's nack()) in a loop that no
        # delivery limit ends (rabbitmq-server discussion #18226)
        self._acknowledge(m.delivery_tag, m.multiple, m.requeue, failed=True)

    def _basic_recover(self, m: commands.Basic.Recover | commands.Basic.RecoverAsync) -> None:
        if not m.requeue:
            raise AMQPConnectionError(NOT_IMPLEMENTED, "requeue=false")
        self._settle(self._take_unacked(0, True), True)
        if isinstance(m, commands.Basic.Recover):
            self.send_method(commands.Basic.RecoverOk())

    # -- publishing -----------------------------------------------------------------
    def _basic_publish(self, m: commands.Basic.Publish) -> None:
        if m.immediate:
            raise AMQPConnectionError(NOT_IMPLEMENTED, "immediate=true")
        self._publish = m
        self._header = b""
        self._chunks = []

    def _content_complete(self) -> None:
        method, header, chunks = self._publish, self._header, self._chunks
        assert method is not None  # content frames are refused without a basic.publish
        self._publish, self._header, self._chunks = None, b"", []
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.publish_content(method.exchange, method.routing_key, method.mandatory, header, body, self._facts)

    def publish_content(
        self,
        exchange_name: str,
        routing_key: str,
        mandatory: bool,
        header: bytes,
        body: bytes,
        facts: tuple[int | None, int | None, str | None],
    ) -> None:
        """Publish a complete message: ``header`` is its checked content header payload
        and ``facts`` what :func:`wire.scan` read from it. Raises NotFound (404) for a
        missing exchange, AccessRefused (403) for an internal one, PreconditionFailed
        (406) for a bad expiration or a direct reply-to without its consumer."""
        core = self.connection.core
        if core.alarm_active:
            self.connection.block_publisher()
        elif core.flow.active:
            self.connection.hold_for_flow()
        exchange = self.publisher.exchange(exchange_name, routing_key)
        message = from_publish(exchange_name, routing_key, header, body, facts)
        if header[12] & _REPLY_TO_HIGH_BITS:
            message = self._rewrite_reply_to(message)
        self.publisher.publish(exchange, message, mandatory)

    def _rewrite_reply_to(self, message: Message) -> Message:
        properties = message.properties
        if properties.reply_to != REPLY_TO:
            return message
        if self.reply_to_key is None:
            raise precondition_failed("fast reply consumer does not exist")
        return replace_reply_to(message, REPLY_TO_PREFIX + self.reply_to_key)

    # -- core's publisher events ------------------------------------------------------
    def returned(self, exchange: str, message: Message) -> None:
        """basic.return 312 NO_ROUTE for an unroutable mandatory message."""
        self._send_content(
            commands.Basic.Return(NO_ROUTE, "NO_ROUTE", exchange, message.routing_key), message
        )

    def confirms_ready(self) -> None:
        """Publisher confirms are ready: send them at the connection's next flush
        (:meth:`flush_confirms`)."""
        self.connection.confirm_later(self)

    def rejected(self, seq: int, before: tuple[int, bool] | None) -> None:
        """basic.nack publish ``seq`` (after basic.ack for ``before``, the confirms
        ready ahead of it), unless the channel is closing."""
        if self.closing or self.connection.channels.get(self.number) is not self:
            return
        if before is not None:
            self.send_method(commands.Basic.Ack(delivery_tag=before[0], multiple=before[1]))
        self.send_method(commands.Basic.Nack(delivery_tag=seq, multiple=False, requeue=False))

    def flush_confirms(self) -> None:
        """Send one basic.ack (multiple when it covers several) for every publish
        confirmed since the last flush; the connection calls it once per loop turn."""
        confirms = self.publisher.take_confirms()
        if confirms is not None:
            self.send_method(commands.Basic.Ack(delivery_tag=confirms[0], multiple=confirms[1]))

    def _confirm_select(self, m: commands.Confirm.Select) -> None:
        self.publisher.select_confirms()
        if not m.nowait:
            self.send_method(commands.Confirm.SelectOk())

    # -- transactions ---------------------------------------------------------------
    def _tx_select(self, m: commands.Tx.Select) -> None:
        self.publisher.select_transaction()
        self.send_method(commands.Tx.SelectOk())

    def _tx_commit(self, m: commands.Tx.Commit) -> None:
        self.publisher.commit(self._committed)

    def _committed(self, ok: bool) -> None:
        """commit-ok once the transaction is on disk; a failed write closes the channel."""
        if self.closing or self.connection.channels.get(self.number) is not self:
            return
        if ok:
            self.send_method(commands.Tx.CommitOk())
        else:
            self.connection.fail(ChannelError(INTERNAL_ERROR, "store write failed"), self.number, (90, 20))

    def _tx_rollback(self, m: commands.Tx.Rollback) -> None:
        # Acks taken during the transaction become unacknowledged again.
        restored = self._deferred_settlements(self.publisher.rollback())
        if restored:
            for tag, queue, entry, consumer in restored:
                self.unacked[tag] = (queue, entry, consumer)
                if consumer is not None:
                    consumer.unacked += 1
                    if not consumer.channel_window:
                        self.own_unacked += 1
                self.ack_timeouts.restored(tag, queue, consumer)
            self.unacked = OrderedDict(sorted(self.unacked.items()))
        self.send_method(commands.Tx.RollbackOk())

    def _deferred_settlements(self, work: list[tuple[Callable, tuple]]) -> list[tuple]:
        """The deliveries whose acknowledgements ``work`` (a transaction's) held."""
        return [item for action, args in work if action == self._settle for item in args[0]]


def _is_integer(value: object) -> TypeGuard[int]:
    """An integer field value (a boolean is not one, though Python says so)."""
    return isinstance(value, int) and not isinstance(value, bool)
