"""The dead-letter console's API over real HTTP, beside pika clients: which queues hold
dead letters and of what, and paging through one with filters, without side effects
(the messages stay where they were, in order, never marked redelivered)."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pika
import pytest
from dead_letters import dead_letters

from leveret import BlockingBroker


@pytest.fixture
def broker(tmp_path) -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=str(tmp_path / "data")) as broker:
        yield broker


def get(
    broker: BlockingBroker, path: str, user: str = "guest", password: str = "guest"
) -> tuple[int, object]:
    request = urllib.request.Request(broker.http_url.rstrip("/") + path)
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def put(broker: BlockingBroker, path: str, body: dict) -> int:
    request = urllib.request.Request(
        broker.http_url.rstrip("/") + path, json.dumps(body).encode(), method="PUT"
    )
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def messages(broker: BlockingBroker, queue: str, **query) -> dict:
    pairs = [
        (k, v) for k, values in query.items() for v in (values if isinstance(values, list) else [values])
    ]
    status, body = get(
        broker, f"/api/leveret/dead-letters/%2F/{queue}/messages?" + urllib.parse.urlencode(pairs)
    )
    assert status == 200, body
    assert isinstance(body, dict)
    return body


def test_the_dead_letter_queues_are_listed_with_counts_by_reason_and_source(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    dead_letters(connection.channel())
    status, listed = get(broker, "/api/leveret/dead-letters")
    assert status == 200 and isinstance(listed, list)
    assert [(q["vhost"], q["name"]) for q in listed] == [("/", "dlq")]
    dlq = listed[0]
    assert dlq["messages"] == dlq["counted"] == 4
    assert dlq["by_reason"] == {"rejected": 3, "expired": 1}
    assert dlq["by_source"] == {"orders": 3, "payments": 1}
    assert dlq["oldest_death"] <= dlq["newest_death"] <= time.time() + 1
    assert get(broker, "/api/leveret/dead-letters/%2F")[1] == listed
    assert get(broker, "/api/leveret/dead-letters/nowhere")[0] == 404
    connection.close()


def test_browsing_filters_and_pages_without_touching_the_queue(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    channel = connection.channel()
    dead_letters(channel)

    page = messages(broker, "dlq")
    assert [i["position"] for i in page["items"]] == [1, 2, 3, 4] and page["more"] is False
    first, second, third, fourth = page["items"]
    assert first["body"] == {"kind": "json", "text": json.dumps({"order": 1, "sku": "red"}, indent=2)}
    assert second["body"] == {"kind": "text", "text": "plain text order 2"}
    assert third["body"] == {"kind": "hex", "text": "00 9f 92 96"}
    assert first["death"]["queue"] == "orders" and first["death"]["reason"] == "rejected"
    assert first["deaths"][0]["reason"] == "rejected" and first["deaths"][0]["count"] == 1
    assert first["properties"]["headers"]["tenant"] == "acme"
    assert fourth["death"]["reason"] == "expired"
    assert not any(i["redelivered"] for i in page["items"])

    def bodies(**query) -> list[str]:
        return [i["body"]["text"][:20] for i in messages(broker, "dlq", **query)["items"]]

    assert len(bodies(reason="rejected")) == 3 and bodies(reason="expired") == ["expires"]
    assert bodies(source_queue="payments") == ["00 9f 92 96"]
    assert bodies(header="tenant:globex") == ["plain text order 2"]
    assert len(bodies(header=["tenant:acme"], reason="rejected")) == 2
    assert bodies(body="order 2") == ["plain text order 2"]
    assert len(bodies(max_age=3600)) == 4 and bodies(min_age=3600) == []
    paged = messages(broker, "dlq", page=2, page_size=3)
    assert [i["position"] for i in paged["items"]] == [4] and paged["more"] is False
    assert messages(broker, "dlq", page=1, page_size=3)["more"] is True

    # no side effects: still four, in their order, none redelivered
    got = []
    for _ in range(4):
        method, _, body = channel.basic_get("dlq", auto_ack=True)
        got.append((body[:7], method.redelivered))
    assert got == [
        (b'{"order', False),
        (b"plain t", False),
        (bytes([0, 159, 146, 150]), False),
        (b"expires", False),
    ]
    connection.close()


def test_bad_requests_are_named_and_browsing_needs_read_permission(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    dead_letters(connection.channel())
    for query, word in (
        ("page=0", "page"),
        ("page_size=501", "page_size"),
        ("min_age=x", "min_age"),
        ("header=novalue", "header"),
    ):
        status, error = get(broker, f"/api/leveret/dead-letters/%2F/dlq/messages?{query}")
        assert status == 400 and word in error["reason"], (query, error)
    assert get(broker, "/api/leveret/dead-letters/%2F/missing/messages")[0] == 404

    assert put(broker, "/api/users/viewer", {"password": "pw", "tags": "management"}) == 201
    assert (
        put(broker, "/api/permissions/%2F/viewer", {"configure": "", "write": "", "read": "^orders$"}) == 201
    )
    status, error = get(broker, "/api/leveret/dead-letters/%2F/dlq/messages", "viewer", "pw")
    assert (status, error["reason"]) == (401, "Access refused.")
    assert get(broker, "/api/leveret/dead-letters/%2F/orders/messages", "viewer", "pw")[0] == 200
    connection.close()
