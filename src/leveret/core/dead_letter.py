"""The one dead-letter path: every way a message dies goes through :func:`dead_letter`.

Reasons: ``rejected`` (nack/reject without requeue), ``expired`` (TTL), ``maxlen``
(length limit), ``delivery_limit`` (redelivery policy exhausted: a poison message).

With a dead-letter exchange (RabbitMQ), the message is republished to it with the
``x-death`` header RabbitMQ 3.10 writes: one entry per (queue, reason), most recent
first, with ``count``, ``reason``, ``queue``, ``time``, ``exchange``, ``routing-keys``
and ``original-expiration`` (the ``expiration`` property is removed), plus
``x-first-death-reason``/``-queue``/``-exchange`` on the first death. A message that
would reach a queue it already died in, with no rejection in between, is not delivered
there (RabbitMQ's cycle detection).

With a dead-letter strategy (ActiveMQ): ``shared`` sends it to one durable queue
(``leveret.DLQ`` by default), ``individual`` to ``<prefix><queue>`` (``DLQ.<queue>``),
``discard`` drops it, counted and logged every ``report_interval`` seconds;
``process_expired`` and ``process_non_persistent`` choose which messages qualify.
DLQs are created on demand, durable.

Every dead-lettering publishes an advisory to the topic exchange ``amq.leveret.event``
with routing key ``message.dead_lettered``.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from typing import TYPE_CHECKING

from . import field_table
from .message import Message, Properties

if TYPE_CHECKING:
    from .queue import Queue

log = logging.getLogger("leveret.dead_letter")

EVENT_EXCHANGE = "amq.leveret.event"
DEAD_LETTERED = "message.dead_lettered"
REPORT_INTERVAL = 60.0  # seconds between reports of discarded messages


class DiscardCounter:
    """Counts messages dropped by the ``discard`` strategy; logs every interval."""

    def __init__(self) -> None:
        self.total = 0
        self._since_report = 0
        self._last_report = time.monotonic()

    def add(self, queue: str) -> None:
        self.total += 1
        self._since_report += 1
        now = time.monotonic()
        if now - self._last_report >= REPORT_INTERVAL:
            log.info("discarded %d dead letters in the last %.0f s (last from %s, %d in all)",
                     self._since_report, now - self._last_report, queue, self.total)
            self._since_report, self._last_report = 0, now


discarded = DiscardCounter()


def with_death(message: Message, queue: str, reason: str, now: float,
               routing_key: str | None = None, exchange: str | None = None) -> Message:
    """A copy of ``message`` carrying the new death in ``x-death`` (see module doc),
    addressed to ``exchange``/``routing_key`` when given.

    As RabbitMQ 3.10 writes it (``rabbit_dead_letter:make_msg``): the first death's
    entry is ``count`` (a ``l``), ``reason``, ``queue``, ``time``, ``exchange``,
    ``routing-keys`` (the publish routing key and any ``CC`` keys), then
    ``original-expiration`` if the message had one; a later death in the same queue
    for the same reason increments that entry's ``count`` only (its ``time`` stays)
    and moves it first; a new entry goes first. Changed entries have their keys sorted,
    as has the whole headers table. Other headers keep their wire types."""
    properties: Properties = copy.copy(message.properties)
    offset = field_table.headers_offset(message.header)
    try:
        headers = field_table.decode_table(message.header, offset)[0] if offset else {}
    except ValueError:  # checked at publish, so not expected: keep going without them
        headers = {}
    routing_keys = [("S", message.routing_key.encode())]
    cc = headers.get("CC")
    if cc is not None and cc[0] == "A":
        routing_keys += [item for item in cc[1] if item[0] == "S"]
    if routing_key is not None:
        headers.pop("CC", None)
    info = {
        "reason": ("S", reason.encode()), "queue": ("S", queue.encode()),
        "time": ("T", int(now)), "exchange": ("S", message.exchange.encode()),
        "routing-keys": ("A", routing_keys),
    }
    if properties.expiration is not None:
        info["original-expiration"] = ("S", properties.expiration.encode())
    deaths = headers.get("x-death")
    if deaths is None or deaths[0] != "A":
        headers["x-first-death-reason"] = info["reason"]
        headers["x-first-death-queue"] = info["queue"]
        headers["x-first-death-exchange"] = info["exchange"]
        entries = [("F", {"count": ("l", 1), **info})]
    else:
        entries = list(deaths[1])
        for i, item in enumerate(entries):
            if (item[0] == "F" and field_table.text(item[1].get("queue")) == queue
                    and field_table.text(item[1].get("reason")) == reason):
                death = dict(item[1])
                count = death.get("count")
                death["count"] = ("l", (count[1] if count and isinstance(count[1], int) else 0) + 1)
                del entries[i]
                break
        else:
            death = {"count": ("l", 1), **info}
        entries.insert(0, ("F", dict(sorted(death.items()))))
    headers["x-death"] = ("A", entries)
    properties.expiration = None
    properties.headers = None
    bare = message.with_properties(properties, routing_key=routing_key, exchange=exchange)
    return Message(bare.exchange, bare.routing_key,
                   field_table.with_headers(bare.header, dict(sorted(headers.items()))), bare.body)


def death_history(message: Message) -> list[dict]:
    """The ``x-death`` entries as ``{"queue", "reason"}``, read from the raw header
    (decoding all properties would also keep them cached on a queued message)."""
    offset = field_table.headers_offset(message.header)
    if offset is None:
        return []
    deaths = field_table.decode_table(message.header, offset)[0].get("x-death")
    if deaths is None or deaths[0] != "A":
        return []
    return [{"queue": field_table.text(item[1].get("queue")),
             "reason": field_table.text(item[1].get("reason"))}
            for item in deaths[1] if item[0] == "F"]


def is_cycle(target: str, deaths: list) -> bool:
    """RabbitMQ's rule: reaching a queue that is already in the death history, with no
    ``rejected`` death on the way, is a cycle."""
    for death in deaths:
        if death.get("reason") == "rejected":
            return False
        if death.get("queue") == target:
            return True
    return False


def dead_letter(queue: Queue, message: Message, reason: str) -> None:
    """Send a dead message where ``queue``'s configuration says (see module doc)."""
    config = queue.config.dead_letter
    vhost = queue.vhost
    now = vhost.clock.time()
    target = "dropped"
    dead = None
    if config.exchange is not None:
        exchange = vhost.exchanges.get(config.exchange)
        if exchange is not None:  # a missing DLX drops the message, as in RabbitMQ
            dead = with_death(message, queue.name, reason, now,
                              routing_key=config.routing_key, exchange=config.exchange)
            targets = vhost.route(exchange, dead)
            if reason != "rejected" and targets:
                deaths = death_history(dead)
                targets = [q for q in targets if not is_cycle(q.name, deaths)]
            for destination in targets:
                destination.enqueue(dead)
            target = f"exchange '{config.exchange}'"
    elif config.strategy is not None:
        eligible = ((reason != "expired" or config.process_expired)
                    and (message.persistent or config.process_non_persistent))
        if config.strategy == "discard" or not eligible:
            discarded.add(queue.name)
            target = "discarded"
        else:
            name = config.queue if config.strategy == "shared" else config.prefix + queue.name
            if name != queue.name:
                dlq = vhost.queues.get(name) or vhost.declare_queue(name, None, durable=True)
                dead = with_death(message, queue.name, reason, now)
                dlq.enqueue(dead)
                target = f"queue '{name}'"
    _advise(queue, message, reason, target)


def _advise(queue: Queue, message: Message, reason: str, target: str) -> None:
    vhost = queue.vhost
    exchange = vhost.exchanges.get(EVENT_EXCHANGE)
    if exchange is None or not exchange.bindings:
        return
    message_id = message.properties.message_id
    info = {"vhost": vhost.name, "queue": queue.name, "reason": reason, "target": target,
            "message_id": message_id or ""}
    event = Message.build(EVENT_EXCHANGE, DEAD_LETTERED, json.dumps(info).encode(),
                          Properties(content_type="application/json", headers=info))
    for destination in vhost.route(exchange, event):
        destination.enqueue(event)
