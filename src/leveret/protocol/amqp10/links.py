"""AMQP 1.0 links (§2.6) on core: an :class:`IncomingLink` publishes what a client
sends; an :class:`OutgoingLink` is core's consumer on a queue, sending as far as the
client's link credit goes.

Incoming (the client is the sender). The broker grants :data:`LINK_CREDIT` and renews it
when half is used, unless :data:`MAX_UNCONFIRMED` deliveries still wait for their
outcome or a resource alarm is on (RabbitMQ 4 likewise grants no credit during an
alarm): a client cannot make the broker hold more than that. A transfer without credit
detaches the link with ``amqp:link:transfer-limit-exceeded``, a message over
:data:`MAX_MESSAGE_SIZE` with ``amqp:link:message-size-exceeded``. An unsettled delivery
is settled (``disposition``, ``settled``) once it is safe, as a publisher confirm:

- ``accepted``: routed (persistent messages of durable queues on disk);
- ``released``: routed to no queue (RabbitMQ 4's outcome for an unroutable message);
- ``rejected``: refused by a queue (``x-overflow: reject-publish``), a failed write, or,
  for a message addressed by its ``to``, an address that does not resolve (with the
  error: ``amqp:not-found``, ``amqp:unauthorized-access``, ``amqp:invalid-field``).

Outgoing (the client is the receiver): a source ``/queues/:queue``; each delivery takes
one credit (§2.6.7), ``drain`` uses the rest up when the queue has nothing more. The
source's filters (JMS selector, AMQP filter expressions, stream offset and filter
values: :mod:`.filters`) become the consumer's selector and arguments. The client
settles with an outcome (RabbitMQ 4's mapping):

- ``accepted``: acknowledged;
- ``rejected``: dead-lettered (reason ``rejected``, ``x-death``), or dropped;
- ``released``: back to the queue, not counted as a failed delivery;
- ``modified``: ``undeliverable-here`` dead-letters as ``rejected`` does; otherwise back
  to the queue, counted toward the delivery limit and the redelivery policy when
  ``delivery-failed`` (RabbitMQ 4.3's delivery count), not counted otherwise.

A link detached, or its session or connection gone: its unsettled deliveries return to
their queue, redelivered.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from ...core.errors import BrokerError
from ...core.message import Message
from ...core.publish import REPLY_TO_PREFIX, Publisher
from ...core.queues import Queue, QueuedMessage
from . import errors as e, performatives as perf
from .address import Address, parse
from .delivery_annotations import with_annotations
from .filters import source_filters
from .frames import FastTransfer
from .link_common import answer_attach, drain_or_echo, flow_credit
from .message import address_fields, annotated, decode_publish, encode_transfer
from .reply_to import ReplyToLink, wants_reply_to
from .transfer_frames import transfer_frame
from .types import DecodeError

if TYPE_CHECKING:
    from ...core.selector import Selector
    from ...core.session import Session
    from .session import Amqp10Session

log = logging.getLogger("leveret.amqp10")

#: Credit the broker grants an incoming link, renewed when half is used.
LINK_CREDIT = 256
#: Deliveries of one incoming link that may wait for their outcome before the broker
#: stops renewing its credit.
MAX_UNCONFIRMED = 2 * LINK_CREDIT
#: Bytes: the largest message the broker takes (RabbitMQ 4's ``max_message_size``
#: default, 16 MiB), announced in its attach.
MAX_MESSAGE_SIZE = 16 * 1024 * 1024
#: Bytes of unfinished multi-frame deliveries one connection may hold, all its links
#: together: past it the link adding to them is detached with
#: ``amqp:resource-limit-exceeded`` (a client cannot make the broker buffer
#: 16 MiB on each of thousands of links).
MAX_PARTIAL_BYTES = 64 * 1024 * 1024
_UINT = 2**32
_ACCEPTED = perf.Accepted()
_RELEASED = perf.Released()


def attach_link(session: Amqp10Session, attach: perf.Attach) -> IncomingLink | OutgoingLink | ReplyToLink:
    """The link a client's attach asks for; LinkFault (or core's BrokerError) when
    refused."""
    if attach.role == perf.ROLE_SENDER:
        return IncomingLink(session, attach)
    if wants_reply_to(attach.source):
        return ReplyToLink(session, attach)
    return OutgoingLink(session, attach)


def _core_session(session: Amqp10Session) -> Session:
    core_session = session.connection.session
    assert core_session is not None
    return core_session


class IncomingLink:
    """A link the client sends on: its messages are published (see the module doc)."""

    detaching = False

    def __init__(self, session: Amqp10Session, attach: perf.Attach) -> None:
        self.session = session
        self.name = attach.name
        self.handle = attach.handle
        self.attach = attach
        target = attach.target
        if isinstance(target, perf.Target) and target.dynamic:
            raise e.LinkFault(e.NOT_IMPLEMENTED, "dynamic targets are not supported")
        if not isinstance(target, perf.Target):
            raise e.LinkFault(e.NOT_IMPLEMENTED, "transactions (a coordinator target) are not supported")
        #: The fixed address, or None: each message's ``to`` (RabbitMQ 4's null target).
        self.address: Address | None = None
        self.core_session = _core_session(session)
        self.publisher = Publisher(self.core_session, self)
        self.publisher.select_confirms()
        #: AMQP 1.0's share of the broker's counters; the publisher's confirms counted
        self._counted = session.connection.core.metrics.amqp10
        self._confirms_seen = 0
        if isinstance(target.address, str):
            self.address = parse(target.address, as_source=False)
            self._check(self.address)
        elif target.address is not None:
            raise e.LinkFault(e.INVALID_FIELD, "a target address must be a string")
        self.delivery_count = attach.initial_delivery_count or 0
        self.credit = 0
        self.settled_mode = attach.snd_settle_mode == perf.SND_SETTLED
        # a delivery in several transfers: its parts, id, settled flag and size so far
        self._parts: list[bytes] | None = None
        self._partial_id = 0
        self._partial_settled = False
        self._partial_size = 0
        #: (publish seq, delivery id) of the unsettled deliveries, in publish order
        self._pending: deque[tuple[int, int]] = deque()
        #: publish seq -> an outcome other than accepted
        self._outcomes: dict[int, Any] = {}
        self._known_upto = 0  # publishes whose outcome is known
        self._returned = False
        self._now = session.connection.core.clock.time

    def _check(self, address: Address) -> None:
        """The fixed address exists (a v1 queue is created) and may be written to."""
        session = self.core_session
        if address.kind == "queue" and address.name.startswith(REPLY_TO_PREFIX):
            return  # direct reply-to: core finds (or drops) the consumer per message
        if address.kind == "queue":
            if address.declare and address.name not in session.vhost.queues:
                session.declare_queue(address.name, durable=True)
            session.vhost.get_queue(address.name)
            self.publisher.exchange("", address.name)
        else:
            self.publisher.exchange(address.name, address.routing_key or "")

    @property
    def unconfirmed(self) -> int:
        return len(self._pending)

    def attached(self) -> None:
        """Answer the attach (the broker as receiver, settling first), then grant credit."""
        answer_attach(
            self.session,
            self.attach,
            perf.ROLE_RECEIVER,
            self.attach.snd_settle_mode,
            perf.RCV_FIRST,
            max_message_size=MAX_MESSAGE_SIZE,
        )
        self.renew_credit()

    def renew_credit(self) -> None:
        """Top the credit up to :data:`LINK_CREDIT` once half is used, unless too many
        deliveries wait for their outcome or an alarm is on."""
        if (
            self.detaching
            or self.credit >= LINK_CREDIT // 2
            or len(self._pending) >= MAX_UNCONFIRMED
            or self.session.connection.core.alarm_active
        ):
            return
        self.credit = LINK_CREDIT
        self.session.send_flow(self.handle, self.delivery_count, self.credit)

    def flow(self, flow: perf.Flow) -> None:
        """The client's view of the link (its delivery count, drain, echo)."""
        if flow.echo:
            self.session.send_flow(self.handle, self.delivery_count, self.credit)

    # -- transfers ------------------------------------------------------------------------
    def take_credit(self, transfer: perf.Transfer) -> int:
        """A delivery's first transfer uses one credit (§2.6.7); returns its delivery-id.
        LinkFault ``amqp:link:transfer-limit-exceeded`` without credit,
        ``amqp:invalid-field`` without a delivery-id."""
        if self.credit <= 0:
            raise e.LinkFault(e.TRANSFER_LIMIT_EXCEEDED, f"a transfer on link '{self.name}' without credit")
        if transfer.delivery_id is None:
            raise e.LinkFault(e.INVALID_FIELD, "the first transfer of a delivery has no delivery-id")
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) % _UINT
        return transfer.delivery_id

    def transfer_item(self, item: FastTransfer) -> None:
        """:meth:`transfer` of a transfer the frame reader's hot path read
        (:data:`.frames.FastTransfer`): a whole delivery in one frame is published
        here, anything else goes through :meth:`transfer`."""
        if item[6] or self._parts is not None:  # more to come, or the end of a delivery
            self.transfer(perf.Transfer(*item[1:7]), item[7])
            return
        delivery_id = item[2]
        if self.credit <= 0:
            raise e.LinkFault(e.TRANSFER_LIMIT_EXCEEDED, f"a transfer on link '{self.name}' without credit")
        if delivery_id is None:
            raise e.LinkFault(e.INVALID_FIELD, "the first transfer of a delivery has no delivery-id")
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) % _UINT
        self._deliver(item[7], delivery_id, bool(item[5]) or self.settled_mode)
        if self.credit < LINK_CREDIT // 2:
            self.renew_credit()

    def transfer(self, transfer: perf.Transfer, payload: bytes) -> None:
        if transfer.more and self.session.connection.core.alarm_active:
            # a partial delivery is held in memory: blocked as a whole message is
            self.session.connection.block_for_alarm()
        if self._parts is None:
            delivery_id = self.take_credit(transfer)
            settled = bool(transfer.settled) or self.settled_mode
            if transfer.aborted:
                if self.credit < LINK_CREDIT // 2:
                    self.renew_credit()
                return
            if not transfer.more:
                self._deliver(payload, delivery_id, settled)
                if self.credit < LINK_CREDIT // 2:
                    self.renew_credit()
                return
            self._parts = []
            self._partial_id = delivery_id
            self._partial_settled = settled
            self._partial_size = 0
            self._hold_part(payload)
            return
        if transfer.aborted:  # §2.6.14: the delivery is dropped (its credit renewed)
            self._drop_partial()
            if self.credit < LINK_CREDIT // 2:
                self.renew_credit()
            return
        self._hold_part(payload)
        if self._partial_size > MAX_MESSAGE_SIZE:
            self._drop_partial()
            raise e.LinkFault(
                e.MESSAGE_SIZE_EXCEEDED, f"a message of more than {MAX_MESSAGE_SIZE} bytes (max-message-size)"
            )
        self._partial_settled = self._partial_settled or bool(transfer.settled)
        if not transfer.more:
            parts = self._drop_partial()
            self._deliver(b"".join(parts), self._partial_id, self._partial_settled)
            if self.credit < LINK_CREDIT // 2:
                self.renew_credit()

    def _hold_part(self, payload: bytes) -> None:
        """Keep one frame of an unfinished delivery, counted against the connection's
        :data:`MAX_PARTIAL_BYTES` (LinkFault ``amqp:resource-limit-exceeded`` past it)."""
        assert self._parts is not None
        connection = self.session.connection
        if connection.partial_bytes + len(payload) > MAX_PARTIAL_BYTES:
            self._drop_partial()
            raise e.LinkFault(
                e.RESOURCE_LIMIT_EXCEEDED,
                f"unfinished deliveries on this connection would hold more than {MAX_PARTIAL_BYTES} bytes",
            )
        self._parts.append(payload)
        self._partial_size += len(payload)
        connection.partial_bytes += len(payload)

    def _drop_partial(self) -> list[bytes]:
        """The unfinished delivery's frames, no longer held (nor counted)."""
        parts, self._parts = self._parts or [], None
        self.session.connection.partial_bytes -= self._partial_size
        self._partial_size = 0
        return parts

    def _deliver(self, payload: bytes, delivery_id: int, settled: bool) -> None:
        """Publish one complete message (see the module doc for its outcome)."""
        if len(payload) > MAX_MESSAGE_SIZE:
            raise e.LinkFault(
                e.MESSAGE_SIZE_EXCEEDED, f"a message of {len(payload)} bytes (max-message-size)"
            )
        try:
            message, delay = decode_publish(payload, self._now)
        except DecodeError as exc:
            raise e.LinkFault(exc.condition, f"the message does not decode: {exc}") from None
        address = self.address
        try:
            if address is None:
                to, subject = address_fields(message)
                if to is None:
                    raise e.LinkFault(e.INVALID_FIELD, "a message on a null target has no 'to' address")
                address = parse(to, as_source=False)
                self._publish(message, address, subject, delay)
            else:
                self._publish(message, address, None, delay)
        except (e.LinkFault, BrokerError) as exc:
            if self.address is not None and isinstance(exc, BrokerError):
                raise e.LinkFault.of(exc) from None
            if self.address is not None:
                raise
            # a message addressed by its own 'to': it alone is refused
            fault = exc if isinstance(exc, e.Fault) else e.Fault.of(exc)
            if not settled:
                self.session.send(
                    perf.Disposition(
                        perf.ROLE_RECEIVER, delivery_id, None, True, perf.Rejected(fault.error())
                    )
                )
            return
        if not settled:
            self._pending.append((self.publisher.seq, delivery_id))

    def _publish(self, message: Message, address: Address, subject: str | None, delay: int) -> None:
        """Publish ``message`` to ``address`` (``subject``: its routing key where the
        address has none), held ``delay`` ms in the scheduler first."""
        connection = self.session.connection
        core = connection.core
        if core.alarm_active:
            connection.block_for_alarm()
        elif core.flow.active:
            connection.hold_for_flow()
        if address.kind == "queue":
            exchange_name, key = "", address.name
        else:
            exchange_name = address.name
            key = address.routing_key if address.routing_key is not None else subject or ""
        exchange = self.publisher.exchange(exchange_name, key)
        message.exchange = exchange_name
        message.routing_key = key
        self._returned = False
        self.publisher.publish(exchange, message, True, delay)
        counted = self._counted  # as core counted it: every publish of a link is confirmed
        counted.received += 1
        counted.received_confirm += 1
        if self.publisher.seq == 1:
            counted.publishers += 1
        if self._returned:
            self._outcomes[self.publisher.seq] = _RELEASED
            counted.unroutable_returned += 1

    # -- outcomes (the publisher's events) ------------------------------------------------
    def confirms_ready(self) -> None:
        self.session.confirming.add(self)
        self.session.connection._want_flush()

    def rejected(self, seq: int, before: tuple[int, bool] | None) -> None:
        if before is not None:
            self._known_upto = max(self._known_upto, before[0])
            self._counted.confirmed += before[0] - self._confirms_seen
        self._confirms_seen = self.publisher.seq - self.publisher.unconfirmed
        self._outcomes[seq] = perf.Rejected(perf.Error(e.PRECONDITION_FAILED, "the message was not taken"))
        self._known_upto = max(self._known_upto, seq)
        self.confirms_ready()

    def returned(self, exchange: str, message: Message) -> None:
        self._returned = True

    def send_confirms(self) -> None:
        """Settle every delivery whose outcome is known, one disposition per run of
        consecutive delivery ids with the same outcome."""
        if self.detaching:
            return
        confirms = self.publisher.take_confirms()
        if confirms is not None:
            self._known_upto = max(self._known_upto, confirms[0])
            self._counted.confirmed += confirms[0] - self._confirms_seen
            self._confirms_seen = confirms[0]
        pending, outcomes, upto = self._pending, self._outcomes, self._known_upto
        run_first = run_last = -1
        run_state: Any = None
        send = self.session.send_settled
        while pending and pending[0][0] <= upto:
            seq, delivery_id = pending.popleft()
            state = outcomes.pop(seq, _ACCEPTED) if outcomes else _ACCEPTED
            if state is run_state and delivery_id == (run_last + 1) % _UINT:
                run_last = delivery_id
                continue
            if run_state is not None:
                send(run_first, run_last, run_state)
            run_first = run_last = delivery_id
            run_state = state
        if run_state is not None:
            send(run_first, run_last, run_state)
        if outcomes:  # settled deliveries' outcomes are not sent
            for seq in [s for s in outcomes if s <= upto]:
                del outcomes[seq]
        if self.credit < LINK_CREDIT // 2:
            self.renew_credit()

    def release(self) -> None:
        """The link is gone: its publisher closes (outcomes not sent yet are lost, as
        the client's unsettled deliveries are when a link goes)."""
        self.detaching = True
        self._drop_partial()
        if self.publisher.seq and not self.publisher.closed:
            self._counted.publishers -= 1
        self.publisher.close()


class OutgoingLink:
    """A link the client receives on: core's consumer on ``queue`` (the Consumer
    protocol of :mod:`leveret.core.queues.base`)."""

    exclusive = False
    prefetch = 0
    priority = 0
    #: its window is the link credit (a stream queue needs no prefetch for it)
    credit_window = True
    __slots__ = (
        "arguments",
        "attach",
        "consuming",
        "counted",
        "credit",
        "delivery_count",
        "detaching",
        "drain",
        "echoed_filter",
        "examined",
        "handle",
        "name",
        "no_ack",
        "queue",
        "selector",
        "session",
        "tag",
        "temporary",
        "unsettled",
    )

    def __init__(self, session: Amqp10Session, attach: perf.Attach) -> None:
        self.session = session
        self.name = attach.name
        self.handle = attach.handle
        self.attach = attach
        self.detaching = False
        self.tag = f"ctag-{session.channel}-{attach.handle}"
        self.arguments: dict = {}
        self.selector: Selector | None = None
        self.examined = 0
        self.credit = 0
        self.delivery_count = 0
        self.drain = False
        self.no_ack = attach.snd_settle_mode == perf.SND_SETTLED
        #: delivery id -> entry, for the deliveries the client has not settled
        self.unsettled: dict[int, QueuedMessage] = {}
        source = attach.source
        if not isinstance(source, perf.Source) or source.dynamic:
            raise e.LinkFault(
                e.NOT_IMPLEMENTED, "a source must be a queue address (dynamic sources are not supported)"
            )
        if not isinstance(source.address, str):
            raise e.LinkFault(e.INVALID_FIELD, "a source needs an address")
        self.temporary = False
        self.queue = self._source_queue(parse(source.address, as_source=True))
        try:
            filters = source_filters(
                source.filter,
                stream=self.queue.type_name == "stream",
                now=session.connection.core.clock.time(),
            )
            self.selector = filters.selector
            self.arguments = filters.arguments
            #: the filters applied, echoed in the attach (§3.5.3)
            self.echoed_filter = filters.echoed
            self.queue.prepare_consumer(self)
        except (e.LinkFault, BrokerError):
            if self.temporary:
                _core_session(session).vhost.delete_queue(self.queue.name)
            raise
        #: AMQP 1.0's share of the delivery counters of this queue's type
        self.counted = session.connection.core.metrics.amqp10.of_queue_type(self.queue.type_name)
        self.consuming = False

    def _source_queue(self, address: Address) -> Queue:
        session = _core_session(self.session)
        if address.kind == "queue":
            if address.declare and address.name not in session.vhost.queues:
                session.declare_queue(address.name, durable=True)
            return session.readable_queue(address.name)
        # a v1 exchange source: a queue of its own, bound with the key, gone with the link
        queue = session.declare_queue("", exclusive=True, auto_delete=True)
        try:
            session.bind(address.name, "queue", queue.name, address.routing_key or "")
        except BrokerError:
            session.vhost.delete_queue(queue.name)
            raise
        self.temporary = True
        return queue

    @property
    def global_prefetch(self) -> int:
        return 0

    def attached(self) -> None:
        """Answer the attach (the broker as sender, the source with the filters
        applied), then wait for credit."""
        source = self.attach.source
        assert isinstance(source, perf.Source)  # checked when the link was made
        answer_attach(
            self.session,
            self.attach,
            perf.ROLE_SENDER,
            perf.SND_SETTLED if self.no_ack else perf.SND_UNSETTLED,
            perf.RCV_FIRST,
            dataclasses.replace(source, filter=self.echoed_filter),
            initial_delivery_count=0,
            max_message_size=MAX_MESSAGE_SIZE,
        )
        self.queue.add_consumer(self)
        self.consuming = True
        self.session.connection.core.metrics.amqp10.consumers += 1

    def can_accept(self) -> bool:
        """Credit left, room in the client's session window, a writable socket, and
        the link not on its way out."""
        return (
            self.credit > 0
            and self.session.remote_incoming_window > 0
            and self.session.connection.writable
            and not self.detaching
        )

    def deliver(self, queue: Queue | None, entry: QueuedMessage) -> None:
        """Send ``entry`` as a transfer (called by the queue)."""
        session = self.session
        delivery_id = session.next_delivery_id
        session.next_delivery_id = (delivery_id + 1) % _UINT
        message = entry.message
        ttl_left = None
        if entry.expires_at:
            ttl_left = max(0, int((entry.expires_at - session.connection.core.clock.time()) * 1000))
        # the header's delivery-count: the failed attempts (§3.2.1), as RabbitMQ 4.3
        extra = self.queue.delivery_headers(entry)
        frame = None
        if not extra:  # the whole frame at once (session.transfer_frame), when it fits
            frame = transfer_frame(
                session.channel,
                self.handle,
                delivery_id,
                self.no_ack,
                session.connection.peer_max_frame_size,
                message,
                entry.failed_count,
                not entry.redelivered,
                ttl_left,
            )
        if frame is None:
            payload = encode_transfer(message, entry.failed_count, not entry.redelivered, ttl_left)
            if extra:  # a stream's x-stream-offset, as a message annotation (RabbitMQ 4)
                payload = with_annotations(payload, extra)
        self.credit -= 1
        self.delivery_count = (self.delivery_count + 1) % _UINT
        counters = self.queue.counters
        counted = self.counted
        if self.no_ack:
            self.queue.ack(entry)
            counters.delivered_consume_auto_ack += 1
            counted.delivered_consume_auto_ack += 1
        else:
            self.unsettled[delivery_id] = entry
            session.unsettled[delivery_id] = self
            counters.delivered_consume_manual_ack += 1
            counted.delivered_consume_manual_ack += 1
        if entry.redelivered:
            counters.redelivered += 1
            counted.redelivered += 1
        if frame is None:
            session.send_transfer(self.handle, delivery_id, self.no_ack, payload)
        else:
            session.send_frame(frame)

    def flow(self, flow: perf.Flow) -> None:
        """The client's credit (§2.6.7): ``delivery-count + link-credit`` of its flow
        less the deliveries sent since; ``drain`` uses up what the queue cannot fill."""
        credit = flow_credit(flow, self.delivery_count)
        if credit is not None:
            self.credit = credit
        self.drain = flow.drain
        if self.credit > 0:
            self.queue.drain()
        drain_or_echo(self, self.drain and not self.detaching, flow.echo, self.queue.message_count)

    def settle(self, delivery_id: int, state: Any) -> Queue | None:
        """The client settled delivery ``delivery_id`` with ``state`` (see the module
        doc); returns the queue to drain. A ``modified`` outcome's message annotations
        go into the message for its next deliveries (§3.4.5); keys not starting with
        ``x-`` end the session with ``amqp:invalid-field``, as RabbitMQ 4 ends it."""
        entry = self.unsettled.get(delivery_id)
        if entry is None:
            return None
        if isinstance(state, perf.Modified) and state.message_annotations:
            try:
                entry.message = annotated(entry.message, state.message_annotations)
            except DecodeError as exc:
                raise e.SessionFault(exc.condition, str(exc)) from None
        del self.unsettled[delivery_id]
        queue = self.queue
        if state is None or isinstance(state, perf.Accepted):
            queue.ack(entry)
            queue.counters.acknowledged += 1
            self.counted.acknowledged += 1
        elif isinstance(state, perf.Rejected) or (
            isinstance(state, perf.Modified) and state.undeliverable_here
        ):
            queue.discard(entry, "rejected")
        elif isinstance(state, perf.Modified) and state.delivery_failed:
            queue.requeue([entry], failed=True)
        else:  # released, or modified without delivery-failed: a return, not a failure
            queue.requeue([entry])
        return queue

    def cancel_by_broker(self) -> None:
        """The queue was deleted: the link is detached with ``amqp:resource-deleted``."""
        self.session.detach_with(
            self, e.LinkFault(e.RESOURCE_DELETED, f"queue '{self.queue.name}' was deleted")
        )

    def release(self) -> None:
        """Stop deliveries; what the client did not settle goes back to the queue."""
        self.detaching = True
        if self.consuming:
            self.consuming = False
            self.session.connection.core.metrics.amqp10.consumers -= 1
        queue = self.queue
        if not queue.deleted:
            queue.remove_consumer(self)
        unsettled, self.unsettled = self.unsettled, {}
        session_unsettled = self.session.unsettled
        for delivery_id in unsettled:
            session_unsettled.pop(delivery_id, None)
        if unsettled:
            queue.requeue(sorted(unsettled.values()))
        if self.temporary and self.session.connection.session is not None:
            self.session.connection.session.vhost.delete_queue(queue.name)
