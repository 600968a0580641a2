"""An AMQP 1.0 session (§2.5.5, §2.7.2): its channels, its transfer windows, its links
by handle, and the deliveries it sent that wait for the client's settlement.

Windows count transfer frames. The broker announces an incoming window of
:data:`INCOMING_WINDOW` and renews it (a ``flow``) once half of it is used: it handles
each transfer as it reads it, so the window bounds nothing the links' credit does not
(an incoming link's credit bounds what a client may send, see :mod:`.links`). A
transfer beyond the window ends the session with ``amqp:session:window-violation``.
The client's incoming window bounds what the broker sends: deliveries wait while it is
used up, until the client's ``flow`` opens it.

Errors: a frame on a handle that is not attached ends the session with
``amqp:session:unattached-handle``, an attach on a handle in use with
``amqp:session:handle-in-use`` (§2.8.17); an attach on a handle above ``handle-max``
closes the connection with ``amqp:connection:framing-error`` (§2.7.2, as RabbitMQ 4);
a link's own error detaches that link only.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING, Any

from ...core.connections import ChannelFacts, ConsumerFacts
from ...core.errors import BrokerError
from . import errors as e, performatives as perf
from .frames import FastTransfer
from .links import IncomingLink, OutgoingLink, attach_link
from .management_link import ResponseLink, management_link
from .reply_to import ReplyToLink
from .transfer_frames import TRANSFER_HEAD as _TRANSFER_HEAD, TRANSFER_HEAD_SIZE as _TRANSFER_HEAD_SIZE

if TYPE_CHECKING:
    from .connection import Amqp10Connection

log = logging.getLogger("leveret.amqp10")

#: Transfer frames the broker lets a client send before it renews the window.
INCOMING_WINDOW = 65_535
#: The broker's outgoing window: it does not hold itself back.
OUTGOING_WINDOW = 2**32 - 1
#: The highest link handle a client may use (RabbitMQ 4's ``max_handle`` default, 255).
HANDLE_MAX = 255
_UINT = 2**32

_FRAME_HEADER = struct.Struct(">IBBH")
_TRANSFER_IDS = struct.Struct(">BIBI")


def transfer_body(handle: int, delivery_id: int, tag: bytes, settled: bool, more: bool) -> bytes:
    """A transfer performative, encoded by hand (the hot path: ~10 times faster than
    the generic encoder): handle, delivery-id, delivery-tag, message-format 0,
    settled, more, as a list32 of fields."""
    fields = (
        _TRANSFER_IDS.pack(0x70, handle, 0x70, delivery_id)
        + bytes((0xA0, len(tag)))
        + tag
        + (b"\x43\x41" if settled else b"\x43\x42")
        + (b"\x41" if more else b"\x42")
    )
    return b"\x00\x53\x14\xd0" + struct.pack(">II", len(fields) + 4, 6) + fields


def _uint(value: int) -> bytes:
    """A uint in the encoder's smallest form (uint0, smalluint, uint)."""
    if value == 0:
        return b"\x43"
    if value < 256:
        return bytes((0x52, value))
    return b"\x70" + value.to_bytes(4, "big")


#: The outcomes :func:`settled_disposition` writes: accepted and released (list0).
_OUTCOME_BYTES = {perf.Accepted: b"\x00\x53\x24\x45", perf.Released: b"\x00\x53\x26\x45"}


def settled_disposition(channel: int, first: int, last: int, state: Any) -> bytes | None:
    """The frame of a disposition the broker sends as receiver, settling deliveries
    ``first`` to ``last`` (uints) with ``state`` accepted or released, encoded by hand
    (the generic encoder's bytes, a few times faster: one per loop turn and link on the
    publish path); None for another state (the generic encoder writes it)."""
    outcome = _OUTCOME_BYTES.get(type(state))
    if outcome is None:
        return None
    fields = b"\x41" + _uint(first) + _uint(last) + b"\x41" + outcome
    body = b"\x00\x53\x15\xc0" + bytes((len(fields) + 1, 5)) + fields
    return _FRAME_HEADER.pack(8 + len(body), 2, 0, channel) + body


class Amqp10Session:
    """Session on the client's channel ``remote_channel``; ``channel`` is ours."""

    def __init__(
        self, connection: Amqp10Connection, channel: int, remote_channel: int, begin: perf.Begin
    ) -> None:
        self.connection = connection
        self.channel = channel
        self.remote_channel = remote_channel
        self.state = "mapped"  # "ending" once the broker sent end with an error
        self.next_outgoing_id = 0
        self.next_incoming_id = begin.next_outgoing_id
        self.remote_incoming_window = begin.incoming_window
        self.remote_outgoing_window = begin.outgoing_window
        self._window_left = INCOMING_WINDOW
        self.handle_max = min(begin.handle_max, HANDLE_MAX)
        #: Links by handle (the broker uses the client's handle numbers as its own).
        self.links: dict[int, IncomingLink | OutgoingLink | ReplyToLink | ResponseLink] = {}
        #: Delivery id -> the outgoing link of each delivery the client has not settled.
        self.unsettled: dict[int, OutgoingLink] = {}
        self.next_delivery_id = 0
        #: Handles the broker detached (or refused to attach) whose detach from the
        #: client is still to come: it is taken without an answer.
        self._detached: set[int] = set()
        #: Incoming links with outcomes to send at the end of the loop turn.
        self.confirming: set[IncomingLink] = set()

    @property
    def confirms_waiting(self) -> bool:
        return bool(self.confirming)

    # -- output -------------------------------------------------------------------------
    def send(self, body: Any) -> None:
        self.connection.send_frame(body, self.channel)

    def answer_begin(self) -> None:
        self.send(
            perf.Begin(
                remote_channel=self.remote_channel,
                next_outgoing_id=self.next_outgoing_id,
                incoming_window=INCOMING_WINDOW,
                outgoing_window=OUTGOING_WINDOW,
                handle_max=self.handle_max,
            )
        )

    def send_flow(
        self,
        handle: int | None = None,
        delivery_count: int | None = None,
        link_credit: int | None = None,
        available: int | None = None,
        drain: bool = False,
    ) -> None:
        """A flow: the session's windows (renewed) and, with ``handle``, a link's state."""
        self._window_left = INCOMING_WINDOW
        self.send(
            perf.Flow(
                next_incoming_id=self.next_incoming_id,
                incoming_window=INCOMING_WINDOW,
                next_outgoing_id=self.next_outgoing_id,
                outgoing_window=OUTGOING_WINDOW,
                handle=handle,
                delivery_count=delivery_count,
                link_credit=link_credit,
                available=available,
                drain=drain,
            )
        )

    def send_settled(self, first: int, last: int, state: Any) -> None:
        """A disposition settling the client's deliveries ``first`` to ``last`` (the
        broker as receiver) with ``state``."""
        frame = settled_disposition(self.channel, first, last, state)
        if frame is None:
            self.send(perf.Disposition(perf.ROLE_RECEIVER, first, last, True, state))
        else:
            self.connection.send(frame)

    def send_frame(self, frame: bytes) -> None:
        """A delivery's whole transfer frame (:func:`transfer_frame`): it uses one of the
        client's incoming window."""
        self.next_outgoing_id = (self.next_outgoing_id + 1) % _UINT
        self.remote_incoming_window -= 1
        self.connection.send_parts([frame], len(frame) - _TRANSFER_HEAD_SIZE)

    def send_transfer(self, handle: int, delivery_id: int, settled: bool, payload: bytes) -> None:
        """One delivery, in as many transfer frames as the client's max-frame-size
        needs; each uses one of the client's incoming window."""
        channel = self.channel
        connection = self.connection
        size = _TRANSFER_HEAD_SIZE + len(payload)
        if size <= connection.peer_max_frame_size:
            self.next_outgoing_id = (self.next_outgoing_id + 1) % _UINT
            self.remote_incoming_window -= 1
            head = _TRANSFER_HEAD.pack(
                size, 2, 0, channel, b"\x00\x53\x14", 0xD0, 23, 6, 0x70, handle, 0x70, delivery_id,
                0xA0, 4, delivery_id, 0x43, 0x41 if settled else 0x42, 0x42,
            )  # fmt: skip
            connection.send_parts([head, payload], len(payload))
            return
        tag = struct.pack(">I", delivery_id)
        body = transfer_body(handle, delivery_id, tag, settled, False)
        room = connection.peer_max_frame_size - 8 - len(body)
        parts = []
        for start in range(0, len(payload), room):
            chunk = payload[start : start + room]
            more = start + room < len(payload)
            head = transfer_body(handle, delivery_id, tag, settled, more)
            parts += [_FRAME_HEADER.pack(8 + len(head) + len(chunk), 2, 0, channel), head, chunk]
            self.next_outgoing_id = (self.next_outgoing_id + 1) % _UINT
            self.remote_incoming_window -= 1
        connection.send_parts(parts, len(payload))

    # -- input --------------------------------------------------------------------------
    def handle(self, body: Any, payload: bytes) -> None:
        """One performative on this session's channel (not open, begin or close)."""
        if self.state == "ending":  # waiting for the client's end: the rest is dropped
            if isinstance(body, perf.End):
                self.connection.session_ended(self)
            return
        try:
            if isinstance(body, perf.Transfer):
                self._transfer(body, payload)
            elif isinstance(body, perf.Disposition):
                self._disposition(body)
            elif isinstance(body, perf.Flow):
                self._flow(body)
            elif isinstance(body, perf.Attach):
                self._attach(body)
            elif isinstance(body, perf.Detach):
                self._detach(body)
            elif isinstance(body, perf.End):
                self._end(body)
        except e.SessionFault as exc:
            self.end_with(exc)

    def _link(self, handle: int | None) -> IncomingLink | OutgoingLink | ReplyToLink | ResponseLink | None:
        """The link on ``handle``; None for one the broker detached (what the client
        sent before it saw the detach is dropped)."""
        link = self.links.get(handle) if handle is not None else None
        if link is None:
            if handle in self._detached:
                return None
            raise e.SessionFault(e.UNATTACHED_HANDLE, f"handle {handle} is not attached")
        return link

    def _transfer(self, transfer: perf.Transfer, payload: bytes) -> None:
        link = self._incoming(transfer.handle)
        if link is None:
            return
        try:
            link.transfer(transfer, payload)
        except e.LinkFault as exc:
            self.detach_with(link, exc)
        if self._window_left < INCOMING_WINDOW // 2:
            self.send_flow()

    def transfer_item(self, item: FastTransfer) -> None:
        """A transfer the frame reader's hot path read (:data:`.frames.FastTransfer`):
        what :meth:`handle` does with it, without a transfer object for a link that
        publishes."""
        if self.state == "ending":
            return
        link = self.links.get(item[1])
        if type(link) is IncomingLink and self._window_left > INCOMING_WINDOW // 2:
            # the common case, as _incoming has it: a link that publishes, the window
            # far from used up
            self.next_incoming_id = (self.next_incoming_id + 1) % _UINT
            self._window_left -= 1
            try:
                link.transfer_item(item)
            except e.LinkFault as exc:
                self.detach_with(link, exc)
            except e.SessionFault as exc:
                self.end_with(exc)
            return
        try:
            link = self._incoming(item[1])
            if link is None:
                return
            try:
                if type(link) is IncomingLink:
                    link.transfer_item(item)
                else:
                    link.transfer(perf.Transfer(*item[1:7]), item[7])
            except e.LinkFault as exc:
                self.detach_with(link, exc)
            if self._window_left < INCOMING_WINDOW // 2:
                self.send_flow()
        except e.SessionFault as exc:
            self.end_with(exc)

    def _incoming(self, handle: int) -> IncomingLink | None:
        """A transfer on ``handle`` arrived: counted against the session's window
        (SessionFault ``amqp:session:window-violation`` past it); the link it is for
        (None: one the broker detached; SessionFault ``amqp:illegal-state`` for a
        link the broker sends on)."""
        self.next_incoming_id = (self.next_incoming_id + 1) % _UINT
        self._window_left -= 1
        if self._window_left < 0:
            raise e.SessionFault(e.WINDOW_VIOLATION, f"more than {INCOMING_WINDOW} transfers past the window")
        link = self._link(handle)
        if link is None:
            return None
        if not isinstance(link, IncomingLink):
            raise e.SessionFault(e.ILLEGAL_STATE, f"a transfer on handle {handle}, where the broker sends")
        return link

    def _flow(self, flow: perf.Flow) -> None:
        was_shut = self.remote_incoming_window <= 0
        self.remote_outgoing_window = flow.outgoing_window
        if flow.next_incoming_id is None:
            self.remote_incoming_window = flow.incoming_window
        else:
            self.remote_incoming_window = (
                flow.next_incoming_id + flow.incoming_window - self.next_outgoing_id
            ) % _UINT
        if flow.handle is not None:
            link = self._link(flow.handle)
            if link is None:
                return
            try:
                link.flow(flow)
            except e.LinkFault as exc:
                self.detach_with(link, exc)
        elif flow.echo:
            self.send_flow()
        # a window reopened wakes every link, whichever link's state the flow carries
        if self.remote_incoming_window > 0 and (flow.handle is None or was_shut):
            self.resume()

    def _disposition(self, disposition: perf.Disposition) -> None:
        """The client settles (or changes the state of) deliveries ``first`` to
        ``last`` the broker sent; as the sender, it settles the broker's receipts,
        which are settled already (the broker receives in ``first`` mode)."""
        if disposition.role != perf.ROLE_RECEIVER:
            return
        if not disposition.settled and not _terminal(disposition.state):
            return  # a non-terminal state (received): nothing to do
        first = disposition.first
        last = first if disposition.last is None else disposition.last
        unsettled = self.unsettled
        span = (last - first) % _UINT  # serial numbers (§2.8.11): the range may wrap
        if span < 64 or span < len(unsettled):
            ids = [(first + k) % _UINT for k in range(span + 1) if (first + k) % _UINT in unsettled]
        else:  # a wide range: walk the deliveries rather than the range
            ids = sorted(
                (i for i in unsettled if (i - first) % _UINT <= span), key=lambda i: (i - first) % _UINT
            )
        touched = set()
        state = disposition.state
        if state is None or isinstance(state, perf.Accepted):
            # the common outcome, settled here for the whole range (OutgoingLink.settle's
            # accepted case without a call per delivery)
            for delivery_id in ids:
                link = unsettled.pop(delivery_id)
                entry = link.unsettled.pop(delivery_id, None)
                if entry is not None:
                    acked = link.queue
                    acked.ack(entry)
                    acked.counters.acknowledged += 1
                    link.counted.acknowledged += 1
                    touched.add(acked)
        else:
            for delivery_id in ids:
                link = unsettled.pop(delivery_id)
                queue = link.settle(delivery_id, state)
                if queue is not None:
                    touched.add(queue)
        for queue in touched:
            queue.drain()

    def _attach(self, attach: perf.Attach) -> None:
        if attach.handle in self.links:
            raise e.SessionFault(e.HANDLE_IN_USE, f"handle {attach.handle} is in use")
        if attach.handle > self.handle_max:  # §2.7.2: a connection error, as RabbitMQ 4
            raise e.ConnectionFault(
                e.FRAMING_ERROR, f"link handle value ({attach.handle}) exceeds handle-max ({self.handle_max})"
            )
        try:
            link = management_link(self, attach) or attach_link(self, attach)
        except e.LinkFault as exc:
            self._refuse_attach(attach, exc)
            return
        except BrokerError as exc:
            self._refuse_attach(attach, e.LinkFault.of(exc))
            return
        self.links[attach.handle] = link
        link.attached()

    def _refuse_attach(self, attach: perf.Attach, fault: e.Fault) -> None:
        """§2.6.3: an attach with a null terminus on the refused side, then a detach
        (closed) with the error."""
        log.info("AMQP 1.0 connection %s: link %r refused: %s", self.connection.peer, attach.name, fault.text)
        receiving = attach.role == perf.ROLE_SENDER
        self.send(
            perf.Attach(
                name=attach.name,
                handle=attach.handle,
                role=not attach.role,
                snd_settle_mode=attach.snd_settle_mode,
                rcv_settle_mode=perf.RCV_FIRST,
                source=attach.source if receiving else None,
                target=None if receiving else attach.target,
                initial_delivery_count=None if receiving else 0,
            )
        )
        self.send(perf.Detach(attach.handle, True, fault.error()))
        self._detached.add(attach.handle)

    def _detach(self, detach: perf.Detach) -> None:
        if detach.handle in self._detached:  # the answer to the broker's detach
            self._detached.discard(detach.handle)
            return
        link = self._link(detach.handle)
        assert link is not None
        del self.links[detach.handle]
        if detach.error is not None:
            log.info("AMQP 1.0 link %r detached by the client: %s", link.name, detach.error.condition)
        link.release()
        self.send(perf.Detach(detach.handle, detach.closed))

    def detach_with(
        self, link: IncomingLink | OutgoingLink | ReplyToLink | ResponseLink, fault: e.Fault
    ) -> None:
        """Detach ``link`` (closed) with an error; the client's detach is then only
        acknowledged."""
        if self.links.get(link.handle) is not link:
            return
        log.info("AMQP 1.0 connection %s: link %r detached: %s", self.connection.peer, link.name, fault.text)
        del self.links[link.handle]
        link.release()
        self.send(perf.Detach(link.handle, True, fault.error()))
        self._detached.add(link.handle)

    def _end(self, end: perf.End) -> None:
        self.send(perf.End())
        self.release()
        self.connection.session_ended(self)

    def end_with(self, fault: e.Fault) -> None:
        """End the session with an error; its links go now, the channel is free once
        the client's end comes."""
        log.info("AMQP 1.0 connection %s: session ended: %s", self.connection.peer, fault.text)
        self.send(perf.End(fault.error()))
        self.state = "ending"
        self.release()

    # -- what the connection asks ---------------------------------------------------------
    def resume(self) -> None:
        """Room again (the socket, the client's window): outgoing links deliver."""
        for link in list(self.links.values()):
            if isinstance(link, OutgoingLink) and link.credit > 0:
                link.queue.drain()

    def renew_credit(self) -> None:
        """A resource alarm ended: incoming links get credit again."""
        for link in list(self.links.values()):
            if isinstance(link, IncomingLink):
                link.renew_credit()

    def send_confirms(self) -> None:
        confirming, self.confirming = self.confirming, set()
        for link in confirming:
            link.send_confirms()

    def stop_links(self) -> None:
        """Mark every link as going, so that what one link gives back to a queue is not
        delivered to another link of this session on its way out."""
        for link in self.links.values():
            link.detaching = True

    def release(self) -> None:
        """The session is over: every link goes (unsettled deliveries return to their
        queues, redelivered; none goes out to another of its links)."""
        self.stop_links()
        links, self.links = self.links, {}
        for link in links.values():
            link.release()
        self.unsettled.clear()
        self.confirming.clear()

    @property
    def incoming_window(self) -> int:
        """Transfer frames the client may still send before the broker renews the window."""
        return max(0, self._window_left)

    def facts(self) -> ChannelFacts:
        consumers = tuple(
            ConsumerFacts(link.tag, link.queue.name, not link.no_ack, False, link.credit, link.arguments)
            for link in self.links.values()
            if isinstance(link, OutgoingLink)
        )
        unconfirmed = sum(link.unconfirmed for link in self.links.values() if isinstance(link, IncomingLink))
        return ChannelFacts(
            number=self.channel,
            confirm=True,
            messages_unacknowledged=len(self.unsettled),
            messages_unconfirmed=unconfirmed,
            consumers=consumers,
        )


def _terminal(state: Any) -> bool:
    return isinstance(state, (perf.Accepted, perf.Rejected, perf.Released, perf.Modified))
