"""kill -9 of a queue's owner node under confirmed load, 10 rounds (issue 32): three
active nodes; each round a publisher with confirms on one survivor-to-be and a consumer
on the other, the owner killed once a third of the round's messages are confirmed.
Every confirmed message must be consumed afterwards (at least once: a redelivery after
the takeover carries the redelivered flag), and a survivor must deliver within 15 s of
the kill. The killed node is started again each round (it comes back owning nothing).

Takeover time: from the kill to the first delivery the consumer gets from the queue's
new owner (on a subscription made after the broker cancelled the old one). ``pytest
-s`` prints p50 and max over the rounds.
"""

from __future__ import annotations

import time

import pika
from cluster_clients import Consumer, Publisher, connector, percentile, unflagged_redeliveries, wait_for
from cluster_nodes import cluster_of  # noqa: F401 (fixture)

ROUNDS = 10
PER_ROUND = 240  # confirmed messages per round
BEFORE_KILL = PER_ROUND // 3
TAKEOVER_LIMIT = 15.0  # seconds
QUEUE = "orders"


def test_kill_9_of_the_owner_10_rounds_loses_no_confirmed_message(cluster_of):
    cluster = cluster_of()
    connection = pika.BlockingConnection(pika.URLParameters(cluster["n1"].url))
    connection.channel().queue_declare(QUEUE, durable=True)
    connection.close()
    takeovers: list[float] = []
    confirmed: set[str] = set()
    received: set[str] = set()
    for round_number in range(ROUNDS):
        owner = cluster.owner(QUEUE)
        assert owner is not None
        victim = cluster[owner]
        publishing, consuming = cluster.others(owner)
        consumer = Consumer(connector(consuming.amqp_port), QUEUE, prefetch=50, label=f"r{round_number}")
        publisher = Publisher(connector(publishing.amqp_port), QUEUE, f"r{round_number}-", limit=PER_ROUND)
        consumer.start()
        publisher.start()
        wait_for(
            lambda: len(publisher.confirmed) >= BEFORE_KILL and consumer.deliveries,
            15,
            f"round {round_number}: {BEFORE_KILL} confirmed before the kill ({len(publisher.confirmed)})",
        )
        subscription = len(consumer.subscribed)
        killed = time.monotonic()
        victim.kill()

        def from_survivor():
            after = [d for d in consumer.deliveries if d.subscription > subscription and d.time > killed]
            return after[0] if after else None

        wait_for(from_survivor, TAKEOVER_LIMIT + 5, f"round {round_number}: a delivery from a survivor")
        first = from_survivor()
        assert first is not None
        takeovers.append(first.time - killed)
        victim.start()  # meanwhile: the round's publishing goes on with a survivor
        publisher.join(30)
        publisher.stop()
        mine = set(publisher.confirmed)
        assert len(mine) == PER_ROUND
        wait_for(lambda: mine <= consumer.bodies(), 20, f"round {round_number}: every confirmed message consumed")
        consumer.stop()
        assert not unflagged_redeliveries(consumer.deliveries), f"round {round_number}: redelivered without the flag"
        new_owner = cluster.owner(QUEUE)
        assert new_owner not in (None, owner), f"round {round_number}: owner still {new_owner}"
        confirmed |= mine
        received |= consumer.bodies()
        victim.wait_ready()
        print(
            f"round {round_number}: {owner} killed, {new_owner} took over, first delivery after "
            f"{takeovers[-1]:.2f} s; publisher nacks {publisher.nacks} returns {publisher.returns} "
            f"reconnects {publisher.reconnects}; consumer cancels {consumer.cancels} "
            f"reconnects {consumer.reconnects} duplicates {len(consumer.deliveries) - len(consumer.bodies())}"
        )
    lost = confirmed - received
    assert not lost, f"{len(lost)} confirmed messages lost: {sorted(lost)[:10]}"
    print(
        f"takeover over {ROUNDS} rounds: p50 {percentile(takeovers, 0.5):.2f} s, max {max(takeovers):.2f} s"
    )
    assert max(takeovers) < TAKEOVER_LIMIT
