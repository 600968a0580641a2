"""Prometheus metrics with RabbitMQ's names (``rabbitmq_prometheus``), on their own port.

Served by aiohttp on ``prometheus_port`` (RabbitMQ's 15692), in the text exposition
format of ``prometheus-client``, whose custom collectors read core's counters
(:mod:`leveret.core.metrics`) and gauges at scrape time; nothing is kept twice:

- ``GET /metrics``: aggregated, no per-object labels: ``rabbitmq_global_*`` counters,
  queue/connection/channel/consumer totals, ``rabbitmq_queue_messages_{ready,unacked}``
  summed, process gauges, ``rabbitmq_message_size_bytes`` histogram;
- ``GET /metrics/per-object``: the same, with per-queue series labelled
  ``{vhost, queue}``, and the dead-letter counter per queue and reason
  ``leveret_queue_messages_dead_lettered_total{vhost, queue, reason}``; both have
  ``leveret_mqtt_messages_received_total{qos}`` and
  ``leveret_mqtt_messages_sent_total{qos}``, MQTT PUBLISH packets by QoS;
- ``GET /metrics/detailed?family=F&vhost=V``: only the families asked for
  (:data:`FAMILIES`), per queue, named ``rabbitmq_detailed_*``, restricted to the vhosts
  given (all when none); an unknown family or vhost is a 400 with a plain-text reason.

``/metrics`` and ``/metrics/per-object`` also have the federation links by state
(``rabbitmq_federation_links{status}``, :mod:`.federation_metrics`).

Every endpoint also has ``rabbitmq_identity_info{rabbitmq_node, rabbitmq_cluster,
rabbitmq_cluster_permanent_id, rabbitmq_endpoint}`` and ``rabbitmq_build_info``, which
the RabbitMQ-Overview Grafana dashboard joins every panel on. A cluster node
(docs/cluster.md) serves its own metrics: ``rabbitmq_node`` its node name,
``rabbitmq_cluster`` the cluster's name (the ``cluster_name`` global parameter if set),
and only the queues it owns, as each RabbitMQ node serves its own queues' metrics. Units are in the names
(``_bytes``, ``_seconds``); ``_total`` series are counters since the broker started.
"""

from __future__ import annotations

import asyncio
import operator
import os
import platform
import resource
import shutil
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from ..core.broker import BrokerCore
from ..core.metrics import (
    DEAD_LETTER_REASONS,
    MESSAGE_SIZE_BUCKETS,
    ProtocolCounters,
    QueueCounters,
    dead_letter_strategy,
)
from ..core.queues import Queue
from ..core.queues.remote import RemoteQueue
from ..server.http_guard import ConnectionGuard, GuardedSite
from ..server.http_limits import HttpLimits
from ..version import __version__
from .cluster_view import cluster_name
from .federation import FederationLinks
from .federation_metrics import FederationCollector
from .metrics_text import SUMS_OF, Series, parts
from .slicing import Slicer

#: RabbitMQ's ``queue_type`` label values for leveret's queue types.
QUEUE_TYPES = {
    "classic": "rabbit_classic_queue",
    "quorum": "rabbit_quorum_queue",
    "stream": "rabbit_stream_queue",
}
#: RabbitMQ 3.10's ``protocol`` label: its STOMP plugin publishes and consumes through
#: AMQP channels, so every counter is ``amqp091`` there; leveret does the same, for
#: MQTT too.
PROTOCOL = "amqp091"
#: RabbitMQ 4's label for AMQP 1.0 clients' share (``core.metrics.amqp10``); the
#: ``amqp091`` series are the rest, so a sum over ``protocol`` is the broker's total.
AMQP10 = "amqp10"

_ready = attrgetter("message_count")
_unacked = attrgetter("unacked_count")


def _messages(queue: Queue) -> int:
    return queue.message_count + queue.unacked_count


SUMS_OF[_messages] = (_ready, _unacked)

#: The families of ``/metrics/detailed`` (RabbitMQ's, and leveret's dead letters), each
#: a list of (metric suffix, type, help, reader of one queue).
QueueReader = Callable[[Queue], float]
FAMILIES: dict[str, list[tuple[str, str, str, QueueReader]]] = {
    "queue_coarse_metrics": [
        (
            "queue_messages_ready",
            "gauge",
            "Messages ready to be delivered to consumers",
            _ready,
        ),
        (
            "queue_messages_unacked",
            "gauge",
            "Messages delivered to consumers but not yet acknowledged",
            _unacked,
        ),
        ("queue_messages", "gauge", "Sum of ready and unacknowledged messages", _messages),
    ],
    "queue_consumer_count": [
        ("queue_consumers", "gauge", "Consumers on a queue", lambda q: len(q.consumers)),
    ],
    "queue_delivery_metrics": [
        (
            "queue_get_ack_total",
            "counter",
            "Messages fetched from a queue with basic.get in manual acknowledgement mode",
            attrgetter("counters.delivered_get_manual_ack"),
        ),
        (
            "queue_get_total",
            "counter",
            "Messages fetched from a queue with basic.get in automatic acknowledgement mode",
            attrgetter("counters.delivered_get_auto_ack"),
        ),
        (
            "queue_messages_delivered_ack_total",
            "counter",
            "Messages delivered from a queue to consumers in manual acknowledgement mode",
            attrgetter("counters.delivered_consume_manual_ack"),
        ),
        (
            "queue_messages_delivered_total",
            "counter",
            "Messages delivered from a queue to consumers in automatic acknowledgement mode",
            attrgetter("counters.delivered_consume_auto_ack"),
        ),
        (
            "queue_messages_redelivered_total",
            "counter",
            "Messages redelivered from a queue to consumers",
            attrgetter("counters.redelivered"),
        ),
        (
            "queue_messages_acked_total",
            "counter",
            "Messages acknowledged by consumers on a queue",
            attrgetter("counters.acknowledged"),
        ),
        (
            "queue_get_empty_total",
            "counter",
            "Times basic.get found a queue empty",
            attrgetter("counters.get_empty"),
        ),
    ],
    "queue_exchange_metrics": [
        (
            "queue_messages_published_total",
            "counter",
            "Messages publishers routed to a queue (leveret: no exchange label)",
            attrgetter("counters.published"),
        ),
    ],
}
#: leveret's own family: dead letters per queue and reason.
DEAD_LETTER_FAMILY = "leveret_dead_letters"
KNOWN_FAMILIES = (*FAMILIES, DEAD_LETTER_FAMILY)


_RETURNED = "Messages published as mandatory into an exchange and returned to the publisher as unroutable"
_DROPPED = "Messages published as non-mandatory into an exchange and dropped as unroutable"


@dataclass
class NodeInfo:
    """What the metrics say of the broker process besides core: its identity and the
    limits the server enforces (``memory_limit`` bytes, 0: none; ``disk_free_limit``
    bytes; ``data_dir``: where free disk space is measured, the working directory
    when None)."""

    node: str = field(default_factory=lambda: f"leveret@{socket.gethostname()}")
    cluster: str = ""
    memory_limit: Callable[[], int] = lambda: 0
    disk_free_limit: Callable[[], int] = lambda: 0
    data_dir: str | None = None
    started: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if not self.cluster:
            self.cluster = self.node


def _amqp10_share(counters: ProtocolCounters, name: str) -> int:
    """AMQP 1.0's part of the global counter ``name`` (routed: received less unroutable)."""
    if name == "routed":
        return counters.received - counters.unroutable_dropped - counters.unroutable_returned
    return getattr(counters, name)


def _counter(name: str, documentation: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, labels=list(labels))


def _gauge(name: str, documentation: str, value: float | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


#: Queues summed at a time by :func:`summing` (a part takes ~1 ms).
SUM_PART = 512
_FIELD_READERS = tuple((name, operator.attrgetter(name)) for name in QueueCounters.FIELDS)
_DEAD_READERS = tuple((r, operator.methodcaller("get", r, 0)) for r in DEAD_LETTER_REASONS)


@dataclass
class QueueSums:
    """What the node-wide families sum over every queue: their number, consumers,
    ready and unacknowledged messages, and counters by (queue type, dead-letter
    strategy) with the deleted queues' (core's ``queue_totals``)."""

    count: int = 0
    consumers: int = 0
    ready: int = 0
    unacked: int = 0
    totals: dict[tuple[str, str], QueueCounters] = field(default_factory=dict)


def summing(core: BrokerCore, queues: list[Queue], sums: QueueSums) -> Iterator[None]:
    """Fill ``sums`` over ``queues``, yielding after each :data:`SUM_PART` of them (so
    the event loop can be given a turn: :func:`queue_sums`)."""
    sums.totals = core.metrics.queue_totals([])  # the deleted queues'
    sums.count = len(queues)
    for start in range(0, len(queues), SUM_PART):
        part = queues[start : start + SUM_PART]
        sums.consumers += sum(len(q.consumers) for q in part)
        sums.ready += sum(q.message_count for q in part)
        sums.unacked += sum(q.unacked_count for q in part)
        groups: dict[tuple[str, str], list[QueueCounters]] = {}
        for queue in part:
            groups.setdefault((queue.type_name, dead_letter_strategy(queue)), []).append(queue.counters)
        for key, group in groups.items():
            found = sums.totals.get(key)
            if found is None:
                found = sums.totals[key] = QueueCounters()
            for name, read in _FIELD_READERS:
                setattr(found, name, getattr(found, name) + sum(map(read, group)))
            dicts = [c.dead_lettered for c in group]
            for reason, get in _DEAD_READERS:
                found.dead_lettered[reason] = found.dead_lettered.get(reason, 0) + sum(map(get, dicts))
        yield


async def queue_sums(core: BrokerCore, queues: list[Queue], slicer: Slicer) -> QueueSums:
    """:class:`QueueSums` of ``queues``, in slices (:mod:`.slicing`)."""
    sums = QueueSums()
    for _ in summing(core, queues, sums):
        await slicer.pause()
    return sums


class BrokerCollector(Collector):
    """Reads ``core`` at each scrape (on the broker's event loop: the HTTP server runs
    there). ``endpoint`` is ``aggregated``, ``per-object`` or ``detailed``; for
    ``detailed``, ``families`` and ``vhosts`` (None: all) choose what is read.
    ``sums``: the queues' sums made beforehand (:func:`queue_sums`, in slices), else
    made here at once; ``per_queue``: False leaves out the per-queue series (the
    server writes them itself: :mod:`.metrics_text`)."""

    def __init__(
        self,
        core: BrokerCore,
        node: NodeInfo,
        endpoint: str = "aggregated",
        families: Iterable[str] = (),
        vhosts: Iterable[str] | None = None,
        sums: QueueSums | None = None,
        per_queue: bool = True,
    ) -> None:
        self.core = core
        self.node = node
        self.endpoint = endpoint
        self.families = list(families)
        self.vhosts = None if vhosts is None else set(vhosts)
        self.sums = sums
        self.per_queue = per_queue

    def queues(self) -> list[Queue]:
        """The queues it reads (of the vhosts asked for): on a cluster node, those it
        owns (another node's queue is in its owner's metrics, as RabbitMQ's per-object
        metrics are per node)."""
        return [
            queue
            for vhost in self.core.vhosts.values()
            if self.vhosts is None or vhost.name in self.vhosts
            for queue in vhost.queues.values()
            if not isinstance(queue, RemoteQueue)
        ]

    def collect(self) -> Iterator[Metric]:
        """The metric families of this endpoint."""
        if self.endpoint == "detailed":
            if self.per_queue:
                yield from self._detailed(self.queues())
        else:
            sums = self.sums
            if sums is None:
                sums = QueueSums()
                for _ in summing(self.core, self.queues(), sums):
                    pass
            yield from self._totals(sums)
            yield from self._global(sums)
            yield from self._mqtt()
            yield from self._process()
            if self.endpoint != "per-object":  # per-object: see per_queue_text
                yield from self._queue_gauges(sums)
        yield from self._identity()

    # -- node-wide ------------------------------------------------------------------
    def _totals(self, sums: QueueSums) -> Iterator[Metric]:
        m = self.core.metrics
        for name, value, text in (
            ("connections_opened", m.connections_opened, "Connections opened"),
            ("connections_closed", m.connections_closed, "Connections closed or terminated"),
            ("channels_opened", m.channels_opened, "Channels opened"),
            ("channels_closed", m.channels_closed, "Channels closed"),
            ("queues_declared", m.queues_declared, "Queues declared"),
            ("queues_created", m.queues_created, "Queues created"),
            ("queues_deleted", m.queues_deleted, "Queues deleted"),
        ):
            family = _counter(f"rabbitmq_{name}", f"Total number of {text.lower()}")
            family.add_metric([], value)
            yield family
        consumers = sums.consumers
        yield _gauge(
            "rabbitmq_connections", "Connections currently open", m.connections_opened - m.connections_closed
        )
        yield _gauge("rabbitmq_channels", "Channels currently open", m.channels_opened - m.channels_closed)
        yield _gauge("rabbitmq_consumers", "Consumers currently connected", consumers)
        yield _gauge("rabbitmq_queues", "Queues available", sums.count)
        yield _gauge("rabbitmq_channel_consumers", "Consumers on channels", consumers)
        yield _gauge(
            "rabbitmq_channel_messages_unacked",
            "Delivered but not yet acknowledged messages",
            sums.unacked,
        )

    def _mqtt(self) -> Iterator[Metric]:
        """MQTT PUBLISH packets by QoS (label ``qos`` ``0``, ``1``, ``2``): taken from
        clients (refused ones not counted) and sent to them (retained messages sent on
        subscribe not counted). RabbitMQ 3.10 has no such series: its MQTT plugin's
        messages count in ``rabbitmq_global_*`` as AMQP ones, as leveret's do too."""
        m = self.core.metrics
        for direction, counts, text in (
            ("received", m.mqtt_received, "MQTT PUBLISH packets received from clients, by QoS"),
            ("sent", m.mqtt_sent, "MQTT PUBLISH packets sent to clients, by QoS"),
        ):
            family = _counter(f"leveret_mqtt_messages_{direction}", text, ["qos"])
            for qos, value in enumerate(counts):
                family.add_metric([str(qos)], value)
            yield family

    def _global(self, sums: QueueSums) -> Iterator[Metric]:
        m = self.core.metrics
        protocol = ["protocol"]
        for name, value, text in (
            ("received", m.received, "Messages received from publishers"),
            (
                "received_confirm",
                m.received_confirm,
                "Messages received from publishers expecting confirmations",
            ),
            ("routed", m.routed, "Messages routed to queues or streams"),
            (
                "unroutable_dropped",
                m.unroutable_dropped,
                _DROPPED,
            ),
            (
                "unroutable_returned",
                m.unroutable_returned,
                _RETURNED,
            ),
            ("confirmed", m.confirmed, "Messages confirmed to publishers"),
        ):
            family = _counter(
                f"rabbitmq_global_messages_{name}", f"Total number of {text[0].lower()}{text[1:]}", protocol
            )
            share = _amqp10_share(m.amqp10, name)
            family.add_metric([PROTOCOL], value - share)
            family.add_metric([AMQP10], share)
            yield family
        publishers = GaugeMetricFamily(
            "rabbitmq_global_publishers", "Current number of publishers", labels=protocol
        )
        publishers.add_metric([PROTOCOL], m.publishers - m.amqp10.publishers)
        publishers.add_metric([AMQP10], m.amqp10.publishers)
        yield publishers
        consumers = GaugeMetricFamily(
            "rabbitmq_global_consumers", "Current number of consumers", labels=protocol
        )
        consumers.add_metric([PROTOCOL], sums.consumers - m.amqp10.consumers)
        consumers.add_metric([AMQP10], m.amqp10.consumers)
        yield consumers
        totals = sums.totals
        by_type: dict[str, QueueCounters] = {name: QueueCounters() for name in QUEUE_TYPES.values()}
        for (type_name, _), counters in totals.items():
            by_type.setdefault(QUEUE_TYPES.get(type_name, type_name), QueueCounters()).add(counters)
        labels = ["protocol", "queue_type"]
        amqp10_by_type = {QUEUE_TYPES.get(t, t): c for t, c in m.amqp10.queue_types.items()}
        for name, text in (
            ("delivered", "Messages delivered to consumers"),
            (
                "delivered_consume_manual_ack",
                "Messages delivered to consumers in manual acknowledgement mode",
            ),
            (
                "delivered_consume_auto_ack",
                "Messages delivered to consumers in automatic acknowledgement mode",
            ),
            ("delivered_get_manual_ack", "Messages fetched with basic.get in manual acknowledgement mode"),
            ("delivered_get_auto_ack", "Messages fetched with basic.get in automatic acknowledgement mode"),
            ("get_empty", "Times basic.get found a queue empty"),
            ("redelivered", "Messages redelivered to consumers"),
            ("acknowledged", "Messages acknowledged by consumers"),
        ):
            family = _counter(
                f"rabbitmq_global_messages_{name}", f"Total number of {text[0].lower()}{text[1:]}", labels
            )
            for queue_type, counters in sorted(by_type.items()):
                of_type = amqp10_by_type.get(queue_type)
                counted = 0 if of_type is None else getattr(of_type, name)
                family.add_metric([PROTOCOL, queue_type], getattr(counters, name) - counted)
                family.add_metric([AMQP10, queue_type], counted)
            yield family
        dead_labels = ["queue_type", "dead_letter_strategy"]
        for reason in DEAD_LETTER_REASONS:
            family = _counter(
                f"rabbitmq_global_messages_dead_lettered_{reason}",
                f"Total number of messages dead-lettered due to {reason}",
                dead_labels,
            )
            seen = {(QUEUE_TYPES["classic"], "disabled"), (QUEUE_TYPES["classic"], "at_most_once")}
            values: dict[tuple[str, str], int] = dict.fromkeys(seen, 0)
            for (type_name, strategy), counters in totals.items():
                key = (QUEUE_TYPES.get(type_name, type_name), strategy)
                values[key] = values.get(key, 0) + counters.dead_lettered.get(reason, 0)
            for (queue_type, strategy), value in sorted(values.items()):
                family.add_metric([queue_type, strategy], value)
            yield family
        # the channel families of the older dashboards, from the same counters
        channel_totals = QueueCounters()
        for counters in by_type.values():
            channel_totals.add(counters)
        for name, value, text in (
            ("channel_messages_published", m.received, "Messages published into an exchange on a channel"),
            (
                "channel_messages_confirmed",
                m.confirmed,
                "Messages published into an exchange and confirmed on the channel",
            ),
            (
                "channel_messages_unroutable_returned",
                m.unroutable_returned,
                _RETURNED,
            ),
            (
                "channel_messages_unroutable_dropped",
                m.unroutable_dropped,
                _DROPPED,
            ),
            (
                "channel_get_ack",
                channel_totals.delivered_get_manual_ack,
                "Messages fetched with basic.get in manual acknowledgement mode",
            ),
            (
                "channel_get",
                channel_totals.delivered_get_auto_ack,
                "Messages fetched with basic.get in automatic acknowledgement mode",
            ),
            (
                "channel_messages_delivered_ack",
                channel_totals.delivered_consume_manual_ack,
                "Messages delivered to consumers in manual acknowledgement mode",
            ),
            (
                "channel_messages_delivered",
                channel_totals.delivered_consume_auto_ack,
                "Messages delivered to consumers in automatic acknowledgement mode",
            ),
            ("channel_messages_redelivered", channel_totals.redelivered, "Messages redelivered to consumers"),
            ("channel_messages_acked", channel_totals.acknowledged, "Messages acknowledged by consumers"),
            ("channel_get_empty", channel_totals.get_empty, "Times basic.get found a queue empty"),
        ):
            family = _counter(f"rabbitmq_{name}", f"Total number of {text[0].lower()}{text[1:]}")
            family.add_metric([], value)
            yield family
        sizes = HistogramMetricFamily(
            "rabbitmq_message_size_bytes", "Size of messages received from publishers", labels=protocol
        )
        buckets, running = [], 0
        for bound, count in zip((*map(floatToGoString, MESSAGE_SIZE_BUCKETS), "+Inf"), m.message_sizes):
            running += count
            buckets.append((bound, running))
        sizes.add_metric([PROTOCOL], buckets, m.message_size_sum)
        yield sizes

    def _process(self) -> Iterator[Metric]:
        node, core = self.node, self.core
        memory = _resident_memory()
        fds = _open_fds()
        max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        try:
            disk_free = shutil.disk_usage(node.data_dir or ".").free
        except OSError:
            disk_free = 0
        connections = core.metrics.connections_opened - core.metrics.connections_closed
        yield _gauge(
            "rabbitmq_process_resident_memory_bytes", "Memory used in bytes (resident set size)", memory
        )
        yield _gauge(
            "rabbitmq_resident_memory_limit_bytes",
            "Memory high watermark in bytes (0: none)",
            node.memory_limit(),
        )
        yield _gauge("rabbitmq_process_open_fds", "Open file descriptors", fds)
        yield _gauge("rabbitmq_process_max_fds", "Open file descriptors limit", max_fds if max_fds > 0 else 0)
        yield _gauge("rabbitmq_process_open_tcp_sockets", "Open client TCP sockets", connections)
        yield _gauge(
            "rabbitmq_process_max_tcp_sockets",
            "Open TCP sockets limit (the fd limit)",
            max_fds if max_fds > 0 else 0,
        )
        yield _gauge(
            "rabbitmq_disk_space_available_bytes",
            "Disk space available in bytes (under the data directory)",
            disk_free,
        )
        yield _gauge(
            "rabbitmq_disk_space_available_limit_bytes",
            "Free disk space low watermark in bytes",
            node.disk_free_limit(),
        )
        for name, source in (("memory_used_watermark", "memory"), ("free_disk_space_watermark", "disk")):
            alarm = UnknownMetricFamily(f"rabbitmq_alarms_{name}", f"1 if the {source} alarm is in effect")
            alarm.add_metric([], 1 if source in core.alarm_sources else 0)
            yield alarm
        holds = _counter("leveret_publisher_flow_holds", "Publishing connections held by flow control")
        holds.add_metric([], core.flow.holds)
        yield holds
        yield _gauge(
            "leveret_store_backlog_bytes",
            "Bytes of messages the store has not written yet (flow control's measure)",
            getattr(core.store, "backlog_bytes", 0),
        )
        yield _gauge(
            "leveret_queue_memory_bytes",
            "Bytes queues hold messages in (bodies and their objects), against the budget",
            core.queue_memory.held,
        )
        yield _gauge(
            "leveret_queue_memory_budget_bytes",
            "Queue memory past which messages are paged to the store (0: none)",
            core.queue_memory.budget,
        )
        yield _gauge(
            "leveret_memory_pressure",
            "1 while queues page messages to the store (memory budget or paging ratio)",
            int(core.memory_pressure),
        )
        uptime = time.time() - node.started
        yield _gauge(
            "rabbitmq_erlang_uptime_seconds",
            "Broker uptime in seconds (leveret: the Python process's)",
            uptime,
        )
        yield _gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            node.started,
        )

    def _queue_gauges(self, sums: QueueSums) -> Iterator[Metric]:
        """The per-queue gauges summed (``/metrics``)."""
        values = {
            "queue_messages_ready": sums.ready,
            "queue_messages_unacked": sums.unacked,
            "queue_messages": sums.ready + sums.unacked,
            "queue_consumers": sums.consumers,
        }
        for name, _, text, _ in FAMILIES["queue_coarse_metrics"] + FAMILIES["queue_consumer_count"]:
            yield _gauge(f"rabbitmq_{name}", text, values[name])

    # -- per queue --------------------------------------------------------------------
    def _per_queue(self, queues: list[Queue], prefix: str, families: list[str]) -> Iterator[Metric]:
        labels = ["vhost", "queue"]
        for family_name in families:
            for name, kind, text, read in FAMILIES[family_name]:
                family: CounterMetricFamily | GaugeMetricFamily
                if kind == "counter":
                    family = _counter(prefix + name, text, labels)
                else:
                    family = GaugeMetricFamily(prefix + name, text, labels=labels)
                for queue in queues:
                    family.add_metric([queue.host.name, queue.name], read(queue))
                yield family

    def _dead_letters(self, queues: list[Queue]) -> Metric:
        family = _counter(
            "leveret_queue_messages_dead_lettered",
            "Messages that died in a queue, by reason (maxlen, expired, rejected, delivery_limit)",
            ["vhost", "queue", "reason", "dead_letter_strategy"],
        )
        for queue in queues:
            strategy = dead_letter_strategy(queue)
            for reason in DEAD_LETTER_REASONS:
                family.add_metric(
                    [queue.host.name, queue.name, reason, strategy],
                    queue.counters.dead_lettered.get(reason, 0),
                )
        return family

    def _detailed(self, queues: list[Queue]) -> Iterator[Metric]:
        wanted = [f for f in self.families if f in FAMILIES]
        yield from self._per_queue(queues, "rabbitmq_detailed_", wanted)
        if DEAD_LETTER_FAMILY in self.families:
            yield self._dead_letters(queues)

    # -- identity -----------------------------------------------------------------------
    def _identity(self) -> Iterator[Metric]:
        import prometheus_client

        build = UnknownMetricFamily(
            "rabbitmq_build_info",
            "RabbitMQ & Erlang/OTP version info (leveret: its version, and Python's as erlang_version)",
            labels=[
                "product_name",
                "product_version",
                "rabbitmq_version",
                "prometheus_plugin_version",
                "prometheus_client_version",
                "erlang_version",
            ],
        )
        client_version = getattr(prometheus_client, "__version__", "") or _distribution_version()
        build.add_metric(
            ["leveret", __version__, __version__, __version__, client_version, platform.python_version()], 1
        )
        yield build
        identity = UnknownMetricFamily(
            "rabbitmq_identity_info",
            "RabbitMQ node & cluster identity info",
            labels=[
                "rabbitmq_node",
                "rabbitmq_cluster",
                "rabbitmq_cluster_permanent_id",
                "rabbitmq_endpoint",
            ],
        )
        node, cluster = self.node.node, self.node.cluster
        permanent = f"leveret-cluster-id-{cluster}"
        if self.core.cluster is not None:  # each node its own name; the cluster's name and id
            node = str(self.core.cluster.node)
            cluster = cluster_name(self.core, str(self.core.cluster.cluster))
            permanent = f"leveret-cluster-id-{self.core.cluster.cluster}"
        identity.add_metric([node, cluster, permanent, self.endpoint], 1)
        yield identity


#: The per-queue families of ``/metrics/per-object``, written by :func:`per_queue_text`.
PER_OBJECT_FAMILIES = (
    "queue_coarse_metrics",
    "queue_consumer_count",
    "queue_delivery_metrics",
    "queue_exchange_metrics",
)


DEAD_LETTERS_TOTAL = "leveret_queue_messages_dead_lettered_total"


def queue_series(prefix: str, families: Iterable[str]) -> list[Series]:
    """The per-queue series of ``families`` named with ``prefix`` (``rabbitmq_`` or
    ``rabbitmq_detailed_``), counters ending in ``_total``."""
    return [
        (prefix + (name.removesuffix("_total") + "_total" if kind == "counter" else name), kind, text, read)
        for family in families
        for name, kind, text, read in FAMILIES[family]
    ]


def per_queue_text(queues: list[Queue]) -> str:
    """The per-queue series of ``/metrics/per-object`` (:data:`PER_OBJECT_FAMILIES` and
    leveret's dead letters per queue and reason) in the text format, as
    prometheus-client's ``generate_latest`` writes them, written by
    :mod:`.metrics_text` (all at once; the server writes them in slices)."""
    return "".join(parts(queues, queue_series("rabbitmq_", PER_OBJECT_FAMILIES), DEAD_LETTERS_TOTAL))


def _latest(collector: BrokerCollector, *more: Collector) -> bytes:
    """prometheus-client's text of ``collector`` (and ``more``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    for other in more:
        registry.register(other)
    return generate_latest(registry)


def _distribution_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("prometheus-client")
    except PackageNotFoundError:
        return ""


def _resident_memory() -> int:
    """Resident set size in bytes (Linux: /proc/self/statm; elsewhere the peak)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if platform.system() == "Darwin" else peak * 1024


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


class PrometheusServer:
    """The HTTP server of the metrics, on ``host:port`` (0 picks a free port: read
    :attr:`port` after :meth:`start`)."""

    def __init__(
        self,
        core: BrokerCore,
        host: str,
        port: int,
        node: NodeInfo | None = None,
        per_object_interval: float = 5.0,
        limits: HttpLimits | None = None,
        cap: int | None = None,
        federation: FederationLinks | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.core = core
        self.reuse_port = reuse_port  # SO_REUSEPORT: the nodes of --nodes N share the port
        #: the broker's federation links (:mod:`.federation_metrics`), if any
        self.federation = federation
        #: the port's header and keep-alive timeouts and cap (:mod:`..server.http_guard`)
        self.limits = limits or HttpLimits()
        self.guard = ConnectionGuard("Prometheus port", self.limits, cap)
        self.host = host
        self.port = port
        self.node = node or NodeInfo()
        #: seconds a ``/metrics/per-object`` answer is served again before it is made
        #: anew (RabbitMQ's per-object values change once a ``collect_statistics_interval``
        #: too); with 100,000 queues one is ~130 MB of text and ~1 s of CPU (in slices)
        self.per_object_interval = per_object_interval
        self._per_object: tuple[float, list[bytes]] | None = None
        #: the per-object answer being made, which scrapes meanwhile wait for
        self._making: asyncio.Future[list[bytes]] | None = None
        self.app = web.Application()
        self.app.router.add_get("/metrics", self.aggregated)
        self.app.router.add_get("/metrics/per-object", self.per_object)
        self.app.router.add_get("/metrics/detailed", self.detailed)
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Listen (OSError if the port cannot be bound)."""
        self._runner = web.AppRunner(
            self.app, access_log=None, keepalive_timeout=self.limits.keepalive_timeout
        )
        await self._runner.setup()
        try:
            await GuardedSite(
                self._runner, self.host, self.port, self.guard, reuse_port=self.reuse_port or None
            ).start()
        except BaseException:
            await self._runner.cleanup()
            self._runner = None
            raise
        self.port = self._runner.addresses[-1][1]

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def render(self, collector: BrokerCollector, body: bytes | None = None) -> web.Response:
        """One scrape of ``collector`` in the text format (``body``: made already)."""
        if body is None:
            body = _latest(collector)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    def _streamed(self, chunks: list[bytes]) -> web.Response:
        """An answer of ``chunks`` written one by one (waiting for the socket to drain:
        the text is never copied whole into the transport's buffer)."""

        async def body() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        response = web.Response(body=body())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    def _queues(self, vhosts: Iterable[str] | None = None) -> list[Queue]:
        return BrokerCollector(self.core, self.node, vhosts=vhosts).queues()

    async def aggregated(self, request: web.Request) -> web.Response:
        """``GET /metrics``: totals, no per-object labels (the queues summed in
        slices: :mod:`.slicing`)."""
        sums = await queue_sums(self.core, self._queues(), Slicer())
        collector = BrokerCollector(self.core, self.node, "aggregated", sums=sums)
        return self.render(collector, _latest(collector, *self._more()))

    def _more(self) -> list[Collector]:
        """The collectors beside core's (federation's, when the broker has links)."""
        return [] if self.federation is None else [FederationCollector(self.federation)]

    async def per_object(self, request: web.Request) -> web.Response:
        """``GET /metrics/per-object``: every series per queue too, at most
        :attr:`per_object_interval` seconds old; made in slices that give the event
        loop back (:mod:`.slicing`), once for scrapes that come while it is made."""
        cached = self._per_object
        if cached is None or time.monotonic() - cached[0] >= self.per_object_interval:
            making = self._making
            if making is None:
                making = self._making = asyncio.ensure_future(self._make_per_object())
                making.add_done_callback(self._made)
            return self._streamed(await asyncio.shield(making))
        return self._streamed(cached[1])

    def _made(self, making: asyncio.Future[list[bytes]]) -> None:
        self._making = None
        if not making.cancelled() and making.exception() is None:
            self._per_object = (time.monotonic(), making.result())

    async def _make_per_object(self) -> list[bytes]:
        slicer = Slicer()
        queues = self._queues()
        sums = await queue_sums(self.core, queues, slicer)
        head = _latest(BrokerCollector(self.core, self.node, "per-object", sums=sums), *self._more())
        chunks = [head]
        series = queue_series("rabbitmq_", PER_OBJECT_FAMILIES)
        for text in parts(queues, series, DEAD_LETTERS_TOTAL):
            if text:
                chunks.append(text.encode())
            await slicer.pause()
        return chunks

    async def detailed(self, request: web.Request) -> web.Response:
        """``GET /metrics/detailed?family=F[&family=G][&vhost=V…]``: 400 for an unknown
        family or vhost, or without any family."""
        families = request.query.getall("family", [])
        unknown = [f for f in families if f not in KNOWN_FAMILIES]
        if unknown or not families:
            what = f"unknown family {', '.join(unknown)}" if unknown else "no family given"
            return web.Response(
                status=400,
                text=f"{what}; families: {', '.join(KNOWN_FAMILIES)}\n",
            )
        vhosts = request.query.getall("vhost", []) or None
        if vhosts is not None:
            missing = [v for v in vhosts if v not in self.core.vhosts]
            if missing:
                return web.Response(status=400, text=f"unknown vhost {', '.join(missing)}\n")
        slicer = Slicer()
        queues = self._queues(vhosts)
        series = queue_series("rabbitmq_detailed_", [f for f in families if f in FAMILIES])
        dead = DEAD_LETTERS_TOTAL if DEAD_LETTER_FAMILY in families else None
        chunks = []
        for text in parts(queues, series, dead):
            if text:
                chunks.append(text.encode())
            await slicer.pause()
        chunks.append(
            _latest(BrokerCollector(self.core, self.node, "detailed", families, vhosts, per_queue=False))
        )
        return self._streamed(chunks)


__all__ = ["FAMILIES", "KNOWN_FAMILIES", "BrokerCollector", "NodeInfo", "PrometheusServer"]
