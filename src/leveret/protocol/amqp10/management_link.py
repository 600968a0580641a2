"""The management node's link pair (AMQP Link Pair CS 01, as RabbitMQ 4's
``rabbit_amqp_session``): a client's sender whose target is ``/management`` carries
requests in (:class:`RequestLink`), its receiver whose source is ``/management`` carries
the responses out (:class:`ResponseLink`). Both are attached with the link property
``paired = true``; the two halves have the same link name, which pairs them, and a
request is answered on the response link of its own pair. :func:`management_link` is
the hook :func:`~.links.attach_link` calls; what a request does is
:mod:`.management`'s.

Errors, as RabbitMQ 4: an attach without ``paired = true`` is refused with
``amqp:invalid-field``, a second half of the same role and name with
``amqp:precondition-failed``; a request while the response half is not attached
detaches the request link with ``amqp:precondition-failed``, a transfer without credit
with ``amqp:link:transfer-limit-exceeded``, a message that is no request (no method,
no target, ``reply-to`` not ``$me``, not decodable) with ``amqp:invalid-field`` or
``amqp:decode-error``; a refused permission ends the session with
``amqp:unauthorized-access``, as RabbitMQ 4 does, after detaching both halves with the
same error (RabbitMQ only ends the session, which rabbitmq-amqp-python-client's
blocking API never notices: it would wait for the response for ever).

The broker grants :data:`REQUEST_CREDIT` requests and renews it once half is used
(RabbitMQ 4's numbers), but only while fewer than :data:`REQUEST_CREDIT` responses wait
for the client's credit on the response link, so a client that never reads its
responses makes the broker hold at most one and a half times that many. (RabbitMQ 4
fails the session when a request comes while the response link has no credit; leveret
holds the response.)
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from leveret.core.errors import AccessRefused

from . import errors as e, performatives as perf
from .link_common import answer_attach, drain_or_echo, flow_credit, send_settled
from .links import IncomingLink
from .management import (
    MANAGEMENT_ADDRESS,
    BadRequestMessage,
    handle_request,
    parse_request,
    response_sections,
)
from .message import utf8_safe
from .types import DecodeError, Described, decode_all, encode

if TYPE_CHECKING:
    from .session import Amqp10Session

#: Requests the broker lets a client send before it renews the credit (RabbitMQ 4's 8).
REQUEST_CREDIT = 8


def respond(session: Any, payload: bytes) -> bytes:
    """The response message (its encoded sections) to the request message ``payload``,
    carried out by core session ``session``. Raises BadRequestMessage or DecodeError for
    a message that is no request, and core's AccessRefused for a refused permission."""
    sections = []
    for value in decode_all(payload):
        if not isinstance(value, Described):
            raise DecodeError("a message section that is not a described value")
        sections.append(perf.from_described(value))
    request = parse_request(sections)
    status, body = handle_request(session, request.method, request.target, request.body)
    try:
        return b"".join(
            encode(perf.to_described(section)) for section in response_sections(request, status, body)
        )
    except ValueError:  # a text no AMQP string holds (a lone surrogate, from the HTTP API)
        body = utf8_safe(body)
        return b"".join(
            encode(perf.to_described(section)) for section in response_sections(request, status, body)
        )


def _check_paired(attach: perf.Attach) -> None:
    properties = attach.properties or {}
    if properties.get("paired") is not True:
        raise e.LinkFault(e.INVALID_FIELD, "Link property 'paired' is not set to boolean value 'true'")


def management_link(session: Amqp10Session, attach: perf.Attach) -> RequestLink | ResponseLink | None:
    """The management half a client's attach asks for (a sender with target
    ``/management``, a receiver with source ``/management``), else None. LinkFault when
    refused (see the module doc)."""
    terminus: Any
    if attach.role == perf.ROLE_SENDER:
        terminus = attach.target
        cls: type[RequestLink] | type[ResponseLink] = RequestLink
    else:
        terminus = attach.source
        cls = ResponseLink
    if getattr(terminus, "address", None) != MANAGEMENT_ADDRESS:
        return None
    _check_paired(attach)
    for link in session.links.values():
        if isinstance(link, cls) and link.name == attach.name:
            raise e.LinkFault(
                e.PRECONDITION_FAILED, f"management link pair '{attach.name}' already has this half"
            )
    return cls(session, attach)


#: Bytes: the largest management request the broker takes (its max-message-size on
#: the request link): a declaration with its arguments is a few hundred bytes, and a
#: client's management links must not hold 16 MiB each.
MAX_REQUEST_SIZE = 1024 * 1024


class ResponseLink:
    """The broker's half that sends responses: settled deliveries, as far as the
    client's link credit goes (responses wait, in order, while it has none)."""

    detaching = False

    def __init__(self, session: Amqp10Session, attach: perf.Attach) -> None:
        self.session = session
        self.name = attach.name
        self.handle = attach.handle
        self.attach = attach
        self.credit = 0
        self.delivery_count = 0
        self.waiting: deque[bytes] = deque()

    def attached(self) -> None:
        attach = self.attach
        answer_attach(
            self.session,
            attach,
            perf.ROLE_SENDER,
            perf.SND_SETTLED,
            attach.rcv_settle_mode,
            initial_delivery_count=0,
            max_message_size=attach.max_message_size,
            properties=attach.properties,
        )

    def send(self, payload: bytes) -> None:
        """Send a response, or keep it until the client gives credit."""
        self.waiting.append(payload)
        self._send_waiting()

    def _send_waiting(self) -> None:
        session = self.session
        while self.waiting and self.credit > 0 and session.remote_incoming_window > 0 and not self.detaching:
            send_settled(self, self.waiting.popleft())

    def flow(self, flow: perf.Flow) -> None:
        """The client's credit (§2.6.7); ``drain`` uses up what no response fills."""
        credit = flow_credit(flow, self.delivery_count)
        if credit is not None:
            self.credit = credit
        self._send_waiting()
        drain_or_echo(self, flow.drain, flow.echo, len(self.waiting))
        self._renew_partners()

    def _renew_partners(self) -> None:
        for link in self.session.links.values():
            if isinstance(link, RequestLink) and link.name == self.name:
                link.renew_credit()

    def settle(self, delivery_id: int, state: Any) -> None:
        """Responses are sent settled: nothing to do."""
        return None

    def release(self) -> None:
        self.detaching = True
        self.waiting.clear()


class RequestLink(IncomingLink):
    """The broker's half that receives requests; each is carried out at once and
    answered on the paired :class:`ResponseLink`. (An IncomingLink, so the session
    takes its transfers; none of the publishing machinery is used.)"""

    def __init__(self, session: Amqp10Session, attach: perf.Attach) -> None:
        self.session = session
        self.name = attach.name
        self.handle = attach.handle
        self.attach = attach
        self.detaching = False
        self.credit = 0
        self.delivery_count = attach.initial_delivery_count or 0
        self.parts: list[bytes] | None = None
        self.size = 0
        self.settled = False
        self.delivery_id = 0

    @property
    def unconfirmed(self) -> int:
        return 0

    def attached(self) -> None:
        answer_attach(
            self.session,
            self.attach,
            perf.ROLE_RECEIVER,
            perf.SND_SETTLED,
            perf.RCV_FIRST,
            max_message_size=MAX_REQUEST_SIZE,
            properties=self.attach.properties,
        )
        self.renew_credit()

    def _partner(self) -> ResponseLink | None:
        for link in self.session.links.values():
            if isinstance(link, ResponseLink) and link.name == self.name and not link.detaching:
                return link
        return None

    def renew_credit(self) -> None:
        """Top the credit up to :data:`REQUEST_CREDIT` once half is used, unless as
        many responses wait for the client's credit."""
        if self.detaching or self.credit > REQUEST_CREDIT // 2:
            return
        partner = self._partner()
        if partner is not None and len(partner.waiting) >= REQUEST_CREDIT:
            return
        self.credit = REQUEST_CREDIT
        self.session.send_flow(self.handle, self.delivery_count, self.credit)

    def transfer(self, transfer: perf.Transfer, payload: bytes) -> None:
        if self.parts is None:
            self.delivery_id = self.take_credit(transfer)
            self.settled = bool(transfer.settled)
            self.parts, self.size = [], 0
        if transfer.aborted:
            self.parts = None
            self.renew_credit()
            return
        self.parts.append(payload)
        self.size += len(payload)
        self.settled = self.settled or bool(transfer.settled)
        if self.size > MAX_REQUEST_SIZE:
            self.parts = None
            raise e.LinkFault(e.MESSAGE_SIZE_EXCEEDED, f"a request of more than {MAX_REQUEST_SIZE} bytes")
        if transfer.more:
            return
        parts, self.parts = self.parts, None
        self._request(b"".join(parts))
        self.renew_credit()

    def _request(self, payload: bytes) -> None:
        partner = self._partner()
        if partner is None:
            raise e.LinkFault(e.PRECONDITION_FAILED, "received transfer on half open management link pair")
        core_session = self.session.connection.session
        assert core_session is not None
        try:
            response = respond(core_session, payload)
        except BadRequestMessage as exc:
            raise e.LinkFault(exc.condition, str(exc)) from None
        except DecodeError as exc:
            raise e.LinkFault(exc.condition, f"the request does not decode: {exc}") from None
        except AccessRefused as exc:
            # The pair is detached with the error first: a client blocked on the
            # response (proton's blocking API) sees that, and not a session end.
            for link in (partner, self):
                self.session.detach_with(link, e.LinkFault(e.UNAUTHORIZED_ACCESS, exc.text))
            raise e.SessionFault(e.UNAUTHORIZED_ACCESS, exc.text) from None
        if not self.settled:
            self.session.send(
                perf.Disposition(perf.ROLE_RECEIVER, self.delivery_id, None, True, perf.Accepted())
            )
        partner.send(response)

    def send_confirms(self) -> None:
        return None

    def release(self) -> None:
        self.detaching = True
        self.parts = None
