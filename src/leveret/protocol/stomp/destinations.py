"""STOMP destination names, as ActiveMQ reads them, mapped onto the vhost's queues and
exchanges so STOMP and AMQP clients meet (the reference's decision 7):

===========================  ==========================================================
``/queue/X`` (or plain ``X``)  the queue ``X`` (created durable on first use)
``/topic/a.b``                 routing key ``a.b`` on ``amq.topic``; a subscription's
                               ``*`` is one word and ``>`` the rest (AMQP's ``#``)
``/exchange/E/key``            RabbitMQ's STOMP name: exchange ``E``, routing key ``key``
``/amq/queue/Q``               RabbitMQ's STOMP name for an existing queue ``Q``
``/temp-queue/N``              this connection's temporary queue ``N`` (deleted with it)
``/temp-topic/N``              this connection's temporary topic ``N``
``/remote-temp-queue/Q``       another connection's temporary queue, as its ``reply-to``
                               header names it (``/remote-temp-topic/T`` likewise)
``/a,/b``                      composite: every destination listed (ActiveMQ)
===========================  ==========================================================

Any other ``/prefix/`` is refused by name.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ...core.errors import BrokerError

TOPIC_EXCHANGE = "amq.topic"


class DestinationError(BrokerError):
    """A destination leveret cannot read; the text is the ERROR frame's message."""

    condition = "command_invalid"


@dataclass(frozen=True, slots=True)
class Destination:
    """One destination: ``kind`` is ``queue``, ``topic``, ``exchange``, ``temp-queue``
    or ``temp-topic`` (the connection resolves those two to a queue or a topic of its
    own); ``name`` the queue, or the routing key (a topic or exchange); ``exchange``
    where a SEND goes; ``create`` whether a missing queue is made (ActiveMQ's
    ``/queue/``; not RabbitMQ's ``/amq/queue/`` nor another connection's temporary
    queue)."""

    kind: str
    name: str
    exchange: str
    text: str
    create: bool = True

    @property
    def binding_key(self) -> str:
        """A topic subscription's routing key pattern: ActiveMQ's ``>`` is AMQP's ``#``."""
        return ".".join("#" if word == ">" else word for word in self.name.split("."))


@functools.lru_cache(maxsize=1024)
def parse(text: str) -> tuple[Destination, ...]:
    """The destinations of a ``destination`` header (several for a composite one),
    remembered for the next SEND to the same place. DestinationError for an empty
    name or an unknown prefix."""
    if not text:
        raise DestinationError("the destination header is missing or empty")
    return tuple(_parse_one(part.strip(), text) for part in text.split(","))


def _parse_one(part: str, whole: str) -> Destination:
    if part.startswith("/queue/"):
        name = part[len("/queue/") :]
        kind, exchange, create = "queue", "", True
    elif part.startswith("/topic/"):
        name = part[len("/topic/") :]
        kind, exchange, create = "topic", TOPIC_EXCHANGE, False
    elif part.startswith("/temp-queue/") or part.startswith("/temp-topic/"):
        kind, _, name = part[1:].partition("/")
        exchange, create = "", True
    elif part.startswith("/remote-temp-queue/"):
        name = part[len("/remote-temp-queue/") :]
        kind, exchange, create = "queue", "", False
    elif part.startswith("/remote-temp-topic/"):
        name = part[len("/remote-temp-topic/") :]
        kind, exchange, create = "topic", TOPIC_EXCHANGE, False
    elif part.startswith("/amq/queue/"):
        name = part[len("/amq/queue/") :]
        kind, exchange, create = "queue", "", False
    elif part.startswith("/exchange/"):
        exchange, _, name = part[len("/exchange/") :].partition("/")
        if not exchange:
            raise DestinationError(f"invalid destination '{whole}': no exchange name")
        kind, create = "exchange", False
    elif part.startswith("/"):
        prefix = "/" + part[1:].partition("/")[0] + "/"
        raise DestinationError(f"unknown destination prefix '{prefix}' in '{whole}'")
    else:  # ActiveMQ: a name without a prefix is a queue
        name = part
        kind, exchange, create = "queue", "", True
    if not name and kind != "exchange":
        raise DestinationError(f"invalid destination '{whole}': no name")
    return Destination(kind, name, exchange, part, create)
