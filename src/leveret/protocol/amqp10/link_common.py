"""What every AMQP 1.0 link of the broker does the same: answering a client's attach,
and the link-credit arithmetic of §2.6.7 for the links the broker sends on (an
:class:`~.links.OutgoingLink`, a management :class:`~.management_link.ResponseLink`, a
direct reply-to :class:`~.reply_to.ReplyToLink`). The same numbers as RabbitMQ 4's
``rabbit_amqp_session``: counts are serial numbers modulo 2**32.
"""

from __future__ import annotations

from typing import Any

from . import performatives as perf
from .credit import credit_left

#: Delivery counts and delivery ids are RFC 1982 serial numbers of 32 bits (§2.6.7).
SERIAL = 2**32


def answer_attach(
    session: Any,
    attach: perf.Attach,
    role: bool,
    snd_settle_mode: int,
    rcv_settle_mode: int,
    source: Any = None,
    **fields: Any,
) -> None:
    """Send the broker's attach answering the client's ``attach``: its name, handle and
    target, the broker's ``role`` and settle modes, ``source`` (the client's own when
    None) and any other Attach ``fields`` (e.g. ``max_message_size`` in bytes)."""
    session.send(
        perf.Attach(
            name=attach.name,
            handle=attach.handle,
            role=role,
            snd_settle_mode=snd_settle_mode,
            rcv_settle_mode=rcv_settle_mode,
            source=attach.source if source is None else source,
            target=attach.target,
            **fields,
        )
    )


def flow_credit(flow: perf.Flow, delivery_count: int) -> int | None:
    """The link credit a client's ``flow`` gives a link the broker sends on, whose own
    delivery count is ``delivery_count`` (§2.6.7): the flow's ``delivery-count +
    link-credit`` less the deliveries sent since (:func:`.credit.credit_left`); its
    ``link-credit`` as is when it has no delivery count yet; None when the flow
    carries no link credit (the credit stays as it was)."""
    if flow.link_credit is None:
        return None
    if flow.delivery_count is None:
        return flow.link_credit
    return credit_left(flow.delivery_count, flow.link_credit, delivery_count)


def drain_or_echo(link: Any, drain: bool, echo: bool, available: int) -> None:
    """After a client's flow on ``link`` (a sending link with ``session``, ``handle``,
    ``delivery_count`` and ``credit``): with ``drain``, use the credit left up (the
    delivery count advances by it) and tell the client (§2.6.7); else, with ``echo``,
    send the link's state, ``available`` deliveries waiting."""
    if drain and link.credit > 0:
        link.delivery_count = (link.delivery_count + link.credit) % SERIAL
        link.credit = 0
        link.session.send_flow(link.handle, link.delivery_count, 0, 0, True)
    elif echo:
        link.session.send_flow(link.handle, link.delivery_count, link.credit, available)


def send_settled(link: Any, payload: bytes) -> None:
    """Send ``payload`` (a message's encoded sections) on ``link`` as one delivery, settled
    (at most once), with the session's next delivery id; it uses one of the link's credit
    (the caller checked there is one)."""
    link.credit -= 1
    link.delivery_count = (link.delivery_count + 1) % SERIAL
    session = link.session
    delivery_id = session.next_delivery_id
    session.next_delivery_id = (delivery_id + 1) % SERIAL
    session.send_transfer(link.handle, delivery_id, True, payload)
