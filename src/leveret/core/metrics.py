"""Counters the broker keeps anyway: plain integers, bumped where things happen.

Two kinds, both cheap enough for the hot path (an attribute increment, no lock: the
broker is one thread; no per-message object):

- :class:`BrokerCounters`, one per broker (``BrokerCore.metrics``, shared by its
  vhosts as ``VirtualHost.metrics``): RabbitMQ's ``rabbit_global_counters`` on the
  publishing side (received, routed, confirmed …) and the object totals (connections,
  channels, queues opened/closed/created/deleted);
- :class:`QueueCounters`, one per queue (``Queue.counters``): what was published to,
  delivered from, acknowledged in and dead-lettered out of that queue. A queue's
  counters are folded into its broker's :attr:`BrokerCounters.retired` when it is
  deleted, so the broker-wide totals (:meth:`BrokerCounters.queue_totals`) never go
  down.

All values are message or object counts since the broker started (they are not
persisted), monotonic, in RabbitMQ's meaning of the name (RabbitMQ 3.10's
``rabbitmq_global_messages_*_total``). Readers (the Prometheus endpoint, the management
API's ``message_stats``) take them at read time; rates are theirs to compute.

Who bumps what (so a new adapter knows its part):

==========================================  ===========================================
counter                                     bumped by
==========================================  ===========================================
received, received_confirm, routed,         :class:`~.publish.Publisher` (core)
unroutable_dropped, unroutable_returned,
confirmed, message_sizes;
``QueueCounters.published``
``QueueCounters.dead_lettered``             :func:`~.dead_letter.dead_letter` (core)
queues_declared/created/deleted             :class:`~.vhost.VirtualHost` (core)
``QueueCounters.delivered_*``,              each adapter, where it hands a message to
redelivered, get_empty, acknowledged        a client or takes its acknowledgement
                                            (it alone knows the acknowledgement mode);
                                            :class:`~.lease.Lease` for lease acks
``amqp10`` (:class:`ProtocolCounters`)      the AMQP 1.0 adapter, beside the above
connections_opened/closed                   the server's listeners
channels_opened/closed                      the AMQP adapter (STOMP has no channels)
==========================================  ===========================================

The management API's ``message_stats`` read the same counters (RabbitMQ's field →
counter; a rate is the difference of two readings over their interval):

=====================  ==============================================================
``publish``            a queue's ``published``; the overview's ``received``
``confirm``            ``confirmed``
``return_unroutable``  ``unroutable_returned``
``drop_unroutable``    ``unroutable_dropped``
``deliver``            ``delivered_consume_manual_ack``
``deliver_no_ack``     ``delivered_consume_auto_ack``
``get``                ``delivered_get_manual_ack``
``get_no_ack``         ``delivered_get_auto_ack``
``get_empty``          ``get_empty``
``deliver_get``        ``delivered`` (the four together)
``redeliver``          ``redelivered``
``ack``                ``acknowledged``
=====================  ==============================================================

Broker-wide queue counters: ``core.metrics.queue_totals(queues)`` with every live
queue (``[q for v in core.vhosts.values() for q in v.queues.values()]``); a queue's:
``queue.counters`` (:meth:`QueueCounters.as_dict` for JSON).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .queue_config import QueueConfig


class CountedQueue(Protocol):
    """What the broker's counters read of a queue (every :class:`.queues.Queue`)."""

    type_name: str
    config: QueueConfig
    counters: QueueCounters


#: Upper bounds (bytes) of the message size histogram's buckets, RabbitMQ's
#: ``rabbitmq_message_size_bytes``: 64 bytes × 4ⁿ up to 256 MiB, then +Inf.
MESSAGE_SIZE_BUCKETS = tuple(64 * 4**n for n in range(12))


#: The bucket of a size by the bit length of ``size - 1`` (the hot path indexes this:
#: no search, no function call of its own).
BUCKET_BY_BITS = tuple(min(max(0, (bits - 5) // 2), len(MESSAGE_SIZE_BUCKETS)) for bits in range(66))


def size_bucket(size: int) -> int:
    """The index in :data:`MESSAGE_SIZE_BUCKETS` of the smallest bound ``>= size``
    (``len(MESSAGE_SIZE_BUCKETS)``: +Inf); ``size`` below 2**65."""
    return BUCKET_BY_BITS[(size - 1).bit_length()]


#: The reasons a message dies (see :mod:`.dead_letter`), RabbitMQ's names.
DEAD_LETTER_REASONS = ("maxlen", "expired", "rejected", "delivery_limit")


class QueueCounters:
    """One queue's message counters (counts of messages since it was declared or the
    broker started). ``delivered_*`` split deliveries four ways as RabbitMQ does:
    to a consumer or by basic.get, with manual or automatic acknowledgement."""

    __slots__ = (
        "acknowledged",
        "dead_lettered",
        "delivered_consume_auto_ack",
        "delivered_consume_manual_ack",
        "delivered_get_auto_ack",
        "delivered_get_manual_ack",
        "get_empty",
        "published",
        "redelivered",
    )

    #: The integer fields, in the order :meth:`add` and readers use.
    FIELDS = (
        "published",
        "delivered_consume_manual_ack",
        "delivered_consume_auto_ack",
        "delivered_get_manual_ack",
        "delivered_get_auto_ack",
        "get_empty",
        "redelivered",
        "acknowledged",
    )

    def __init__(self) -> None:
        #: messages a publisher routed to this queue (dead letters arriving are not
        #: publishes: RabbitMQ's queue ``publish`` stat)
        self.published = 0
        self.delivered_consume_manual_ack = 0
        self.delivered_consume_auto_ack = 0
        self.delivered_get_manual_ack = 0
        self.delivered_get_auto_ack = 0
        #: basic.get on this queue that found it empty
        self.get_empty = 0
        #: deliveries (either way) of messages delivered before
        self.redelivered = 0
        #: deliveries a client acknowledged (automatic acknowledgement is not counted)
        self.acknowledged = 0
        #: messages that died in this queue, by reason (:data:`DEAD_LETTER_REASONS`)
        self.dead_lettered: dict[str, int] = dict.fromkeys(DEAD_LETTER_REASONS, 0)

    @property
    def delivered(self) -> int:
        """Every delivery: consumed or got, either acknowledgement mode."""
        return (
            self.delivered_consume_manual_ack
            + self.delivered_consume_auto_ack
            + self.delivered_get_manual_ack
            + self.delivered_get_auto_ack
        )

    def add(self, other: QueueCounters) -> None:
        """Add ``other``'s counts to these."""
        for name in self.FIELDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for reason, count in other.dead_lettered.items():
            self.dead_lettered[reason] = self.dead_lettered.get(reason, 0) + count

    def as_dict(self) -> dict[str, int]:
        """The counts by name (``delivered`` and ``dead_lettered_<reason>`` included)."""
        found = {name: getattr(self, name) for name in self.FIELDS}
        found["delivered"] = self.delivered
        for reason, count in self.dead_lettered.items():
            found[f"dead_lettered_{reason}"] = count
        return found


class ProtocolCounters:
    """One protocol's share of the broker's message counters (RabbitMQ 4's
    ``protocol`` label: ``rabbitmq_global_messages_received_total{protocol="amqp10"}``).

    The protocol's adapter bumps these beside core's counters, with core's meaning of
    each, so the rest of the broker is the total less these. ``publishers`` and
    ``consumers`` are gauges: its publishers that have published and are open, its
    consumers attached to a queue. ``queue_types`` holds the delivery side by queue
    type (``classic``, ``quorum``, ``stream``): delivered, redelivered, acknowledged."""

    __slots__ = (
        "confirmed",
        "consumers",
        "publishers",
        "queue_types",
        "received",
        "received_confirm",
        "unroutable_dropped",
        "unroutable_returned",
    )

    def __init__(self) -> None:
        self.received = 0
        self.received_confirm = 0
        self.unroutable_dropped = 0
        self.unroutable_returned = 0
        self.confirmed = 0
        self.publishers = 0
        self.consumers = 0
        self.queue_types: dict[str, QueueCounters] = {}

    def of_queue_type(self, type_name: str) -> QueueCounters:
        """The delivery counters for queues of ``type_name`` (an adapter keeps the one
        of its consumer's queue)."""
        counters = self.queue_types.get(type_name)
        if counters is None:
            counters = self.queue_types[type_name] = QueueCounters()
        return counters


def dead_letter_strategy(queue: CountedQueue) -> str:
    """RabbitMQ's ``dead_letter_strategy`` label for ``queue``: ``disabled`` without
    dead-lettering, else ``at_most_once`` (leveret's dead-lettering, like a classic
    queue's, is not confirmed)."""
    config = queue.config.dead_letter
    if config.exchange is None and config.strategy is None:
        return "disabled"
    return "at_most_once"


class BrokerCounters:
    """A broker's counters (see the module doc); every value counts since start."""

    __slots__ = (
        "amqp10",
        "channels_closed",
        "channels_opened",
        "confirmed",
        "connections_closed",
        "connections_opened",
        "message_size_sum",
        "message_sizes",
        "mqtt_received",
        "mqtt_sent",
        "publishers",
        "queues_created",
        "queues_declared",
        "queues_deleted",
        "received",
        "received_confirm",
        "retired",
        "unroutable_dropped",
        "unroutable_returned",
    )

    def __init__(self) -> None:
        #: messages published (each publish once, however many queues it reaches; a
        #: transaction's when committed)
        self.received = 0
        #: MQTT PUBLISHes received from clients and sent to them, by QoS (0, 1, 2)
        self.mqtt_received = [0, 0, 0]
        self.mqtt_sent = [0, 0, 0]
        #: of those, published with confirms on
        self.received_confirm = 0
        #: publishes that reached no queue, without ``mandatory``: dropped
        self.unroutable_dropped = 0
        #: publishes that reached no queue, ``mandatory``: returned to the publisher
        self.unroutable_returned = 0
        #: publisher confirms (acks) sent
        self.confirmed = 0
        #: received messages by body size: counts per bucket of
        #: :data:`MESSAGE_SIZE_BUCKETS` (not cumulative; the last is over 256 MiB)
        self.message_sizes = [0] * (len(MESSAGE_SIZE_BUCKETS) + 1)
        #: bytes of the bodies of received messages
        self.message_size_sum = 0
        #: publishers that have published at least once and are still open
        self.publishers = 0
        self.connections_opened = 0
        self.connections_closed = 0
        self.channels_opened = 0
        self.channels_closed = 0
        #: queue.declare calls that succeeded (not passive ones: they declare nothing)
        self.queues_declared = 0
        self.queues_created = 0
        self.queues_deleted = 0
        #: AMQP 1.0's share of the counters above (bumped by its adapter)
        self.amqp10 = ProtocolCounters()
        #: Counters of deleted queues, by (queue type, dead-letter strategy).
        self.retired: dict[tuple[str, str], QueueCounters] = {}

    @property
    def routed(self) -> int:
        """Publishes that reached at least one queue (or a consumer, or were held): the
        received ones less the unroutable ones (kept so, one increment fewer a message)."""
        return self.received - self.unroutable_dropped - self.unroutable_returned

    def retire(self, queue: CountedQueue) -> None:
        """``queue`` is deleted: keep its counts in the broker's totals."""
        key = (queue.type_name, dead_letter_strategy(queue))
        total = self.retired.get(key)
        if total is None:
            total = self.retired[key] = QueueCounters()
        total.add(queue.counters)

    def queue_totals(self, queues: list[CountedQueue]) -> dict[tuple[str, str], QueueCounters]:
        """Broker-wide queue counters by (queue type, dead-letter strategy): the retired
        ones plus those of ``queues`` (every live queue of the broker)."""
        totals: dict[tuple[str, str], QueueCounters] = {}
        for key, counters in self.retired.items():
            totals[key] = total = QueueCounters()
            total.add(counters)
        for queue in queues:
            key = (queue.type_name, dead_letter_strategy(queue))
            found = totals.get(key)
            if found is None:
                found = totals[key] = QueueCounters()
            found.add(queue.counters)
        return totals

    def as_dict(self) -> dict[str, int]:
        """The broker-level counts by name (queue counters: :meth:`queue_totals`)."""
        skip = ("retired", "message_sizes")
        found = {name: getattr(self, name) for name in self.__slots__ if name not in skip}
        found["routed"] = self.routed
        return found


__all__ = [
    "BUCKET_BY_BITS",
    "DEAD_LETTER_REASONS",
    "MESSAGE_SIZE_BUCKETS",
    "BrokerCounters",
    "QueueCounters",
    "dead_letter_strategy",
    "size_bucket",
]
