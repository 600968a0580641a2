"""Publisher confirms of messages for queues of other nodes (cluster/confirms.py):

- a vhost created while the cluster runs is a cluster vhost like the others: a confirm
  on n1 for a message routed to a queue n2 owns in it waits for n2's commit, so a kill
  -9 of n2 right after the confirms loses none;
- a forward lost with its link before the end of its turn (the link could not even
  connect) is a negative confirm, never a positive one."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pika
import pika.exceptions
import pytest
from cluster_nodes import ClusterNode, owner, start_nodes
from cluster_pair import Pair
from eventually import eventually
from targets import unique

PERSISTENT = pika.BasicProperties(delivery_mode=2)
VHOST = "late"


@pytest.fixture
def nodes(postgres, tmp_path):
    cluster = unique("late").replace("-", "_")
    started = start_nodes(tmp_path, postgres.url, cluster, 2)
    yield cluster, started
    for node in started:
        node.kill()


def http_put(node: ClusterNode, path: str, body: dict) -> None:
    request = urllib.request.Request(
        node.http_url + path, data=json.dumps(body).encode(), method="PUT",
        headers={"Content-Type": "application/json", "Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status in (201, 204)


def url(node: ClusterNode) -> pika.URLParameters:
    return pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{node.amqp_port}/{VHOST}")


def stored(postgres, cluster: str, body: bytes) -> int:
    return postgres.sql(f'SELECT count(*) FROM "{cluster}".messages WHERE body = %s', body)[0][0]


@pytest.mark.parametrize("created_on", ["n1", "n2"])
def test_confirms_in_a_vhost_made_after_start_wait_for_the_owner(postgres, nodes, created_on) -> None:
    cluster, (n1, n2) = nodes
    # (n1 may not have looked at the catalog since n2 joined: its link looks n2 up)
    # made on n1 itself (HTTP) or on n2 and replicated to n1: either way a late vhost
    creator = n1 if created_on == "n1" else n2
    http_put(creator, f"/api/vhosts/{VHOST}", {})
    http_put(creator, f"/api/permissions/{VHOST}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    with pika.BlockingConnection(url(n2)) as on_n2:
        on_n2.channel().queue_declare("q", durable=True)  # client-local: owned by n2
    assert owner(postgres, cluster, "q") == "n2"
    connection = pika.BlockingConnection(url(n1))
    channel = connection.channel()
    channel.confirm_delivery()
    bodies = [b"late %d" % number for number in range(40)]
    for number, body in enumerate(bodies):
        channel.basic_publish("", "q", body, PERSISTENT, mandatory=True)  # waits for the confirm
        assert stored(postgres, cluster, body) == 1, f"message {number} confirmed on n1 before n2 stored it"
    n2.kill()  # right after the last confirm
    connection.close()

    def taken_over() -> list[bytes] | None:
        try:
            with pika.BlockingConnection(url(n1)) as again:
                channel = again.channel()
                found = []
                while True:
                    method, _, body = channel.basic_get("q", auto_ack=True)
                    if method is None:
                        return found or None
                    found.append(body)
        except (pika.exceptions.AMQPError, OSError):
            return None

    found = eventually(taken_over, timeout=10, interval=0.2)
    assert found is not None and sorted(found) == sorted(bodies), n1.log()[-3000:]


def test_a_forward_lost_before_its_turn_ended_is_a_negative_confirm(tmp_path) -> None:
    pair = Pair(tmp_path)
    try:
        pair.declare("q", "nowhere", "x", ("k",))  # an owner no link can reach
        connection = pika.BlockingConnection(pika.URLParameters(pair.url("a")))
        channel = connection.channel()
        channel.confirm_delivery()
        for _ in range(2):  # the first attempt, and one while the link is down
            with pytest.raises(pika.exceptions.NackError):
                channel.basic_publish("x", "k", b"lost", PERSISTENT)
        connection.close()
    finally:
        pair.close()
