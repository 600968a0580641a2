"""Message rates in the management API (RabbitMQ's ``message_stats``, ``*_details``,
``churn_rates``) over real HTTP, after real pika traffic: counts exact, rates from the
broker's counters read every ``collect_statistics_interval`` (100 ms here), samples for
charts. Shapes as a RabbitMQ 3.10.8 node answers them (compared by hand: ``publish``,
``publish_details: {"rate"}``, and with ``lengths_age``/``lengths_incr`` ``samples``
newest first with ``avg``/``avg_rate``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pika
import pytest
from eventually import poll
from test_dead_letter_browser import get, put

from leveret import BlockingBroker
from leveret.management.rates import details

INTERVAL_MS = 100


@pytest.fixture
def broker() -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, http_port=0, collect_statistics_interval=INTERVAL_MS) as broker:
        yield broker


def traffic(broker: BlockingBroker) -> None:
    """10 publishes to ``work`` with confirms, 6 consumed with acks (one of them
    requeued first), 2 got without ack (2 left), a get on an empty queue, one unroutable."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.queue_declare("work")
    channel.queue_declare("empty")
    channel.confirm_delivery()
    for n in range(10):
        channel.basic_publish("", "work", str(n).encode())
    channel.basic_publish("amq.direct", "nowhere", b"lost")
    method, _, _ = channel.basic_get("work")
    channel.basic_nack(method.delivery_tag, requeue=True)  # a get, then a redelivery below
    for _ in range(6):
        method, _, _ = channel.basic_get("work")
        channel.basic_ack(method.delivery_tag)
    for _ in range(2):
        channel.basic_get("work", auto_ack=True)
    assert channel.basic_get("empty") == (None, None, None)
    connection.close()


def wait_for_rate(broker: BlockingBroker, path: str, pick) -> dict:
    """The answer once ``pick(answer)`` (a rate) is above 0 (10 s at most)."""
    status, body = poll(lambda: get(broker, path), lambda answer: answer[0] != 200 or pick(answer[1]) > 0,
                        10, INTERVAL_MS / 1000 / 2)
    assert status == 200
    return body  # type: ignore[return-value]


def test_overview_counts_and_rates(broker):
    traffic(broker)
    overview = wait_for_rate(broker, "/api/overview", lambda o: o["message_stats"]["ack_details"]["rate"])
    stats = overview["message_stats"]
    assert (stats["publish"], stats["confirm"]) == (11, 11)
    assert (stats["return_unroutable"], stats["drop_unroutable"]) == (0, 1)
    assert (stats["get"], stats["get_no_ack"], stats["get_empty"]) == (7, 2, 1)
    assert (stats["deliver_get"], stats["redeliver"], stats["ack"]) == (9, 1, 6)
    assert (stats["deliver"], stats["deliver_no_ack"]) == (0, 0)
    for name in ("publish", "ack", "deliver_get", "confirm", "get_empty"):
        assert set(stats[f"{name}_details"]) == {"rate"}
    assert stats["ack_details"]["rate"] > 0
    churn = overview["churn_rates"]
    assert churn["connection_created"] == churn["connection_closed"] == 1
    assert churn["queue_declared"] == churn["queue_created"] == 2
    assert "rate" in churn["channel_created_details"]
    totals = overview["queue_totals"]
    assert (totals["messages"], totals["messages_ready"]) == (2, 2)
    assert isinstance(totals["messages_details"]["rate"], float)


def test_queue_and_vhost_message_stats(broker):
    traffic(broker)
    queue = wait_for_rate(
        broker,
        "/api/queues/%2F/work",
        lambda q: q.get("message_stats", {}).get("ack_details", {}).get("rate", 0),
    )
    stats = queue["message_stats"]
    assert (stats["publish"], stats["get"], stats["get_no_ack"], stats["ack"], stats["redeliver"]) == (
        10,
        7,
        2,
        6,
        1,
    )
    assert queue["messages"] == 2 and "rate" in queue["messages_details"]
    status, empty = get(broker, "/api/queues/%2F/empty")
    assert status == 200 and empty["message_stats"]["get_empty"] == 1
    put(broker, "/api/queues/%2F/idle", {"durable": False})
    assert "message_stats" not in get(broker, "/api/queues/%2F/idle")[1]  # no activity: none, as RabbitMQ
    listed = {q["name"]: q for q in get(broker, "/api/queues")[1]}
    assert listed["work"]["message_stats"]["publish"] == 10
    assert get(broker, "/api/queues?sort=message_stats.publish&sort_reverse=true")[1][0]["name"] == "work"
    vhost = get(broker, "/api/vhosts/%2F")[1]
    assert vhost["message_stats"]["publish"] == 10 and vhost["message_stats"]["ack"] == 6
    assert vhost["messages"] == 2 and "rate" in vhost["messages_ready_details"]


def test_samples_for_charts(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.queue_declare("charted")
    get(broker, "/api/queues/%2F/charted?lengths_age=60&lengths_incr=0.1")  # watched from now on
    for _ in range(5):
        channel.basic_publish("", "charted", b"x")
        time.sleep(INTERVAL_MS / 1000 * 1.5)
    connection.close()
    path = "/api/queues/%2F/charted?lengths_age=60&lengths_incr=0.1&msg_rates_age=60&msg_rates_incr=0.1"
    queue = get(broker, path)[1]
    samples = queue["messages_details"]["samples"]
    assert len(samples) >= 4
    timestamps = [s["timestamp"] for s in samples]
    assert timestamps == sorted(timestamps, reverse=True)  # newest first
    assert samples[0]["sample"] == 5 and samples[-1]["sample"] < 5
    assert queue["messages_details"]["avg_rate"] > 0 and 0 < queue["messages_details"]["avg"] <= 5
    overview = get(
        broker, "/api/overview?msg_rates_age=60&msg_rates_incr=0.1&lengths_age=60&lengths_incr=0.1"
    )[1]
    assert overview["message_stats"]["publish_details"]["samples"][0]["sample"] == 5
    assert overview["queue_totals"]["messages_details"]["samples"][0]["sample"] == 5


def test_rate_arithmetic():
    """The rate is the change over the last two readings, per second; samples keep one
    reading per ``incr`` within ``age``."""
    from collections import deque

    series = deque([(100.0, {"publish": 0}), (105.0, {"publish": 50}), (110.0, {"publish": 150})])
    assert details(series, "publish", 150, None) == {"rate": 20.0}
    found = details(series, "publish", 150, (7.0, 5.0))
    assert found["samples"] == [{"sample": 150, "timestamp": 110000}, {"sample": 50, "timestamp": 105000}]
    assert found["avg"] == 100 and found["avg_rate"] == 20.0
    assert details(deque([(1.0, {"ack": 5})]), "ack", 5, None) == {"rate": 0.0}  # one reading: no rate
    assert details(deque([(1.0, {"n": 9}), (2.0, {"n": 3})]), "n", 3, None) == {"rate": 0.0}  # never below 0
