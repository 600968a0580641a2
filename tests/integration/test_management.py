"""The management HTTP API over real HTTP, beside a pika client: purging, and core's
refusals answered with 4xx JSON errors (never a 500)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pika
import pytest

from leveret import BlockingBroker


@pytest.fixture
def broker(tmp_path) -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=str(tmp_path / "data")) as broker:
        yield broker


def delete(broker: BlockingBroker, path: str) -> tuple[int, dict | None]:
    request = urllib.request.Request(broker.http_url.rstrip("/") + path, method="DELETE")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_purge_empties_a_queue_and_refuses_a_stream(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    channel.queue_declare("jobs")
    channel.queue_declare("log", durable=True, arguments={"x-queue-type": "stream"})
    for body in (b"a", b"b"):
        channel.basic_publish("", "jobs", body)
        channel.basic_publish("", "log", body)
    channel.queue_declare("jobs", passive=True)  # a round trip: the publishes are in

    assert delete(broker, "/api/queues/%2F/jobs/contents") == (204, None)
    assert channel.queue_declare("jobs", passive=True).method.message_count == 0

    status, error = delete(broker, "/api/queues/%2F/log/contents")
    assert status == 400
    assert error["error"] == "precondition_failed" and "is a stream" in error["reason"]
    assert channel.queue_declare("log", durable=True, passive=True).method.message_count == 2

    assert delete(broker, "/api/queues/%2F/missing/contents")[0] == 404
    connection.close()
