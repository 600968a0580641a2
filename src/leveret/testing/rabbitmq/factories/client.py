"""``factories.rabbitmq``: pytest-rabbitmq's client fixture factory, on leveret.

The fixture yields what pytest-rabbitmq's does, a ``pika.BlockingConnection`` logged in
as guest/guest on vhost ``/``, and after the test removes every exchange and queue
of ``/`` except the default exchange and the ``amq.*`` ones (which cannot be
deleted: RabbitMQ answers 403 ACCESS_REFUSED).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from ..executor import LeveretExecutor

if TYPE_CHECKING:
    from pika import BlockingConnection

logger = logging.getLogger("leveret.testing.rabbitmq")


def connect(process: LeveretExecutor) -> BlockingConnection:
    """A pika connection to ``process`` as its user, on vhost ``/`` (needs pika)."""
    from pika import BlockingConnection, ConnectionParameters, PlainCredentials

    credentials = PlainCredentials(process.user, process.password)
    return BlockingConnection(
        ConnectionParameters(
            host=process.host, port=process.port, virtual_host=process.vhost, credentials=credentials
        )
    )


def clear_rabbitmq(process: LeveretExecutor, rabbitmq_connection: BlockingConnection) -> None:
    """Delete the exchanges, then the queues, of vhost ``/`` (not ``amq.*``).

    As pytest-rabbitmq's function of that name, through ``rabbitmq_connection``; unlike
    it, a closed connection (by the test, or by ``stopped()``) is replaced by a
    new one, and a deletion the broker
    refuses (405 RESOURCE_LOCKED: an exclusive queue of a connection still open)
    is logged and skipped instead of failing the teardown.
    """
    from pika.exceptions import AMQPConnectionError, ChannelClosed

    connection = rabbitmq_connection
    try:
        channel = connection.channel()
    except AMQPConnectionError:  # closed by the test, or by a broker restart
        connection = connect(process)
        channel = connection.channel()
    try:
        for kind, names in (("exchange", process.list_exchanges()), ("queue", process.list_queues())):
            for name in names:
                if name.startswith("amq."):
                    continue
                try:
                    if kind == "exchange":
                        channel.exchange_delete(name)
                    else:
                        channel.queue_delete(name)
                except ChannelClosed as error:
                    logger.warning("could not delete %s %r: %s", kind, name, error)
                    channel = connection.channel()
    finally:
        if connection is not rabbitmq_connection:
            connection.close()


def rabbitmq(
    process_fixture_name: str,
    teardown: Callable[[LeveretExecutor, BlockingConnection], None] = clear_rabbitmq,
) -> Callable[..., Iterator[BlockingConnection]]:
    """A function-scoped fixture yielding a ``pika.BlockingConnection`` to the broker
    of the process fixture named ``process_fixture_name``; after the test it calls
    ``teardown(process, connection)`` (default :func:`clear_rabbitmq`) and closes the
    connection. Same signature as pytest-rabbitmq's factory."""

    @pytest.fixture
    def rabbitmq_factory(request: pytest.FixtureRequest) -> Iterator[BlockingConnection]:
        from pika.exceptions import AMQPError

        process: LeveretExecutor = request.getfixturevalue(process_fixture_name)
        connection = connect(process)
        yield connection
        teardown(process, connection)
        try:
            if connection.is_open:
                connection.close()
        except AMQPError as error:  # pytest-rabbitmq logs it too
            logger.warning("error while closing the connection: %s", error)

    return rabbitmq_factory
