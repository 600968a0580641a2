"""Direct reply-to over AMQP 1.0 (RabbitMQ 4.2's "volatile queue"): a receiving link
whose source is ``dynamic`` with the capability ``rabbitmq:volatile-queue`` gets an
address ``/queues/amq.rabbitmq.reply-to.<key>`` in the broker's attach. A requester puts
it in its requests' ``reply-to``; a responder of any protocol sends the reply there
(AMQP 0-9-1: the default exchange, routing key ``amq.rabbitmq.reply-to.<key>``), and
core hands it straight to this link (:data:`leveret.core.publish.REPLY_TO_PREFIX`):
no queue, nothing stored, at most once. Replies go pre-settled, as far as the link's
credit goes; one arriving without credit is dropped (RabbitMQ 4.2's volatile queue
drops likewise). The address ends with the link.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from ...core.publish import REPLY_TO_PREFIX
from . import performatives as perf
from .link_common import answer_attach, drain_or_echo, flow_credit, send_settled
from .message import encode_transfer
from .types import Symbol

if TYPE_CHECKING:
    from ...core.queues import Queue, QueuedMessage
    from ...core.selector import Selector
    from .session import Amqp10Session

VOLATILE_QUEUE = "rabbitmq:volatile-queue"


def wants_reply_to(source: object) -> bool:
    """Whether an attach's source asks for a direct reply-to address."""
    return (
        isinstance(source, perf.Source) and source.dynamic and VOLATILE_QUEUE in (source.capabilities or ())
    )


class ReplyToLink:
    """A receiving link on a direct reply-to address: core's reply consumer."""

    exclusive = False
    detaching = False
    no_ack = True
    prefetch = 0
    priority = 0
    selector: Selector | None = None
    arguments: dict = {}  # noqa: RUF012 (read only, shared)

    def __init__(self, session: Amqp10Session, attach: perf.Attach) -> None:
        self.session = session
        self.attach = attach
        self.name = attach.name
        self.handle = attach.handle
        self.tag = f"ctag-{session.channel}-{attach.handle}"
        self.examined = 0
        self.credit = 0
        self.delivery_count = 0
        self.dropped = 0  # replies that came without credit
        self.key = secrets.token_urlsafe(18)
        self.address = "/queues/" + REPLY_TO_PREFIX + self.key
        core_session = session.connection.session
        assert core_session is not None
        self.vhost = core_session.vhost

    @property
    def global_prefetch(self) -> int:
        return 0

    def attached(self) -> None:
        source = self.attach.source
        assert isinstance(source, perf.Source)
        answer_attach(
            self.session,
            self.attach,
            perf.ROLE_SENDER,
            perf.SND_SETTLED,
            perf.RCV_FIRST,
            perf.Source(
                address=self.address,
                dynamic=True,
                expiry_policy=source.expiry_policy,
                capabilities=(Symbol(VOLATILE_QUEUE),),
            ),
            initial_delivery_count=0,
        )
        self.vhost.reply_consumers[self.key] = self

    def can_accept(self) -> bool:
        return self.credit > 0

    def deliver(self, queue: Queue | None, entry: QueuedMessage) -> None:
        """A reply: sent pre-settled if the link has credit, else dropped."""
        if self.credit <= 0 or not self.session.connection.writable:
            self.dropped += 1
            return
        send_settled(self, encode_transfer(entry.message, 0, True, None))

    def flow(self, flow: perf.Flow) -> None:
        """The client's credit (§2.6.7); ``drain`` uses up what no reply fills."""
        credit = flow_credit(flow, self.delivery_count)
        if credit is not None:
            self.credit = credit
        drain_or_echo(self, flow.drain, flow.echo, 0)

    def cancel_by_broker(self) -> None:
        """Never called: no queue to delete."""

    def release(self) -> None:
        """The address ends with the link."""
        if self.vhost.reply_consumers.get(self.key) is self:
            del self.vhost.reply_consumers[self.key]
