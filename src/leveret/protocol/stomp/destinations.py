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
#: The names of a connection's temporary queues and topics start with these.
TEMP_QUEUE_PREFIX = "leveret.temp-queue."
TEMP_TOPIC_PREFIX = "leveret.temp-topic."


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


#: prefix -> (kind, exchange a SEND goes to, whether a missing queue is made)
_PREFIXES = {
    "/queue/": ("queue", "", True),
    "/topic/": ("topic", TOPIC_EXCHANGE, False),
    "/temp-queue/": ("temp-queue", "", True),
    "/temp-topic/": ("temp-topic", "", True),
    "/remote-temp-queue/": ("queue", "", False),
    "/remote-temp-topic/": ("topic", TOPIC_EXCHANGE, False),
    "/amq/queue/": ("queue", "", False),
}


def _parse_one(part: str, whole: str) -> Destination:
    if part.startswith("/exchange/"):
        exchange, _, name = part[len("/exchange/") :].partition("/")
        if not exchange:
            raise DestinationError(f"invalid destination '{whole}': no exchange name")
        return Destination("exchange", name, exchange, part, False)
    if not part.startswith("/"):  # ActiveMQ: a name without a prefix is a queue
        prefix, name = "/queue/", part
    else:
        prefix = "/amq/queue/" if part.startswith("/amq/queue/") else "/" + part[1:].partition("/")[0] + "/"
        if prefix not in _PREFIXES:
            raise DestinationError(f"unknown destination prefix '{prefix}' in '{whole}'")
        name = part[len(prefix) :]
    if not name:
        raise DestinationError(f"invalid destination '{whole}': no name")
    kind, exchange, create = _PREFIXES[prefix]
    return Destination(kind, name, exchange, part, create)
