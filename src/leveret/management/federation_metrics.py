"""Federation in the Prometheus metrics (:mod:`.metrics`), read from the links at each
scrape:

- ``rabbitmq_federation_links{status}``: links by state (``starting``, ``running``,
  ``error``, ``shutdown``; every state is listed, 0 included, so a dashboard's series
  never vanish). RabbitMQ 3.10's ``rabbitmq_prometheus`` has no federation metric; this
  is the gauge RabbitMQ 4's ``rabbitmq_federation_prometheus`` plugin adds, under its
  name and label;
- ``leveret_federation_messages_total{type}``: messages the links moved to this broker,
  by link type (``exchange``, ``queue``), summed over the links that exist now (a link
  removed with its policy takes its count with it). RabbitMQ has no such metric.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .federation import STATES, FederationLinks

LINK_TYPES = ("exchange", "queue")


class FederationCollector(Collector):
    """The federation families of ``federation``'s links."""

    def __init__(self, federation: FederationLinks) -> None:
        self.federation = federation

    def collect(self) -> Iterator[Metric]:
        links = self.federation.links()
        states = dict.fromkeys(STATES, 0)
        moved = dict.fromkeys(LINK_TYPES, 0)
        for link in links:
            states[link.state] = states.get(link.state, 0) + 1
            moved[link.kind] = moved.get(link.kind, 0) + getattr(link, "forwarded", 0)
        gauge = GaugeMetricFamily(
            "rabbitmq_federation_links", "Number of federation links", labels=["status"]
        )
        for state, count in states.items():
            gauge.add_metric([state], count)
        yield gauge
        counter = CounterMetricFamily(
            "leveret_federation_messages", "Messages federation links moved to this broker", labels=["type"]
        )
        for kind, count in moved.items():
            counter.add_metric([kind], count)
        yield counter
