"""ActiveMQ's advisory topics: the broker says what happens to it on topics named
``ActiveMQ.Advisory.*``, which any client subscribes to (STOMP ``/topic/...``, AMQP
bindings on ``amq.topic``).

=============================================  ==========================================
topic (routing key on ``amq.topic``)           when
=============================================  ==========================================
``ActiveMQ.Advisory.Connection``               a client connects or disconnects
``ActiveMQ.Advisory.Queue``                    a queue is created or deleted
``ActiveMQ.Advisory.Consumer.Queue.<name>``    a consumer starts or stops on the queue
``ActiveMQ.Advisory.Expired.Queue.<name>``     a message expires in the queue
``ActiveMQ.Advisory.MessageDLQd.Queue.<name>`` a message of the queue is dead-lettered
=============================================  ==========================================

The body is JSON (ActiveMQ sends its Java data structures, as JSON over STOMP with
``transformation:jms-advisory-json``): ``type`` (``ConnectionInfo``, ``DestinationInfo``,
``ConsumerInfo``, ``Message``), ``event`` (``added`` or ``removed``, or the reason) and
the details. The message is published only when something is bound to ``amq.topic``,
so a broker nobody watches pays a dictionary lookup. The queues and consumers of topic
subscriptions (server-named ``amq.gen-`` queues) are not advised, as ActiveMQ does not
advise its advisory consumers.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .message import Message, Properties

if TYPE_CHECKING:
    from .router import Router

PREFIX = "ActiveMQ.Advisory."
TOPIC_EXCHANGE = "amq.topic"


def advise(vhost: Router, topic: str, info: dict[str, Any]) -> None:
    """Publish advisory ``info`` (JSON) to ``ActiveMQ.Advisory.<topic>`` in ``vhost``."""
    exchange = vhost.exchanges.get(TOPIC_EXCHANGE)
    if exchange is None or not exchange.bindings:
        return
    message = Message.build(
        TOPIC_EXCHANGE,
        PREFIX + topic,
        json.dumps(info, default=str).encode(),
        Properties(content_type="application/json", type="Advisory"),
    )
    for queue in vhost.route(exchange, message):
        queue.enqueue(message)
    if vhost.actions:
        vhost.carry_out()


def advised(queue_name: str) -> bool:
    """Whether a queue's life is advised (not a topic subscription's own queue)."""
    return not queue_name.startswith("amq.gen-")


def listened(vhost: Router) -> bool:
    """Whether anything is bound to the advisory exchange of ``vhost`` (else
    :func:`advise` sends nothing, and what it would say need not be worked out)."""
    exchange = vhost.exchanges.get(TOPIC_EXCHANGE)
    return exchange is not None and bool(exchange.bindings)


def connection_event(
    vhost: Router, event: str, connection: str, user: str, protocol: str, client_id: str | None = None
) -> None:
    """A client connected (``added``) or went away (``removed``); ``connection`` is
    its name (the peer's address and port)."""
    advise(
        vhost,
        "Connection",
        {
            "type": "ConnectionInfo",
            "event": event,
            "connectionId": connection,
            "clientId": client_id or "",
            "userName": user,
            "protocol": protocol,
        },
    )


def queue_event(vhost: Router, name: str, event: str) -> None:
    """A queue was created (``added``) or deleted (``removed``)."""
    if advised(name):
        advise(vhost, "Queue", {"type": "DestinationInfo", "event": event, "destination": "/queue/" + name})


def consumer_event(vhost: Router, queue: str, consumer: str, event: str) -> None:
    """Consumer ``consumer`` (its tag) started (``added``) or stopped on ``queue``."""
    if advised(queue):
        advise(
            vhost,
            "Consumer.Queue." + queue,
            {
                "type": "ConsumerInfo",
                "event": event,
                "destination": "/queue/" + queue,
                "consumerId": consumer,
            },
        )


def message_event(vhost: Router, topic: str, queue: str, message: Message, reason: str) -> None:
    """A message of ``queue`` expired (``topic`` ``Expired``) or was dead-lettered
    (``MessageDLQd``). Nothing is decoded when no one listens: every expiry of a TTL
    queue (kombu's native delayed delivery: one per level a task waits in) comes here."""
    if advised(queue) and listened(vhost):
        advise(
            vhost,
            f"{topic}.Queue.{queue}",
            {
                "type": "Message",
                "event": reason,
                "destination": "/queue/" + queue,
                "messageId": message.properties.message_id or "",
            },
        )
