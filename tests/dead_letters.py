"""Dead letters for the tests of the dead-letter console (its API and its pages)."""

from __future__ import annotations

import pika
from eventually import eventually


def dead_letters(channel) -> None:
    """orders and payments dead-letter through a fanout DLX into ``dlq``: two orders
    rejected, one payment rejected, one order expired (in that order)."""
    channel.exchange_declare("dlx", "fanout")
    channel.queue_declare("dlq")
    channel.queue_bind("dlq", "dlx")
    channel.queue_declare("orders", arguments={"x-dead-letter-exchange": "dlx"})
    channel.queue_declare("payments", arguments={"x-dead-letter-exchange": "dlx"})
    bodies = [
        ("orders", b'{"order": 1, "sku": "red"}', {"tenant": "acme"}),
        ("orders", b"plain text order 2", {"tenant": "globex"}),
        ("payments", bytes([0, 159, 146, 150]), {"tenant": "acme"}),
    ]
    for queue, body, headers in bodies:
        channel.basic_publish("", queue, body, pika.BasicProperties(headers=headers))
        method, _, _ = channel.basic_get(queue)
        channel.basic_reject(method.delivery_tag, requeue=False)
    channel.basic_publish("", "orders", b"expires", pika.BasicProperties(expiration="1"))

    def all_arrived() -> bool:
        channel.queue_declare("orders", passive=True)  # lets an expiry be noticed
        return channel.queue_declare("dlq", passive=True).method.message_count >= 4

    eventually(all_arrived)
