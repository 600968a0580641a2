"""A rolling restart of a three-node cluster behind a load balancer (issue 32): a
publisher with confirms and a consumer acking connect through a round-robin TCP
balancer (HAProxy's place) and reconnect when their connection drops, as a real
application does; each node in turn is stopped (SIGTERM: it leaves cleanly, handing
its queues over) and started again. Afterwards every confirmed message was consumed.
"""

from __future__ import annotations

import time

from cluster_clients import Consumer, Publisher, connector, wait_consumed, wait_for
from tcp_balancer import RoundRobin

QUEUE = "rolling"
STEP = 60  # confirmed messages between two restarts


def test_a_rolling_restart_behind_a_balancer_loses_no_confirmed_message(cluster_of):
    cluster = cluster_of()
    with RoundRobin([node.amqp_port for node in cluster]) as balancer:
        publisher = Publisher(connector(balancer.port), QUEUE, "roll-", pause=0.003)
        consumer = Consumer(connector(balancer.port), QUEUE, prefetch=20, label="through-balancer")
        publisher.start()
        wait_for(lambda: len(publisher.confirmed) >= STEP, 15, "the publisher under way (declared the queue)")
        consumer.start()
        for node in cluster:
            owner = cluster.owner(QUEUE)
            consumed = len(consumer.deliveries)
            began = time.monotonic()
            status = node.terminate()
            assert status == 0, f"{node.name} exited with {status}: {node.log()[-2000:]}"
            stopped = time.monotonic()
            node.start().wait_ready()
            ready = time.monotonic()
            confirmed = len(publisher.confirmed)
            wait_for(
                lambda n=confirmed: len(publisher.confirmed) >= n + STEP,
                20,
                f"publishing after {node.name} restarted (owner was {owner})",
            )
            wait_for(
                lambda n=consumed: len(consumer.deliveries) > n, 10, f"consuming after {node.name} restarted"
            )
            print(
                f"{node.name} stopped in {stopped - began:.2f} s, ready {ready - stopped:.2f} s later, "
                f"clients going on {time.monotonic() - ready:.2f} s later "
                f"(owner {owner} -> {cluster.owner(QUEUE)}): "
                f"{len(publisher.confirmed)} confirmed, {len(consumer.bodies())} consumed; "
                f"publisher reconnects {publisher.reconnects} nacks {publisher.nacks} "
                f"returns {publisher.returns}; consumer reconnects "
                f"{consumer.reconnects} cancels {consumer.cancels}"
            )
        publisher.stop()
        confirmed_bodies = set(publisher.confirmed)
        wait_consumed(confirmed_bodies, [consumer], 20, explain=lambda lost: cluster.report(QUEUE, lost))
        consumer.stop()
    assert len(confirmed_bodies) >= 4 * STEP
    assert cluster.live() == {"n1", "n2", "n3"}
