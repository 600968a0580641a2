"""No confirmed message is lost while a queue changes owner (docs/cluster.md): three
node processes on a real PostgreSQL, publishers with confirms (pika) on the two nodes
that do not own a durable queue publish persistent messages without pause, sending a
nacked message again; meanwhile the owner is killed (kill -9: a takeover), stopped
(SIGTERM: a handover), or the queue is moved back and forth (``leveret ctl
move_queue``). Afterwards every confirmed message is in the queue (counted by unique
body). One more test, in process (tests/cluster_pair.py), checks the owner side's rule
alone: a forwarded publish reaching a queue in transition is nacked as a whole.

The window: a node that forwards a publish to the owner it knows may be ahead of the
owner's own view (a survivor restoring a dead node's queue after GRACE, an old owner
that just moved the queue away); a forwarded publish skips the other nodes' queues, so
before the fix the owner-to-be confirmed such messages without storing them."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pika
import pika.exceptions
import pytest
from cluster_nodes import ClusterNode, owner, start_nodes
from cluster_pair import Pair
from eventually import eventually
from targets import unique

pytest.importorskip("leveret.cluster.node")
from leveret.cluster.restore import make_remote

QUEUE = "window"
CLIENT_ERRORS = (pika.exceptions.AMQPError, OSError)


@pytest.fixture
def cluster_name() -> str:
    return unique("window").replace("-", "_")


@pytest.fixture
def nodes(postgres, tmp_path, cluster_name):
    started = start_nodes(tmp_path, postgres.url, cluster_name, 3)
    try:
        yield started
    finally:
        for node in started:
            node.kill()


class Publisher(threading.Thread):
    """Publishes persistent messages ``<prefix>-<n>`` to :data:`QUEUE` on ``node`` with
    confirms until :meth:`finish`; a nacked (or unconfirmed: the connection failed)
    message is sent again under the same body. ``confirmed``: bodies confirmed."""

    def __init__(self, node: ClusterNode, prefix: str) -> None:
        super().__init__(daemon=True)
        self.node, self.prefix = node, prefix
        self.confirmed: set[str] = set()
        self.nacked = 0
        self.errors: list[str] = []
        self._finished = threading.Event()

    def finish(self) -> None:
        self._finished.set()
        self.join(20)

    def run(self) -> None:
        number = 0
        channel = None
        while not self._finished.is_set():
            body = f"{self.prefix}-{number}"
            try:
                if channel is None:
                    connection = pika.BlockingConnection(pika.URLParameters(self.node.url))
                    channel = connection.channel()
                    channel.confirm_delivery()
                channel.basic_publish("", QUEUE, body.encode(), pika.BasicProperties(delivery_mode=2))
            except pika.exceptions.NackError:
                self.nacked += 1
                time.sleep(0.01)
                continue
            except CLIENT_ERRORS as exc:  # (closed: open again, send the same body again)
                self.errors.append(repr(exc))
                channel = None
                time.sleep(0.05)
                continue
            self.confirmed.add(body)
            number += 1


def drain(node: ClusterNode) -> list[str] | None:
    """Every message of :data:`QUEUE`, consumed on ``node`` (auto-ack) until none
    came for a second; None while the node cannot serve it."""
    try:
        with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
            channel = connection.channel()
            found: list[str] = []
            for method, _, body in channel.consume(QUEUE, auto_ack=True, inactivity_timeout=1.0):
                if method is None:
                    break
                found.append(body.decode())
            return found
    except CLIENT_ERRORS:
        return None


def declare(node: ClusterNode) -> None:
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        connection.channel().queue_declare(QUEUE, durable=True)


def publishing(nodes: list[ClusterNode]) -> list[Publisher]:
    publishers = [Publisher(node, node.name) for node in nodes]
    for publisher in publishers:
        publisher.start()
    assert eventually(lambda: all(len(p.confirmed) > 20 for p in publishers), 10)
    return publishers


def check(publishers: list[Publisher], consumed: list[str] | None) -> None:
    """Every confirmed message was consumed."""
    for publisher in publishers:
        publisher.finish()
    assert consumed is not None
    confirmed = set().union(*(p.confirmed for p in publishers))
    missing = confirmed - set(consumed)
    nacked = sum(p.nacked for p in publishers)
    assert not missing, (
        f"{len(missing)} of {len(confirmed)} confirmed messages lost ({nacked} nacks): {sorted(missing)[:10]}"
    )


def test_a_takeover_under_confirmed_load_loses_no_confirmed_message(nodes, postgres, cluster_name):
    n1, n2, n3 = nodes
    declare(n1)
    assert owner(postgres, cluster_name, QUEUE) == "n1"
    publishers = publishing([n2, n3])
    n1.kill()
    # the takeover: GRACE (1.5 s) after the lock is taken, the queue serves on n2 or n3
    assert eventually(lambda: owner(postgres, cluster_name, QUEUE) in ("n2", "n3"), 10)
    new = n2 if owner(postgres, cluster_name, QUEUE) == "n2" else n3
    assert eventually(lambda: "took over 1 queues of node n1" in new.log(), 10), new.log()[-3000:]
    time.sleep(0.5)  # publishing on, to the new owner
    for publisher in publishers:
        publisher.finish()
    check(publishers, eventually(lambda: drain(new), 10))


def ctl(node: ClusterNode, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "leveret", "ctl", "--data-dir", str(node.dir / "data"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


def test_moving_a_queue_back_and_forth_under_confirmed_load_loses_no_confirmed_message(
    nodes, postgres, cluster_name
):
    n1, n2, n3 = nodes
    declare(n1)
    publishers = publishing([n2, n3])
    # run on the owner (n1 to n2), on the target (n2 to n1), on a third node (n1 to n2)
    for runs_on, target in ((n1, "n2"), (n1, "n1"), (n3, "n2")):
        moved = ctl(runs_on, "move_queue", "/", QUEUE, target)
        assert moved.returncode == 0, moved.stderr
        assert owner(postgres, cluster_name, QUEUE) == target
        time.sleep(0.3)  # publishing on, to the new owner
    for publisher in publishers:
        publisher.finish()
    time.sleep(0.5)  # the new owner restores the queue
    check(publishers, eventually(lambda: drain(n2), 10))


def test_a_graceful_stop_under_confirmed_load_loses_no_confirmed_message(nodes, postgres, cluster_name):
    n1, n2, n3 = nodes
    declare(n1)
    publishers = publishing([n2, n3])
    assert n1.terminate() == 0  # hands the queue to n2 or n3 at once
    new = n2 if owner(postgres, cluster_name, QUEUE) == "n2" else n3
    assert owner(postgres, cluster_name, QUEUE) == new.name
    time.sleep(0.5)  # publishing on, to the new owner
    for publisher in publishers:
        publisher.finish()
    check(publishers, eventually(lambda: drain(new), 10))


def test_a_forwarded_publish_reaching_a_queue_in_transition_is_nacked_as_a_whole(tmp_path):
    """In-process (tests/cluster_pair.py): on b, queue ``moving`` just moved away (a
    RemoteQueue in transition), ``stays`` is real; both bound to fanout ``x``. A publish
    on a is forwarded to b, which refuses it whole: a's publisher gets a basic.nack and
    ``stays`` gets nothing (the publisher sends it again). Out of transition, b skips
    ``moving`` as another node's queue and stores the message in ``stays``."""
    pair = Pair(tmp_path)
    try:
        pair.declare("moving", "b", "x", ("",), exchange_type="fanout")
        pair.declare("stays", "b", "x", ("",), exchange_type="fanout")
        b = pair.brokers["b"]

        def move_away() -> None:
            vhost = b.core.vhosts["/"]
            remote = make_remote(vhost, vhost.queues["moving"], "a", pair.peers["b"].link("a", "/"))
            remote.transition = True

        b.call(move_away)
        with pika.BlockingConnection(pika.URLParameters(pair.url("a"))) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            with pytest.raises(pika.exceptions.NackError):
                channel.basic_publish("x", "", b"m", pika.BasicProperties(delivery_mode=2))
            assert b.call(lambda: b.core.vhosts["/"].queues["stays"].message_count) == 0
            b.call(lambda: setattr(b.core.vhosts["/"].queues["moving"], "transition", False))
            channel.basic_publish("x", "", b"m", pika.BasicProperties(delivery_mode=2))
            assert b.call(lambda: b.core.vhosts["/"].queues["stays"].message_count) == 1
    finally:
        pair.close()
