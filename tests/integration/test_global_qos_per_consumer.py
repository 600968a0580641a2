"""basic.qos global=true on queues without a channel-wide window (quorum, stream).

RabbitMQ 3.10-4.2 close the channel with 540 on basic.consume (test_quorum_queues.py
checks that, with leveret's ``global_qos = "refuse"``); leveret's default,
``"per_consumer"``, applies the channel's prefetch to each such consumer on its own, so
old kombu/celery (global QoS by default) work on quorum queues unchanged.
"""

from __future__ import annotations

import time

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker

from leveret.config import ConfigError, load
from leveret.server.broker import BlockingBroker

QUORUM = {"x-queue-type": "quorum"}
STREAM = {"x-queue-type": "stream"}


@pytest.fixture
def broker():
    with BlockingBroker(amqp_port=0) as broker:
        yield broker


def _settle(connection: pika.BlockingConnection, tags: list, count: int) -> None:
    """Pump until ``count`` deliveries came (5 s at most), then a little longer: anything
    past the prefetch window would come now."""
    deadline = time.monotonic() + 5
    while len(tags) < count and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    connection.process_data_events(time_limit=0.3)


@pytest.mark.parametrize("arguments", [QUORUM, STREAM], ids=["quorum", "stream"])
def test_a_global_prefetch_is_each_consumers_own_by_default(broker, arguments):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.queue_declare("q", durable=True, arguments=arguments)
    for i in range(10):
        channel.basic_publish("", "q", str(i).encode())
    channel.basic_qos(prefetch_count=3, global_qos=True)
    tags: list = []
    channel.basic_consume("q", lambda ch, method, props, body: tags.append(method.delivery_tag),
                          arguments={"x-stream-offset": "first"} if arguments is STREAM else None)
    _settle(connection, tags, 3)
    assert len(tags) == 3  # the channel's prefetch held this consumer
    channel.basic_ack(tags[-1], multiple=True)
    _settle(connection, tags, 6)
    assert len(tags) == 6
    connection.close()


def test_a_global_prefetch_on_a_quorum_queue_is_refused_when_configured(broker):
    broker.core.limits.global_qos = "refuse"
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.queue_declare("qq", durable=True, arguments=QUORUM)
    channel.basic_qos(prefetch_count=3, global_qos=True)
    with pytest.raises(ConnectionClosedByBroker) as closed:
        channel.basic_consume("qq", lambda *a: None)
    assert closed.value.reply_code == 540
    assert "queue 'qq' in vhost '/' does not support global qos" in closed.value.reply_text


def test_classic_queues_keep_the_channel_wide_window(broker):
    """A classic queue's consumers still share the channel's window (two consumers,
    three messages in flight between them)."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    for queue in ("a", "b"):
        channel.queue_declare(queue)
        for i in range(5):
            channel.basic_publish("", queue, str(i).encode())
    channel.basic_qos(prefetch_count=3, global_qos=True)
    tags: list = []
    for queue in ("a", "b"):
        channel.basic_consume(queue, lambda ch, method, props, body: tags.append(method.delivery_tag))
    _settle(connection, tags, 3)
    assert len(tags) == 3
    connection.close()


def test_the_config_file_takes_only_the_two_modes(tmp_path):
    path = tmp_path / "leveret.toml"
    path.write_text('[server]\nglobal_qos = "refuse"\n')
    assert load(path).limits.global_qos == "refuse"
    path.write_text('[server]\nglobal_qos = "sometimes"\n')
    with pytest.raises(ConfigError, match="global_qos must be one of per_consumer, refuse"):
        load(path)
