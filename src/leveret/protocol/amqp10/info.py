"""What management sees of an AMQP 1.0 connection's sessions and links, read-only.

:func:`session_facts` turns each :class:`~.session.Amqp10Session` into core's protocol
neutral :class:`~leveret.core.connections.SessionFacts` (and its links into
:class:`~leveret.core.connections.LinkFacts`), the fields RabbitMQ 4 reports for
``GET /api/connections/:name/sessions`` (its session and link infos): windows, handles,
addresses, settle modes, ``max-message-size``, delivery count, credit, unconfirmed and
unsettled deliveries, a source's filters. Nothing here changes a session; it reads the
attributes the session and links keep for their own work.

A link is read by its attach's role, so the links of other kinds (a ``/management``
link pair) show too: what they do not keep reads as 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.connections import LinkFacts, SessionFacts
from . import performatives as perf
from .links import MAX_MESSAGE_SIZE
from .types import Array, Described, Symbol

if TYPE_CHECKING:
    from .session import Amqp10Session

#: snd-settle-mode (§2.8.2) as RabbitMQ 4 names it in its link infos.
SND_SETTLE_MODES = {perf.SND_UNSETTLED: "unsettled", perf.SND_SETTLED: "settled", perf.SND_MIXED: "mixed"}


def session_facts(sessions: list[Amqp10Session]) -> tuple[SessionFacts, ...]:
    """``sessions`` as management shows them, by the broker's channel number."""
    return tuple(sorted((one_session(s) for s in sessions), key=lambda f: f.channel))


def one_session(session: Amqp10Session) -> SessionFacts:
    """One session's windows, unsettled deliveries and links (by handle)."""
    links = tuple(link_facts(session.links[handle]) for handle in sorted(session.links))
    return SessionFacts(
        channel=session.channel,
        remote_channel=session.remote_channel,
        handle_max=session.handle_max,
        next_incoming_id=session.next_incoming_id,
        incoming_window=getattr(session, "incoming_window", 0),
        next_outgoing_id=session.next_outgoing_id,
        remote_incoming_window=session.remote_incoming_window,
        remote_outgoing_window=getattr(session, "remote_outgoing_window", 0),
        outgoing_unsettled=len(session.unsettled),
        links=links,
    )


def link_facts(link: Any) -> LinkFacts:
    """One link, incoming (the client sends: its target) or outgoing (its source)."""
    attach: perf.Attach = link.attach
    incoming = attach.role == perf.ROLE_SENDER
    common = {
        "handle": link.handle,
        "name": link.name,
        "incoming": incoming,
        "delivery_count": getattr(link, "delivery_count", 0),
        "credit": max(0, getattr(link, "credit", 0)),
    }
    if incoming:
        return LinkFacts(
            **common,
            address=_address(attach.target),
            max_message_size=MAX_MESSAGE_SIZE,  # the broker's, announced in its attach
            snd_settle_mode=SND_SETTLE_MODES.get(attach.snd_settle_mode, "mixed"),
            unconfirmed=getattr(link, "unconfirmed", 0),
        )
    queue = getattr(link, "queue", None)
    source = attach.source
    return LinkFacts(
        **common,
        address=_source_address(link, source),
        max_message_size=attach.max_message_size or None,  # 0 or none: unlimited (§2.7.3)
        queue=queue.name if queue is not None else "",
        send_settled=bool(getattr(link, "no_ack", attach.snd_settle_mode == perf.SND_SETTLED)),
        filters=_filters(_applied_filters(link, source)),
    )


def _applied_filters(link: Any, source: Any) -> dict[Any, Any] | None:
    """The filters in place: those the broker echoed (RabbitMQ 4 shows the effective
    filter), else the client's."""
    if hasattr(link, "echoed_filter"):
        return link.echoed_filter
    return source.filter if isinstance(source, perf.Source) else None


def _source_address(link: Any, source: Any) -> str | None:
    """The address a receiving link reads: the one the broker gave a dynamic source
    (direct reply-to's ``/queues/amq.rabbitmq.reply-to.<key>``), else the client's."""
    given = getattr(link, "address", None)
    return given if isinstance(given, str) else _address(source)


def _address(terminus: Any) -> str | None:
    address = getattr(terminus, "address", None)
    return address if isinstance(address, str) else None


def _filters(filters: dict[Any, Any] | None) -> tuple[tuple[str, str | int, Any], ...]:
    """A source's filter set (§3.5.8) as (name, descriptor, value): each filter is a
    described value; its descriptor a symbol (shown as text) or a code (a number)."""
    found: list[tuple[str, str | int, Any]] = []
    for name, value in (filters or {}).items():
        if isinstance(value, Described):
            descriptor = value.descriptor
            found.append(
                (
                    str(name),
                    descriptor if isinstance(descriptor, int) else str(descriptor),
                    jsonable(value.value),
                )
            )
        else:
            found.append((str(name), "", jsonable(value)))
    return tuple(found)


def jsonable(value: Any) -> Any:
    """An AMQP value as JSON can hold it (RabbitMQ 4's shape for filter values: a map is
    a list of ``{"key", "value"}``, binary is text, a described value its value)."""
    if isinstance(value, dict):
        return [{"key": jsonable(k), "value": jsonable(v)} for k, v in value.items()]
    if isinstance(value, Described):
        return jsonable(value.value)
    if isinstance(value, Array):
        return [jsonable(v) for v in value.items]
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Symbol):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
