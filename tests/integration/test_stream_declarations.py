"""A stream queue refuses the arguments of other queue types in RabbitMQ 3.10's words
(406), checked against a RabbitMQ node when it is installed. Found through taskiq, whose
AioPikaBroker declares every queue, a stream too, with dead-letter arguments: RabbitMQ
refuses that declaration, leveret used to accept it."""

from __future__ import annotations

import pytest
from pika.exceptions import ChannelClosedByBroker
from targets import Target, unique

STREAM = {"x-queue-type": "stream"}

REFUSED = {
    "x-expires": 60_000,
    "x-message-ttl": 1_000,
    "x-max-priority": 5,
    "x-queue-mode": "lazy",
    "x-queue-version": 2,
    "x-queue-master-locator": "min-masters",
    "x-single-active-consumer": True,
    "x-dead-letter-exchange": "",
    "x-dead-letter-routing-key": "dead",
    "x-dead-letter-strategy": "at-most-once",
    "x-delivery-limit": 3,
    "x-max-length": 10,
    "x-overflow": "reject-publish",
    "x-quorum-initial-group-size": 1,
    "x-max-in-memory-length": 5,
    "x-max-in-memory-bytes": 5_000,
}


@pytest.mark.parametrize("argument", sorted(REFUSED))
def test_arguments_of_other_queue_types_are_refused(target: Target, argument: str):
    queue = unique("stream")
    with target.amqp() as connection:
        with pytest.raises(ChannelClosedByBroker) as refused:
            connection.channel().queue_declare(queue, durable=True,
                                               arguments={**STREAM, argument: REFUSED[argument]})
        assert (refused.value.reply_code, refused.value.reply_text) == (
            406, f"PRECONDITION_FAILED - invalid arg '{argument}' for queue '{queue}' in vhost '/' "
                 "of queue type rabbit_stream_queue")
        with pytest.raises(ChannelClosedByBroker) as missing:  # nothing was made
            connection.channel().queue_declare(queue, passive=True)
        assert missing.value.reply_code == 404


def test_retention_and_unknown_arguments_are_accepted(target: Target):
    queue = unique("stream")
    arguments = {**STREAM, "x-max-length-bytes": 1_000_000, "x-max-age": "1D",
                 "x-stream-max-segment-size-bytes": 500_000, "x-initial-cluster-size": 1,
                 "x-no-such-argument": "ignored"}
    with target.amqp() as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, arguments=arguments)
        channel.queue_delete(queue)
