"""pytest plugin: the ``leveret_broker`` fixture, a real broker for your test suite.

Installed with leveret (entry point ``pytest11``); no docker, Erlang or JVM::

    def test_publish(leveret_broker):
        conn = pika.BlockingConnection(pika.URLParameters(leveret_broker.amqp_url))

Each test gets a fresh in-process broker on free loopback ports
(:class:`leveret.BlockingBroker`): ``amqp_url`` for AMQP clients, ``stomp_url``
(``stomp://127.0.0.1:PORT``) for STOMP ones; it is stopped after the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .server.broker import BlockingBroker


@pytest.fixture
def leveret_broker() -> Iterator[BlockingBroker]:
    """A broker for one test, without a data directory (nothing is kept on disk)."""
    with BlockingBroker(amqp_port=0, stomp_port=0) as broker:
        yield broker
