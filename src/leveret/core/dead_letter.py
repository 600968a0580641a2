"""The one dead-letter path: every way a message dies goes through :func:`dead_letter`.

Reasons: ``rejected`` (nack/reject without requeue), ``expired`` (TTL), ``maxlen``
(length limit), ``delivery_limit`` (redelivery policy exhausted: a poison message).

Each death is recorded on the dead copy as a :class:`~.message.Death` annotation (queue,
reason, time, original address and expiration); the copy loses its own expiration.
Adapters render deaths in their own form: the AMQP adapter as the ``x-death`` header
RabbitMQ 3.10 writes (:mod:`leveret.protocol.amqp.message`).

With a dead-letter exchange (RabbitMQ), the dead copy is republished to it. A message
that would reach a queue it already died in, with no rejection in between, is not
delivered there (RabbitMQ's cycle detection).

With a dead-letter strategy (ActiveMQ): ``shared`` sends it to one durable queue
(``leveret.DLQ`` by default), ``individual`` to ``<prefix><queue>`` (``DLQ.<queue>``),
``discard`` drops it, counted and logged every ``report_interval`` seconds;
``process_expired`` and ``process_non_persistent`` choose which messages qualify.
DLQs are created on demand, durable.

Every dead-lettering publishes an advisory to the topic exchange ``amq.leveret.event``
with routing key ``message.dead_lettered``.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from . import advisory
from .message import Death, Message, Properties

if TYPE_CHECKING:
    from .queues.host import HostedQueue
    from .router import Router

log = logging.getLogger("leveret.dead_letter")

EVENT_EXCHANGE = "amq.leveret.event"
DEAD_LETTERED = "message.dead_lettered"
REPORT_INTERVAL = 60.0  # seconds between reports of discarded messages


class DiscardCounter:
    """Counts messages dropped by the ``discard`` strategy; logs every
    :data:`REPORT_INTERVAL` seconds of the clock's time."""

    def __init__(self) -> None:
        self.total = 0
        self._since_report = 0
        self._last_report: float | None = None

    def add(self, queue: str, now: float) -> None:
        """Count one discarded message of ``queue`` at ``now`` (epoch seconds)."""
        self.total += 1
        self._since_report += 1
        if self._last_report is None:
            self._last_report = now
        if now - self._last_report >= REPORT_INTERVAL:
            log.info(
                "discarded %d dead letters in the last %.0f s (last from %s, %d in all)",
                self._since_report,
                now - self._last_report,
                queue,
                self.total,
            )
            self._since_report, self._last_report = 0, now


discarded = DiscardCounter()


def death_of(message: Message, queue: str, reason: str, now: float, readdressed: bool = False) -> Death:
    """The :class:`~.message.Death` annotation for ``message`` dying in ``queue``: its
    address then (routing key and any ``CC`` keys, as RabbitMQ records them), and its
    own expiration, which only a message that has not died before still has."""
    routing_keys = [message.routing_key]
    if not any(d.readdressed for d in message.deaths):
        # The one header, not every property decoded: a message dead-lettered from
        # queue to queue (kombu's native delayed delivery: a hop per level) would
        # otherwise decode them all, its x-death rendered in, at each hop.
        cc = message.header("CC")
        if isinstance(cc, list):
            routing_keys += [key for key in cc if isinstance(key, str)]
    expiration = None if message.deaths else message.properties.expiration
    return Death(queue, reason, int(now), message.exchange, tuple(routing_keys), expiration, readdressed)


def is_cycle(target: str, history: list[tuple[str, str]]) -> bool:
    """RabbitMQ's rule: reaching a queue that is already in the death history
    (``(queue, reason)``, most recent first), with no ``rejected`` death on the way, is a
    cycle."""
    for queue, reason in history:
        if reason == "rejected":
            return False
        if queue == target:
            return True
    return False


def dead_letter(vhost: Router, queue: HostedQueue, message: Message, reason: str) -> None:
    """Send a dead message of ``queue`` (in ``vhost``) where the queue's configuration
    says (see module doc). Called by the vhost's queue driver
    (:meth:`.vhost.VirtualHost.carry_out`) for a :class:`.queues.host.DeadLetter` the
    queue handed back, never from inside the queue."""
    config = queue.config.dead_letter
    queue.counters.dead_lettered[reason] += 1
    now = vhost.clock.time()
    target = "dropped"
    dead = None
    if config.exchange is not None:
        exchange = vhost.exchanges.get(config.exchange)
        if exchange is not None:  # a missing DLX drops the message, as in RabbitMQ
            readdressed = config.routing_key is not None
            death = death_of(message, queue.name, reason, now, readdressed)
            routing_key = message.routing_key if config.routing_key is None else config.routing_key
            dead = message.dead(death, config.exchange, routing_key)
            targets = vhost.route(exchange, dead)
            if reason != "rejected" and targets:
                history = dead.death_history()
                targets = [q for q in targets if not is_cycle(q.name, history)]
            for destination in targets:
                destination.enqueue(dead)
            target = f"exchange '{config.exchange}'"
    elif config.strategy is not None:
        eligible = (reason != "expired" or config.process_expired) and (
            message.persistent or config.process_non_persistent
        )
        if config.strategy == "discard" or not eligible:
            discarded.add(queue.name, now)
            target = "discarded"
        else:
            name = config.queue if config.strategy == "shared" else config.prefix + queue.name
            if name != queue.name:
                dlq = vhost.queues.get(name) or vhost.declare_queue(name, None, durable=True)
                death = death_of(message, queue.name, reason, now)
                dlq.enqueue(message.dead(death, message.exchange, message.routing_key))
                target = f"queue '{name}'"
    _advise(vhost, queue, message, reason, target)
    if reason == "expired":
        advisory.message_event(vhost, "Expired", queue.name, message, reason)
    if dead is not None or target.startswith("queue "):
        advisory.message_event(vhost, "MessageDLQd", queue.name, message, reason)


def _advise(vhost: Router, queue: HostedQueue, message: Message, reason: str, target: str) -> None:
    exchange = vhost.exchanges.get(EVENT_EXCHANGE)
    if exchange is None or not exchange.bindings:
        return
    message_id = message.properties.message_id
    info = {
        "vhost": vhost.name,
        "queue": queue.name,
        "reason": reason,
        "target": target,
        "message_id": message_id or "",
    }
    event = Message.build(
        EVENT_EXCHANGE,
        DEAD_LETTERED,
        json.dumps(info).encode(),
        Properties(content_type="application/json", headers=info),
    )
    for destination in vhost.route(exchange, event):
        destination.enqueue(event)
