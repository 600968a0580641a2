"""Poison rows: a queue read through leases whose row makes the query fail every time.
The lease is never acknowledged, so it expires and the message returns to the queue
with its delivery count raised; the queue's redelivery policy then dead-letters it to
DLQ.<queue>, and the query gets past it."""

from __future__ import annotations

import time

import pika
import pytest
from spark_support import drain

from leveret.amqp.client import BlockingClient as Client

pytestmark = pytest.mark.timeout(240)


def test_a_poison_row_ends_in_the_dlq_after_max_redeliveries(spark, leveret_broker, tmp_path):
    url = leveret_broker.amqp_url
    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    channel.queue_declare("tasks", durable=True, arguments={
        "x-max-redeliveries": 1, "x-dead-letter-strategy": "individual"})
    channel.queue_declare("results", durable=True)
    for body in ("good-0", "poison", "good-1"):
        channel.basic_publish("", "tasks", body.encode(),
                              pika.BasicProperties(delivery_mode=2, message_id=body))

    def run() -> Exception | None:
        query = (spark.readStream.format("leveret").option("url", url).option("queue", "tasks")
                 .option("group", "worker").option("maxMessagesPerTrigger", 1)
                 .option("leaseTtlMs", 2000).load()
                 .selectExpr("CASE WHEN body = CAST('poison' AS BINARY) "
                             "THEN raise_error('cannot process this row') ELSE body END AS body")
                 .writeStream.format("leveret").option("url", url)
                 .option("routingKey", "results")
                 .option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(60)
        except Exception as exc:  # the query failed on the poison row
            return exc
        return query.exception()

    # leaseTtlMs must cover a batch from its planning to the end of its tasks: a lease
    # that expires before its rows are read sends them back to the queue (redelivered,
    # delivery count raised), so a too short TTL alone would dead-letter good rows
    failures = []
    with Client(url) as client:
        for _ in range(6):
            error = run()
            if error is None:
                break
            assert "cannot process this row" in str(error)
            failures.append(error)
            # the failed batch's lease expires after leaseTtlMs and the message returns
            # to the queue (or, at the limit, goes to the DLQ)
            deadline = time.monotonic() + 15
            while client.rpc("lease.info", {"queue": "tasks", "group": "worker"})["held"]:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        # delivered twice (the first delivery and x-max-redeliveries = 1 redelivery)
        assert len(failures) == 2
        assert client.queue_exists("tasks").message_count == 0
        assert client.rpc("lease.info", {"queue": "tasks", "group": "worker"})["held"] == 0

    assert sorted(body for _, _, body in drain(channel, "results")) == [b"good-0", b"good-1"]
    dead = (spark.read.format("leveret").option("url", url).option("queue", "DLQ.tasks")
            .load().collect())
    assert [(r.body, r.message_id) for r in dead] == [(b"poison", "poison")]
    assert (dead[0].deaths[0].reason, dead[0].deaths[0].queue) == ("delivery_limit", "tasks")
    conn.close()
