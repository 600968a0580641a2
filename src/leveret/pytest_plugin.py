"""pytest plugin: the ``leveret_broker`` fixture, a real broker for your test suite.

Installed with leveret (entry point ``pytest11``); no docker, Erlang or JVM::

    def test_publish(leveret_broker):
        conn = pika.BlockingConnection(pika.URLParameters(leveret_broker.amqp_url))

Each test gets a fresh in-process broker on free loopback ports
(:class:`leveret.BlockingBroker`): ``amqp_url`` for AMQP clients, ``stomp_url``
(``stomp://127.0.0.1:PORT``) for STOMP ones; it is stopped after the test.

pytest-rabbitmq's fixtures (``rabbitmq_proc``, ``rabbitmq``) on leveret are opt-in:
``--leveret-rabbitmq``, ini ``leveret_rabbitmq = true`` or ``LEVERET_RABBITMQ=1``
register :mod:`leveret.testing.rabbitmq.plugin`; switched off (the default) nothing
named like pytest-rabbitmq's fixtures is defined, so pytest-rabbitmq, when installed,
keeps its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .server.broker import BlockingBroker

#: Values of ``LEVERET_RABBITMQ`` that switch the pytest-rabbitmq fixtures on.
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


@pytest.fixture
def leveret_broker() -> Iterator[BlockingBroker]:
    """A broker for one test, without a data directory (nothing is kept on disk)."""
    with BlockingBroker(amqp_port=0, stomp_port=0) as broker:
        yield broker


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """The switch of the pytest-rabbitmq fixtures, and pytest-rabbitmq's own settings
    when that package is absent."""
    from .testing.rabbitmq.config import add_options

    help_text = "rabbitmq_proc and rabbitmq fixtures (pytest-rabbitmq's) backed by leveret"
    parser.getgroup("leveret").addoption("--leveret-rabbitmq", action="store_true", help=help_text)
    parser.addini("leveret_rabbitmq", help_text, type="bool", default=False)
    add_options(parser, pluginmanager)


def rabbitmq_switch(config: pytest.Config) -> bool:
    """Whether the pytest-rabbitmq fixtures on leveret are on: the command-line flag,
    the ``LEVERET_RABBITMQ`` environment variable or the ``leveret_rabbitmq`` ini."""
    if config.getoption("leveret_rabbitmq", default=False):
        return True
    if os.environ.get("LEVERET_RABBITMQ", "").strip().lower() in TRUE_WORDS:
        return True
    return bool(config.getini("leveret_rabbitmq"))


def pytest_configure(config: pytest.Config) -> None:
    """Register the pytest-rabbitmq fixtures when switched on; registered after the
    installed plugins, they win over pytest-rabbitmq's of the same names."""
    if rabbitmq_switch(config):
        from .testing.rabbitmq import plugin

        if not config.pluginmanager.is_registered(plugin):
            config.pluginmanager.register(plugin, "leveret.testing.rabbitmq.plugin")
