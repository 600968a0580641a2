"""A private RabbitMQ 3.10 node with the plugin exchange types it ships
(``rabbitmq_consistent_hash_exchange``, ``rabbitmq_random_exchange``), for the tests
that compare leveret's ``x-consistent-hash`` and ``x-random`` with the plugins'; see
:class:`brokers.RabbitMQ` for its isolation."""

from __future__ import annotations

from pathlib import Path

from brokers import RabbitMQ, rabbitmq_installed

PLUGINS = ("rabbitmq_consistent_hash_exchange", "rabbitmq_random_exchange")


class PluginExchangeRabbitMQ(RabbitMQ):
    """RabbitMQ with the consistent-hash and random exchange plugins enabled."""

    def _env(self) -> dict:
        env = super()._env()
        Path(self.workdir, "enabled_plugins").write_text(f"[{','.join(PLUGINS)}].\n")
        return env


__all__ = ["PluginExchangeRabbitMQ", "rabbitmq_installed"]
