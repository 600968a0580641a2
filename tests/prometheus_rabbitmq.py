"""A private RabbitMQ 3.10 node with ``rabbitmq_prometheus`` (for tests that compare
leveret's Prometheus output with RabbitMQ's); see :class:`brokers.RabbitMQ`."""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

from brokers import RabbitMQ, free_port, rabbitmq_installed


class PrometheusRabbitMQ(RabbitMQ):
    """RabbitMQ with the ``rabbitmq_prometheus`` plugin on a free loopback port
    (``prometheus_port``), its other isolation as :class:`brokers.RabbitMQ`."""

    def __init__(self) -> None:
        super().__init__()
        self.prometheus_port = 0

    def prepare(self) -> None:
        super().prepare()
        self.prometheus_port = free_port()

    def _env(self) -> dict:
        env = super()._env()
        w = self.workdir
        Path(w, "enabled_plugins").write_text("[rabbitmq_prometheus].\n")
        with open(os.path.join(w, "rabbitmq.conf"), "a") as conf:
            conf.write(f"prometheus.tcp.port = {self.prometheus_port}\nprometheus.tcp.ip = 127.0.0.1\n")
        return env

    def scrape(self, path: str = "/metrics") -> str:
        """The text of one scrape of ``path``."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.prometheus_port}{path}", timeout=30) as reply:
            return reply.read().decode()

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Until the Prometheus endpoint answers."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.scrape()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


__all__ = ["PrometheusRabbitMQ", "rabbitmq_installed"]
