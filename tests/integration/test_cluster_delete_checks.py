"""Queue operations on a node that does not own the queue, done by the owner: queue.delete
if-empty / if-unused (the owner's messages and consumers count, RabbitMQ's 406
PRECONDITION_FAILED, never the remote node's stale figures), and a purge and a basic.get
made while the link to the owner is still connecting (never dropped, never a false
get-empty). Two real node processes on a real PostgreSQL each."""

from __future__ import annotations

import pika
import requests
from cluster_nodes import start_nodes
from eventually import eventually
from targets import unique

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def fill(node, queue: str, bodies: list[bytes]) -> None:
    """Declare ``queue`` through ``node`` (client-local: owned by it) and publish
    ``bodies`` there, persistent and confirmed."""
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish("", queue, body, PERSISTENT, mandatory=True)


def test_delete_if_empty_on_n1_of_a_queue_n2_holds_messages_in_is_refused(postgres, tmp_path) -> None:
    n1, n2 = start_nodes(tmp_path, postgres.url, unique("delchk").replace("-", "_"), 2)
    try:
        fill(n2, "kept", [b"m%d" % i for i in range(3)])  # owned by n2
        refused = None
        with pika.BlockingConnection(pika.URLParameters(n1.url)) as on_n1:
            try:
                on_n1.channel().queue_delete("kept", if_empty=True)
            except pika.exceptions.ChannelClosedByBroker as exc:
                refused = exc.reply_code
        with pika.BlockingConnection(pika.URLParameters(n2.url)) as on_n2:
            count = on_n2.channel().queue_declare("kept", passive=True).method.message_count
        assert (refused, count) == (406, 3)
        with pika.BlockingConnection(pika.URLParameters(n2.url)) as on_n2:
            on_n2.channel().queue_declare("empty", durable=True)
        with pika.BlockingConnection(pika.URLParameters(n1.url)) as on_n1:
            channel = on_n1.channel()
            channel.queue_delete("kept")  # no checks: deleted (its count is n1's last figure)
            assert channel.queue_delete("empty", if_empty=True, if_unused=True).method.message_count == 0
        with pika.BlockingConnection(pika.URLParameters(n2.url)) as on_n2:
            try:
                on_n2.channel().queue_declare("empty", passive=True)
                raise AssertionError("the owner still has queue 'empty'")
            except pika.exceptions.ChannelClosedByBroker as exc:
                assert exc.reply_code == 404
    finally:
        for node in (n1, n2):
            node.kill()


def test_a_purge_on_n1_reaches_the_owner_n2_over_a_link_not_up_yet(postgres, tmp_path) -> None:
    """The first use of n1's link to n2 is a purge: it is made once the link is up."""
    n1, n2 = start_nodes(tmp_path, postgres.url, unique("purge").replace("-", "_"), 2)
    try:
        fill(n2, "full", [b"m%d" % i for i in range(3)])  # owned by n2
        with pika.BlockingConnection(pika.URLParameters(n1.url)) as on_n1:
            on_n1.channel().queue_purge("full")

        def count() -> int:
            with pika.BlockingConnection(pika.URLParameters(n2.url)) as on_n2:
                return on_n2.channel().queue_declare("full", passive=True).method.message_count

        assert eventually(lambda: count() == 0, timeout=5)
    finally:
        for node in (n1, n2):
            node.kill()


def test_the_first_basic_get_on_n1_of_a_queue_owned_by_n2_gets_its_head(postgres, tmp_path) -> None:
    """The first use of n1's link to n2 is a basic.get: it waits for the link, not
    basic.get-empty for a queue that holds messages."""
    n1, n2 = start_nodes(tmp_path, postgres.url, unique("get").replace("-", "_"), 2)
    try:
        fill(n2, "held", [b"head"])  # owned by n2
        with pika.BlockingConnection(pika.URLParameters(n1.url)) as on_n1:
            _, _, body = on_n1.channel().basic_get("held", auto_ack=True)
        assert body == b"head"
    finally:
        for node in (n1, n2):
            node.kill()


def test_the_http_api_delete_if_empty_on_n1_of_a_queue_n2_holds_messages_in_is_refused(
    postgres, tmp_path
) -> None:
    """``DELETE /api/queues/%2F/q?if-empty=true`` on n1: 400 (RabbitMQ's), n2 keeps it."""
    n1, n2 = start_nodes(tmp_path, postgres.url, unique("httpdel").replace("-", "_"), 2)
    try:
        fill(n2, "kept", [b"m"])  # owned by n2
        answer = requests.delete(
            f"{n1.http_url}/api/queues/%2F/kept",
            params={"if-empty": "true"},
            auth=("guest", "guest"),
            timeout=10,
        )
        with pika.BlockingConnection(pika.URLParameters(n2.url)) as on_n2:
            count = on_n2.channel().queue_declare("kept", passive=True).method.message_count
        assert (answer.status_code, count) == (400, 1)
    finally:
        for node in (n1, n2):
            node.kill()


def test_a_passive_declare_on_n1_comes_to_show_the_owners_count_by_itself(postgres, tmp_path) -> None:
    """n1's figures of n2's queue are the owner's: the first look starts n1's link (nothing
    else opens it here), and a later look shows what n2 holds."""
    n1, n2 = start_nodes(tmp_path, postgres.url, unique("figures").replace("-", "_"), 2)
    try:
        fill(n2, "counted", [b"m%d" % i for i in range(4)])  # owned by n2
        with pika.BlockingConnection(pika.URLParameters(n1.url)) as on_n1:
            channel = on_n1.channel()

            def count() -> int:
                return channel.queue_declare("counted", passive=True).method.message_count

            assert eventually(lambda: count() == 4, timeout=10)
    finally:
        for node in (n1, n2):
            node.kill()
