"""Publishing to a queue whose new owner is still in its grace (issue 32; RULES32 §2
and §7): a survivor that took a dead node's queue waits GRACE before it serves it. A
publish made meanwhile on a third node is forwarded to the new owner, which does not
hold the real queue yet: the publisher must get a negative confirm (it sends the
message again), never a positive one for a message that is not kept — every message
confirmed in the grace is consumed once the new owner serves the queue.

The focused form of what the kill -9 rounds and the partition test see when the
publisher is not on the node that takes the queue over.
"""

from __future__ import annotations

import time

import pika
import pika.exceptions
from cluster_clients import PERSISTENT, Consumer, connector, wait_consumed

QUEUE = "graced"
GRACE = 4.0  # seconds: a wide window to publish in


def test_a_publish_in_the_new_owners_grace_is_confirmed_only_if_the_message_is_kept(cluster_of):
    cluster = cluster_of(grace=GRACE)
    connection = pika.BlockingConnection(pika.URLParameters(cluster["n1"].url))
    channel = connection.channel()
    channel.queue_declare(QUEUE, durable=True)
    channel.confirm_delivery()
    before = [f"before-{i}" for i in range(10)]
    for body in before:
        channel.basic_publish("", QUEUE, body.encode(), PERSISTENT, mandatory=True)
    connection.close()

    killed = time.monotonic()
    cluster["n1"].kill()
    new_owner = cluster.wait_owner(QUEUE, lambda owner: owner not in (None, "n1"), 10)
    (publishing,) = cluster.others("n1", new_owner)
    connection = pika.BlockingConnection(pika.URLParameters(publishing.url))
    channel = connection.channel()
    channel.confirm_delivery()
    confirmed: list[str] = []
    nacked = returned = 0
    number = 0
    while time.monotonic() - killed < GRACE - 1.0:  # the new owner does not serve yet
        body = f"grace-{number}"
        number += 1
        try:
            channel.basic_publish("", QUEUE, body.encode(), PERSISTENT, mandatory=True)
            confirmed.append(body)
        except pika.exceptions.NackError:
            nacked += 1
        except pika.exceptions.UnroutableError:
            returned += 1
        time.sleep(0.05)
    connection.close()

    print(
        f"in {new_owner}'s grace, publishing on {publishing.name}: {len(confirmed)} confirmed, "
        f"{nacked} nacked, {returned} returned"
    )
    # the new owner serves after its grace: a consumer there (subscribing again while it
    # is cancelled) gets every message stored by n1 and every one confirmed meanwhile
    consumer = Consumer(connector(cluster[new_owner].amqp_port), QUEUE, label=f"on-{new_owner}")
    consumer.start()
    try:
        wait_consumed(
            set(before + confirmed),
            [consumer],
            GRACE + 10,
            f"confirmed during {new_owner}'s grace on {publishing.name} ({nacked} nacked): ",
            lambda missing: cluster.report(QUEUE, missing),
        )
    finally:
        consumer.stop()
