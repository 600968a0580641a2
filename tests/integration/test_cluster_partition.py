"""A partition between a queue's owner and PostgreSQL (issue 32): node n1 reaches the
database through a proxy; the test severs n1's sessions there — PostgreSQL sees them
end at once (n1's advisory lock is free: the survivors may take its queues), while n1
hears nothing (its packets are swallowed, new connections hang) and can only learn of
it from its lease. n1 must stop delivering before another node starts delivering its
queue: no two owners ever deliver the same queue. And no confirmed message is lost.

Deliveries are recorded with the client's receive time: those of the consumer on n1
itself came from n1 (a consumer on n2 may be relayed from n1 through a third node
during the takeover, so its deliveries do not name their owner); the new owner serves
from the time its log says so, and n1 stopped at the time its log says it was fenced
(one machine, one clock). n1's last delivery and its stop must come before the new
owner serves. The consumers are slow (a backlog waits in n1's queue), so a node that
kept serving from memory after losing its session would still be delivering then.
"""

from __future__ import annotations

import datetime
import time

import pika
from cluster_clients import (
    Consumer,
    Delivery,
    Publisher,
    connector,
    unflagged_redeliveries,
    wait_consumed,
    wait_for,
)

QUEUE = "partitioned"
WORK = 0.05  # seconds a consumer spends on a message
BACKLOG = 80  # messages waiting in n1's queue at the cut: more than n1 delivers in its lease


def logged_at(log: str, *parts: str) -> float:
    """The wall-clock time (seconds) of the last log line holding every one of ``parts``
    (the server's format: ``2026-11-28 11:56:14,830 LEVEL name: message``, local time);
    AssertionError with the log's end when there is none."""
    lines = [line for line in log.splitlines() if line[:1].isdigit() and all(part in line for part in parts)]
    assert lines, f"no log line with {parts}: {log[-3000:]}"
    stamp = " ".join(lines[-1].split(" ", 2)[:2])
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_an_owner_cut_off_from_postgresql_stops_delivering_before_another_node_takes_over(cluster_of):
    wall = time.time() - time.monotonic()  # log times (the wall clock) to monotonic ones
    cluster = cluster_of(cuttable=("n1",))
    n1, n2, n3 = cluster["n1"], cluster["n2"], cluster["n3"]
    connection = pika.BlockingConnection(pika.URLParameters(n1.url))
    connection.channel().queue_declare(QUEUE, durable=True)
    connection.close()
    assert cluster.owner(QUEUE) == "n1"
    # slow consumers (about 40 messages a second together), prefetch 2: the client sees a
    # delivery at most one message's work after n1 sent it
    local = Consumer(connector(n1.amqp_port), QUEUE, prefetch=2, label="on-n1", work=WORK)
    remote = Consumer(connector(n2.amqp_port), QUEUE, prefetch=2, label="on-n2", work=WORK)
    publisher = Publisher(connector(n3.amqp_port), QUEUE, "p-", pause=0.002)
    for client in (local, remote, publisher):
        client.start()
    # both consumers served by n1, and a backlog in n1's queue
    def backlog() -> int:  # confirmed, not delivered yet: in n1's queue
        return len(publisher.confirmed) - len(local.deliveries) - len(remote.deliveries)

    wait_for(lambda: backlog() >= BACKLOG and local.deliveries and remote.deliveries, 20, "a backlog on n1")
    at_cut = backlog()
    old_subscriptions = {local: len(local.subscribed), remote: len(remote.subscribed)}
    assert old_subscriptions == {local: 1, remote: 1}, (local.cancels, remote.cancels)

    proxy = cluster.proxies["n1"]
    proxy.block("blackhole")  # n1's new sessions hang
    cut = time.monotonic()
    confirmed_at_cut = list(publisher.confirmed)
    assert proxy.sever() >= 1  # its sessions end in PostgreSQL; n1 hears nothing
    new_owner = cluster.wait_owner(QUEUE, lambda owner: owner not in (None, "n1"), 15)
    taken = time.monotonic()

    def after_cut() -> list[Delivery]:  # on subscriptions made after the cut
        return [
            d
            for consumer in (local, remote)
            for d in consumer.deliveries
            if d.subscription > old_subscriptions[consumer]
        ]

    wait_for(after_cut, 15, "deliveries again after the cut")
    new_log = cluster[new_owner].log
    wait_for(lambda: "of node n1: serving" in new_log(), 15, f"{new_owner} serving n1's queue")
    time.sleep(1.0)  # a node still serving would go on delivering meanwhile
    publisher.stop()
    # n1's deliveries: those to the consumer on n1 itself (a consumer on another node may
    # be relayed from n1 through a third node, so its deliveries do not name their owner);
    # the new owner's service: from the moment its log says it serves the queue
    from_n1 = [d for d in local.deliveries if d.subscription == 1]
    from_new = after_cut()
    last_old = max(d.time for d in from_n1)
    serving = logged_at(new_log(), "took over ", "of node n1: serving") - wall
    fenced = logged_at(n1.log(), "fenced: node n1") - wall
    print(
        f"backlog {at_cut} at the cut (0): {new_owner} owns the queue at {taken - cut:.2f} s; n1's last "
        f"delivery at {last_old - cut:.2f} s, n1 fenced at {fenced - cut:.2f} s, {new_owner} serving at "
        f"{serving - cut:.2f} s, first delivery on a new subscription at "
        f"{min(d.time for d in from_new) - cut:.2f} s"
    )
    since = f"{new_owner} served from {serving - cut:.2f} s"
    assert last_old < serving, f"n1 delivered until {last_old - cut:.2f} s after the cut, {since}"
    assert fenced < serving, f"n1 stopped at {fenced - cut:.2f} s after the cut, {since}"
    assert remote.cancels + remote.reconnects >= 1  # n2's consumer was told the owner went
    for consumer in (local, remote):
        consumer.work = 0.0  # the backlog now, fast

    confirmed = set(publisher.confirmed)

    def explain(missing: set[str]) -> str:
        number = lambda body: int(body.split("-")[1])  # noqa: E731
        return (
            f"n1 delivered up to {max(number(d.body) for d in from_n1)}, {len(confirmed_at_cut)} were "
            f"confirmed at the cut; on new subscriptions from {min(number(d.body) for d in from_new)}; "
            f"{len(missing & set(confirmed_at_cut))} missing were confirmed before the cut\n"
            + cluster.report(QUEUE, missing)
        )

    wait_consumed(confirmed, [local, remote], 20, explain=explain)
    for consumer in (local, remote):
        consumer.stop()
    unflagged = unflagged_redeliveries(local.deliveries + remote.deliveries)
    print(f"{len(unflagged)} delivered by n1 came again from {new_owner} without the redelivered flag")
    # n1 stopped serving its queues for good (it is fenced: no session, no lease)
    assert cluster.owner(QUEUE) == new_owner
