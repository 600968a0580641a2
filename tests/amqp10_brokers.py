"""The AMQP 1.0 broker the AMQP 1.0 behaviour tests run against: leveret, and a private
RabbitMQ 3.10 node with its ``rabbitmq_amqp1_0`` plugin, so every expectation is checked
on a reference broker too (docs/amqp10.md, "Differences from RabbitMQ").

``AMQP10_BROKER`` picks them: ``leveret``, ``rabbitmq`` or ``leveret,rabbitmq`` (the
default: both, RabbitMQ skipped when ``rabbitmq-server`` is not installed).

Fixtures (imported by tests/conftest.py):

- ``amqp10_broker``: an :class:`Amqp10Broker`, parametrized by broker name. leveret is a
  fresh in-process ``BlockingBroker(amqp_port=0, stomp_port=0)`` per test, with
  ``LEVERET_TEST_WORKERS`` connection workers as the other tests (AMQP 1.0 is sniffed
  on its AMQP port, as RabbitMQ 4); RabbitMQ one node per session (tests keep apart by
  :func:`unique` names), with the AMQP 1.0 plugin on its AMQP port (as 3.10 does), STOMP
  on its own port and ``heartbeat = 1`` (seconds: the idle-time-out its open advertises
  is 1,000 ms) so the heartbeat tests need not wait a minute.

Addresses differ: leveret follows RabbitMQ 4's address v2 (``/queues/q``,
``/exchanges/x/key``), RabbitMQ 3.10 its v1 (``/amq/queue/q``, ``/exchange/x/key``):
tests build them with :meth:`Amqp10Broker.queue` and :meth:`Amqp10Broker.exchange`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from brokers import RabbitMQ, rabbitmq_installed

#: Which brokers the AMQP 1.0 tests run against (comma-separated).
BROKERS = [b.strip() for b in os.environ.get("AMQP10_BROKER", "leveret,rabbitmq").split(",") if b.strip()]
#: RabbitMQ's heartbeat (seconds), which its AMQP 1.0 open advertises as idle-time-out (1,000 ms).
RABBITMQ_HEARTBEAT = 1


def unique(prefix: str = "q") -> str:
    """A name no other test uses (queues, exchanges and container ids on a shared broker)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Amqp10Broker:
    """A broker as AMQP 1.0, AMQP 0-9-1 and STOMP clients see it."""

    name = ""
    user, password = "guest", "guest"

    def __init__(self, host: str, port: int, stomp_port: int) -> None:
        #: ``port``: AMQP 1.0 and AMQP 0-9-1 (the same listener on both brokers)
        self.host, self.port, self.stomp_port = host, port, stomp_port

    # -- URLs and addresses --------------------------------------------------------------

    def url(self, user: str | None = None, password: str | None = None) -> str:
        """``amqp://user:password@host:port`` for proton (PLAIN over SASL)."""
        user = self.user if user is None else user
        password = self.password if password is None else password
        quote = urllib.parse.quote
        return f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{self.host}:{self.port}"

    def anonymous_url(self) -> str:
        """``amqp://host:port``: proton then picks SASL ANONYMOUS."""
        return f"amqp://{self.host}:{self.port}"

    def queue(self, name: str) -> str:
        """The address of an existing queue, as a source or a target."""
        raise NotImplementedError

    def exchange(self, exchange: str, key: str) -> str:
        """The address of an exchange with a routing key, as a target."""
        raise NotImplementedError

    # -- other protocols -----------------------------------------------------------------

    def pika(self) -> pika.BlockingConnection:
        """An AMQP 0-9-1 connection (guest, vhost ``/``)."""
        return pika.BlockingConnection(
            pika.ConnectionParameters(
                self.host, self.port, "/", pika.PlainCredentials(self.user, self.password)
            )
        )

    def declare(self, name: str | None = None, **arguments: object) -> str:
        """Declare a classic queue (over AMQP 0-9-1, not durable) and return its name."""
        name = name or unique()
        with self.pika() as conn:
            conn.channel().queue_declare(name, arguments=dict(arguments) or None)
        return name

    def message_count(self, queue: str) -> int:
        """Ready messages of ``queue`` (a passive declare)."""
        with self.pika() as conn:
            return conn.channel().queue_declare(queue, passive=True).method.message_count

    def delete(self, queue: str) -> None:
        with self.pika() as conn:
            conn.channel().queue_delete(queue)


class LeveretAmqp10(Amqp10Broker):
    """leveret: RabbitMQ 4's address v2."""

    name = "leveret"

    def queue(self, name: str) -> str:
        return f"/queues/{urllib.parse.quote(name, safe='')}"

    def exchange(self, exchange: str, key: str) -> str:
        return f"/exchanges/{urllib.parse.quote(exchange, safe='')}/{urllib.parse.quote(key, safe='')}"


class RabbitMQ310Amqp10(Amqp10Broker):
    """RabbitMQ 3.10's rabbitmq_amqp1_0 plugin: v1 addresses (``/amq/queue/q`` for an
    existing queue, ``/exchange/x/key``)."""

    name = "rabbitmq"

    def queue(self, name: str) -> str:
        return f"/amq/queue/{name}"

    def exchange(self, exchange: str, key: str) -> str:
        return f"/exchange/{exchange}/{key}"


class _RabbitMQNode(RabbitMQ):
    """bench/brokers.py's private node, with ``rabbitmq_amqp1_0`` enabled beside STOMP and
    a short heartbeat."""

    def _env(self) -> dict:
        env = super()._env()
        Path(self.workdir, "enabled_plugins").write_text("[rabbitmq_stomp,rabbitmq_amqp1_0].\n")
        with open(Path(self.workdir, "rabbitmq.conf"), "a") as conf:
            conf.write(f"heartbeat = {RABBITMQ_HEARTBEAT}\n")
        return env


def leveret_has_amqp10() -> bool:
    """Whether this leveret has the AMQP 1.0 adapter."""
    return importlib.util.find_spec("leveret.protocol.amqp10.connection") is not None


@pytest.fixture(scope="session")
def _amqp10_rabbitmq() -> Iterator[RabbitMQ310Amqp10]:
    if not rabbitmq_installed():
        pytest.skip("rabbitmq-server is not installed: AMQP 1.0 tests run against leveret only")
    node = _RabbitMQNode(stomp=True)
    node.start()
    try:
        yield RabbitMQ310Amqp10(node.host, node.port, node.stomp_port)
    finally:
        node.stop()


@pytest.fixture(params=BROKERS)
def amqp10_broker(request: pytest.FixtureRequest) -> Iterator[Amqp10Broker]:
    """The test's AMQP 1.0 broker (see the module's docstring)."""
    if request.param == "rabbitmq":
        yield request.getfixturevalue("_amqp10_rabbitmq")
        return
    if request.param != "leveret":
        pytest.fail(f"AMQP10_BROKER={request.param!r}: expected 'leveret' and/or 'rabbitmq'")
    if not leveret_has_amqp10():
        pytest.skip("leveret has no AMQP 1.0 adapter yet (leveret.protocol.amqp10.connection)")
    from servers import TEST_WORKERS

    from leveret import BlockingBroker

    with BlockingBroker(amqp_port=0, stomp_port=0, workers=TEST_WORKERS) as broker:
        stomp_port = broker.broker.stomp_port
        assert stomp_port is not None
        yield LeveretAmqp10(broker.broker.host, broker.amqp_port, stomp_port)
