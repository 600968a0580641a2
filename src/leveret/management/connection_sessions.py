"""``GET /api/connections/{name}/sessions``: an AMQP 1.0 connection's sessions and
links, in RabbitMQ 4's shape (its management plugin's ``connection_sessions`` resource).

Each session: ``channel_number`` (the broker's channel), ``handle_max``, the windows
(``next_incoming_id``, ``incoming_window``, ``next_outgoing_id``,
``remote_incoming_window``, ``remote_outgoing_window``; transfer frames, §2.5.6),
``outgoing_unsettled_deliveries``, and its ``incoming_links`` (the client sends:
``handle``, ``link_name``, ``target_address``, ``snd_settle_mode``,
``max_message_size``, ``delivery_count``, ``credit``, ``unconfirmed_messages``) and
``outgoing_links`` (the client receives: ``handle``, ``link_name``,
``source_address``, ``queue_name``, ``send_settled``, ``max_message_size`` (bytes or
``"unlimited"``), ``filter``, ``delivery_count``, ``credit``, ``consumer_timeout``).

Answers as RabbitMQ 4's: 404 for no such connection (or one the user may not see: 401,
as ``/api/connections/{name}``), 400 ``connection does not use AMQP 1.0`` for a
connection of another protocol. leveret adds ``remote_channel_number`` (the client's
channel) to each session.
"""

from __future__ import annotations

from ..core.connections import LinkFacts, SessionFacts


def session_row(session: SessionFacts) -> dict:
    """One session in RabbitMQ 4's shape (see the module doc)."""
    return {
        "channel_number": session.channel,
        "remote_channel_number": session.remote_channel,
        "handle_max": session.handle_max,
        "next_incoming_id": session.next_incoming_id,
        "incoming_window": session.incoming_window,
        "next_outgoing_id": session.next_outgoing_id,
        "remote_incoming_window": session.remote_incoming_window,
        "remote_outgoing_window": session.remote_outgoing_window,
        "outgoing_unsettled_deliveries": session.outgoing_unsettled,
        "incoming_links": [incoming_row(link) for link in session.links if link.incoming],
        "outgoing_links": [outgoing_row(link) for link in session.links if not link.incoming],
    }


def incoming_row(link: LinkFacts) -> dict:
    """A link the client sends on (the broker receives)."""
    return {
        "handle": link.handle,
        "link_name": link.name,
        "target_address": link.address,
        "snd_settle_mode": link.snd_settle_mode,
        "max_message_size": _size(link.max_message_size),
        "delivery_count": link.delivery_count,
        "credit": link.credit,
        "unconfirmed_messages": link.unconfirmed,
    }


def outgoing_row(link: LinkFacts) -> dict:
    """A link the broker sends on (the client receives, from ``queue_name``)."""
    return {
        "handle": link.handle,
        "link_name": link.name,
        "source_address": link.address,
        "queue_name": link.queue,
        "send_settled": link.send_settled,
        "max_message_size": _size(link.max_message_size),
        "filter": [{"name": n, "descriptor": d, "value": v} for n, d, v in link.filters],
        "delivery_count": link.delivery_count,
        "credit": link.credit,
        "consumer_timeout": False,
    }


def _size(size: int | None) -> int | str:
    return "unlimited" if size is None else size
