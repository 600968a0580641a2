"""The broker a task framework's test talks to: a fresh in-process leveret, or one private
RabbitMQ 3.10 node for the session (bench/brokers.py; skipped when rabbitmq-server is
not installed), so each framework test also shows that the test itself is right.

Import the fixtures into a test module::

    from framework_brokers import _amqp_broker, _framework_rabbitmq  # noqa: F401 (fixtures)

(the fixtures are named ``amqp_broker`` and ``framework_rabbitmq``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pytest
from servers import TEST_WORKERS
from targets import RabbitMQ, rabbitmq_installed

from leveret import BlockingBroker


@dataclass
class AmqpBroker:
    """A broker as a framework sees it: its AMQP URL (vhost ``/``, guest/guest)."""

    name: str  # "leveret" or "rabbitmq"
    url: str
    #: the ``x-delayed-message`` exchange type: built into leveret; RabbitMQ 3.10 here has
    #: no rabbitmq_delayed_message_exchange plugin
    delayed_exchange: bool

    def require_delayed_exchange(self) -> None:
        if not self.delayed_exchange:
            pytest.skip(f"{self.name} has no x-delayed-message exchange (its plugin is not shipped)")

    def message_count(self, queue: str) -> int:
        """Ready messages in ``queue`` (a passive queue.declare, as a client asks)."""
        with pika.BlockingConnection(pika.URLParameters(self.url)) as connection:
            return connection.channel().queue_declare(queue, passive=True).method.message_count

    def delete_queues(self, *names: str) -> None:
        """Delete queues a test made on the shared RabbitMQ node (missing ones ignored)."""
        with pika.BlockingConnection(pika.URLParameters(self.url)) as connection:
            for name in names:
                channel = connection.channel()
                try:
                    channel.queue_delete(name)
                except pika.exceptions.ChannelClosedByBroker:
                    pass


_node: RabbitMQ | None = None


@pytest.fixture(scope="session", name="framework_rabbitmq")
def _framework_rabbitmq(request) -> RabbitMQ:
    """One private RabbitMQ node (no plugins) for the session's framework tests: the
    modules that import this fixture share it (stopped when the session ends)."""
    global _node
    if not rabbitmq_installed():
        pytest.skip("rabbitmq-server is not installed: only leveret is checked")
    if _node is None:
        node = RabbitMQ()
        node.start()
        request.config.add_cleanup(node.stop)
        _node = node
    return _node


@pytest.fixture(params=["leveret", "rabbitmq"], name="amqp_broker")
def _amqp_broker(request) -> Iterator[AmqpBroker]:
    """A fresh leveret for the test, or the session's RabbitMQ node."""
    if request.param == "rabbitmq":
        node = request.getfixturevalue("framework_rabbitmq")
        yield AmqpBroker("rabbitmq", f"amqp://guest:guest@127.0.0.1:{node.port}/%2F", False)
        return
    with BlockingBroker(amqp_port=0, workers=TEST_WORKERS) as broker:
        yield AmqpBroker("leveret", f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/%2F", True)


def unique(prefix: str) -> str:
    """A name no other test uses (the RabbitMQ node is shared by the session)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_for(condition: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``condition`` every 20 ms until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.02)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run an async test body in its own event loop; fail it after 20 seconds."""
    asyncio.run(asyncio.wait_for(test(), timeout=20))


async def until(condition: Callable[[], object], timeout: float = 5.0, what: str = "condition") -> None:
    """Yield to the loop every 10 ms until ``condition`` holds; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        await asyncio.sleep(0.01)


def close_celery_client(app: Any) -> None:
    """Close a celery app's own broker connections (producer pool, rpc:// result
    consumer), so the broker does not wait for them when it stops."""
    consumer = getattr(app.backend, "result_consumer", None)
    if consumer is not None and consumer._connection is not None:
        consumer.stop()
        consumer._connection.close()
    app.pool.force_close_all()
    app.close()


__all__ = ["AmqpBroker", "_amqp_broker", "_framework_rabbitmq", "close_celery_client", "run", "unique",
           "until", "wait_for"]
