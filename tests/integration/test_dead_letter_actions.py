"""The dead-letter console's actions over real HTTP, beside pika clients: retry to
origin, move, copy and delete, on chosen messages or on a filter, as jobs; the messages
left behind stay where they were, unmarked; what was moved is in the store before the
dead letter leaves it (a restart shows neither loss nor ghost); every action is in the
audit trail."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace

import pika
import pytest
from dead_letters import dead_letters
from eventually import eventually, poll
from servers import ServerProcess
from test_dead_letter_browser import get, messages, put

from leveret import BlockingBroker
from leveret.core.dead_letter_actions import CHUNK, IN_FLIGHT


@pytest.fixture
def broker(tmp_path) -> Iterator[BlockingBroker]:
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=str(tmp_path / "data")) as broker:
        yield broker


@pytest.fixture
def channel(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    yield connection.channel()
    connection.close()


def send(
    broker: BlockingBroker, method: str, path: str, body: dict | None = None, user: str = "guest"
) -> tuple[int, dict, dict]:
    """(status, JSON answer, headers) of a request as ``user`` (password = name, but guest's)."""
    request = urllib.request.Request(
        broker.http_url.rstrip("/") + path,
        None if body is None else json.dumps(body).encode(),
        method=method,
    )
    password = "guest" if user == "guest" else user
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), dict(exc.headers)


def run_job(broker: BlockingBroker, queue: str, body: dict) -> dict:
    """Start an action on ``queue`` and wait for its job to end; the finished job."""
    status, job, headers = send(broker, "POST", f"/api/leveret/dead-letters/%2F/{queue}/actions", body)
    assert status == 202, job
    assert headers["Location"] == f"/api/leveret/jobs/{job['id']}"
    status, job, _ = poll(lambda: send(broker, "GET", headers["Location"]),
                          lambda answer: answer[0] != 200 or answer[1]["state"] != "running", 20, 0.05)
    assert status == 200
    assert job["state"] != "running", job
    return job


def count(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def drain(channel, queue: str) -> list[tuple[bytes, dict, bool]]:
    """Every message of ``queue`` (body, headers, redelivered), taken."""
    taken = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return taken
        taken.append((body, properties.headers or {}, method.redelivered))


def test_retry_to_origin_by_reason_with_a_preview_and_the_audit_trail(broker, channel):
    dead_letters(channel)  # dlq: 3 rejected (2 orders, 1 payment), then 1 expired order
    preview = "/api/leveret/dead-letters/%2F/dlq/preview"
    assert send(broker, "POST", preview, {"filter": {"reason": "rejected"}})[1] == {
        "matching": 3,
        "complete": True,
    }
    assert send(broker, "POST", preview, {"filter": {"source_queue": "payments"}})[1]["matching"] == 1

    job = run_job(broker, "dlq", {"action": "retry", "filter": {"reason": "rejected"}})
    assert (job["state"], job["matched"], job["done"], job["failed"]) == ("done", 3, 3, 0)
    assert (count(channel, "orders"), count(channel, "payments"), count(channel, "dlq")) == (2, 1, 1)

    retried = drain(channel, "orders")
    assert [body for body, _, _ in retried] == [b'{"order": 1, "sku": "red"}', b"plain text order 2"]
    for _, headers, redelivered in retried:
        assert headers["x-replay-count"] == 1 and not redelivered
        assert headers["x-death"][0]["reason"] == "rejected" and headers["x-death"][0]["queue"] == "orders"
    assert [i["death"]["reason"] for i in messages(broker, "dlq")["items"]] == ["expired"]

    status, trail, _ = send(broker, "GET", "/api/leveret/audit?limit=5")
    assert status == 200
    assert [entry["action"] for entry in trail[:2]] == ["dead-letters.retry.done", "dead-letters.retry"]
    started, finished = trail[1], trail[0]
    assert started["user"] == finished["user"] == "guest"
    assert started["details"]["matching"] == 3 and started["details"]["filter"] == {"reason": "rejected"}
    assert finished["details"]["done"] == 3 and finished["details"]["failed"] == 0
    assert finished["time"] >= started["time"] > time.time() - 60


def test_move_chosen_messages_leaves_the_others_in_place_and_unmarked(broker, channel):
    dead_letters(channel)
    channel.queue_declare("parking")
    items = messages(broker, "dlq")["items"]
    chosen = [items[1]["seq"], items[3]["seq"]]
    assert (
        send(broker, "POST", "/api/leveret/dead-letters/%2F/dlq/preview", {"seqs": chosen})[1]["matching"]
        == 2
    )

    job = run_job(broker, "dlq", {"action": "move", "seqs": chosen, "target": {"queue": "parking"}})
    assert (job["state"], job["done"], job["target"]) == ("done", 2, {"queue": "parking"})
    assert [body for body, _, _ in drain(channel, "parking")] == [b"plain text order 2", b"expires"]
    left = messages(broker, "dlq")["items"]
    assert [i["seq"] for i in left] == [items[0]["seq"], items[2]["seq"]]
    assert [redelivered for _, _, redelivered in drain(channel, "dlq")] == [False, False]


def test_copy_to_an_exchange_keeps_the_dead_letters(broker, channel):
    dead_letters(channel)
    channel.exchange_declare("audit", "direct")
    channel.queue_declare("copies")
    channel.queue_bind("copies", "audit", "kept")
    job = run_job(
        broker,
        "dlq",
        {
            "action": "copy",
            "filter": {"header": ["tenant:acme"]},
            "target": {"exchange": "audit", "routing_key": "kept"},
        },
    )
    assert (job["state"], job["matched"], job["done"]) == ("done", 2, 2)
    assert count(channel, "dlq") == 4
    copies = drain(channel, "copies")
    assert [headers["tenant"] for _, headers, _ in copies] == ["acme", "acme"]
    assert "x-replay-count" not in copies[0][1]  # a copy, not a retry


def test_delete_by_filter(broker, channel):
    dead_letters(channel)
    job = run_job(broker, "dlq", {"action": "delete", "filter": {"body": "order"}})
    assert (job["state"], job["matched"], job["done"]) == ("done", 2, 2)
    assert [body for body, _, _ in drain(channel, "dlq")] == [bytes([0, 159, 146, 150]), b"expires"]
    assert send(broker, "GET", "/api/leveret/audit")[1][0]["details"]["done"] == 2


def test_an_unroutable_retry_stays_in_the_dead_letter_queue(broker, channel):
    dead_letters(channel)
    channel.queue_delete("payments")  # the payment's origin (default exchange, "payments") is gone
    job = run_job(broker, "dlq", {"action": "retry", "filter": {"source_queue": "payments"}})
    assert (job["state"], job["done"], job["failed"]) == ("done", 0, 1)
    assert "unroutable" in job["error"]
    items = messages(broker, "dlq")["items"]
    assert len(items) == 4 and items[2]["death"]["queue"] == "payments"
    assert [redelivered for _, _, redelivered in drain(channel, "dlq")] == [False] * 4


def test_a_move_of_paged_out_dead_letters_survives_a_restart(tmp_path):
    """300 persistent dead letters, most of them paged out to the store (at most 20 in
    memory): the odd ones move to a durable queue. After a restart each message is in
    exactly one of the two queues, in order."""
    data = str(tmp_path / "data")
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=data) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("dlq", durable=True, arguments={"x-max-in-memory-length": 20})
        channel.queue_declare("kept", durable=True)
        for n in range(300):
            channel.basic_publish(
                "",
                "dlq",
                str(n).encode(),
                pika.BasicProperties(delivery_mode=2, headers={"parity": "odd" if n % 2 else "even"}),
            )
        job = run_job(
            broker,
            "dlq",
            {"action": "move", "filter": {"header": ["parity:odd"]}, "target": {"queue": "kept"}},
        )
        assert (job["state"], job["matched"], job["done"]) == ("done", 150, 150)
        assert (count(channel, "dlq"), count(channel, "kept")) == (150, 150)
        connection.close()
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=data) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        channel = connection.channel()
        assert [int(body) for body, _, _ in drain(channel, "dlq")] == list(range(0, 300, 2))
        assert [int(body) for body, _, _ in drain(channel, "kept")] == list(range(1, 300, 2))
        connection.close()


def test_bad_requests_and_permissions(broker, channel):
    dead_letters(channel)
    base = "/api/leveret/dead-letters/%2F/dlq"
    assert send(broker, "POST", f"{base}/actions", {"action": "explode"})[0] == 400
    assert send(broker, "POST", f"{base}/actions", {"action": "move"})[0] == 400
    assert (
        send(broker, "POST", f"{base}/actions", {"action": "move", "target": {"queue": "nowhere"}})[0] == 404
    )
    assert send(broker, "POST", f"{base}/actions", {"action": "delete", "seqs": ["x"]})[0] == 400
    assert send(broker, "POST", f"{base}/preview", {"filter": {"min_age": "old"}})[0] == 400
    assert send(broker, "POST", "/api/leveret/dead-letters/%2F/nope/preview", {})[0] == 404
    assert send(broker, "GET", "/api/leveret/jobs/999")[0] == 404

    put(broker, "/api/users/ops", {"password": "ops", "tags": "management"})
    put(broker, "/api/permissions/%2F/ops", {"configure": "", "write": ".*", "read": "^orders$"})
    assert send(broker, "POST", f"{base}/actions", {"action": "delete"}, user="ops")[0] == 401
    assert send(broker, "POST", f"{base}/preview", {}, user="ops")[0] == 401
    assert count(channel, "dlq") == 4
    assert send(broker, "GET", "/api/leveret/audit", user="ops")[1] == []  # only their own


def test_jobs_are_listed_and_a_timeline_counts_deaths(broker, channel):
    dead_letters(channel)
    job = run_job(broker, "dlq", {"action": "copy", "target": {"queue": "orders"}})
    status, jobs, _ = send(broker, "GET", "/api/leveret/jobs")
    assert status == 200 and [j["id"] for j in jobs] == [job["id"]]
    assert send(broker, "DELETE", f"/api/leveret/jobs/{job['id']}")[1]["state"] == "done"
    status, timeline = get(broker, "/api/leveret/dead-letters/%2F/dlq/timeline?bucket=3600")
    assert status == 200 and isinstance(timeline, dict)
    assert timeline["bucket"] == 3600
    assert sum(point["count"] for point in timeline["points"]) == 4
    assert sum(point["by_reason"].get("rejected", 0) for point in timeline["points"]) == 3
    assert all(point["time"] % 3600 == 0 for point in timeline["points"])


def test_failed_moves_of_paged_out_messages_go_back_in_order(tmp_path):
    """Every move fails (the exchange routes nowhere): all 60 messages, 50 of them paged
    out, are back in their places, unmarked, then and after a restart."""
    data = str(tmp_path / "data")
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=data) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("dlq", durable=True, arguments={"x-max-in-memory-length": 10})
        channel.exchange_declare("void", "direct")
        for n in range(60):
            channel.basic_publish("", "dlq", str(n).encode(), pika.BasicProperties(delivery_mode=2))
        job = run_job(broker, "dlq", {"action": "move", "target": {"exchange": "void"}})
        assert (job["state"], job["done"], job["failed"]) == ("done", 0, 60)
        assert count(channel, "dlq") == 60
        assert [int(i["body"]["text"]) for i in messages(broker, "dlq", page_size=100)["items"]] == list(
            range(60)
        )
        connection.close()
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=data) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        taken = drain(connection.channel(), "dlq")
        assert [int(body) for body, _, _ in taken] == list(range(60))
        assert not any(redelivered for _, _, redelivered in taken)
        connection.close()


def leveret(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}  # rich wraps tables to the terminal's width
    return subprocess.run(
        [sys.executable, "-m", "leveret", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_the_same_actions_from_leveret_dlq(broker, channel):
    """``leveret dlq`` drives the same API: a dry run counts, move and delete act, jobs
    and the audit trail list them, a refused target is a clear error."""
    dead_letters(channel)
    channel.queue_declare("parking")
    http = ("--http-url", broker.http_url)
    dry = leveret("dlq", "move", "dlq", "--to-queue", "parking", "--reason", "rejected", "--dry-run", *http)
    assert dry.returncode == 0, dry.stderr
    assert "3 message(s) match in dlq" in dry.stdout and count(channel, "dlq") == 4

    moved = leveret("dlq", "move", "dlq", "--to-queue", "parking", "--header", "tenant:acme", *http)
    assert moved.returncode == 0, moved.stderr
    assert "done: 2 done, 0 left in dlq" in moved.stdout
    assert (count(channel, "dlq"), count(channel, "parking")) == (2, 2)

    deleted = leveret("dlq", "delete", "dlq", "--reason", "expired", "--yes", *http)
    assert deleted.returncode == 0 and "1 done" in deleted.stdout
    assert count(channel, "dlq") == 1

    missing = leveret("dlq", "copy", "dlq", "--to-queue", "nowhere", *http)
    assert missing.returncode != 0 and "404" in missing.stderr and "nowhere" in missing.stderr
    assert leveret("dlq", "copy", "dlq", *http).returncode == 2  # no target: a usage error

    jobs = leveret("dlq", "jobs", *http)
    assert jobs.returncode == 0 and jobs.stdout.count("done") >= 2 and "move" in jobs.stdout
    trail = leveret("dlq", "audit", "--limit", "10", *http)
    assert trail.returncode == 0
    assert "dead-letters.move" in trail.stdout and "dead-letters.delete.done" in trail.stdout


def test_actions_on_a_priority_queue_keep_its_delivery_order(broker, channel):
    """A priority queue with most messages paged out: moving every third message and
    failing to move the rest leaves the rest in priority order, FIFO within a level."""
    channel.confirm_delivery()
    channel.queue_declare("pdlq", durable=True, arguments={"x-max-priority": 3, "x-max-in-memory-length": 5})
    channel.queue_declare("parking", durable=True)
    channel.exchange_declare("void", "direct")
    sent = [(n, n % 4) for n in range(40)]
    for n, priority in sent:
        properties = pika.BasicProperties(
            delivery_mode=2, priority=priority, headers={"third": str(n % 3 == 0)}
        )
        channel.basic_publish("", "pdlq", str(n).encode(), properties)
    job = run_job(
        broker,
        "pdlq",
        {"action": "move", "filter": {"header": ["third:True"]}, "target": {"queue": "parking"}},
    )
    assert (job["done"], job["failed"]) == (14, 0)
    failed = run_job(broker, "pdlq", {"action": "move", "target": {"exchange": "void"}})
    assert (failed["done"], failed["failed"]) == (0, 26)
    expected = [n for n, priority in sorted(sent, key=lambda s: (-s[1], s[0])) if n % 3]
    assert [int(body) for body, _, _ in drain(channel, "pdlq")] == expected
    assert sorted(int(body) for body, _, _ in drain(channel, "parking")) == list(range(0, 40, 3))


def test_a_move_killed_half_way_loses_nothing(tmp_path):
    """kill -9 in the middle of a move of 20,000 persistent dead letters: after the
    restart every message is in the dead-letter queue or the target (a few may be in
    both: confirmed there, not yet removed here), none is lost."""
    data = tmp_path / "data"
    server = ServerProcess(data, "--http-port", "0")
    try:
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        channel = connection.channel()
        channel.queue_declare("dlq", durable=True)
        channel.queue_declare("kept", durable=True)
        total = 20_000
        for n in range(total):
            channel.basic_publish("", "dlq", str(n).encode(), pika.BasicProperties(delivery_mode=2))
        assert eventually(lambda: count(channel, "dlq") >= total, 120, 0.05)
        connection.close()
        broker = SimpleNamespace(http_url=server.http_url)
        status, job, headers = send(  # type: ignore[arg-type]
            broker,
            "POST",
            "/api/leveret/dead-letters/%2F/dlq/actions",
            {"action": "move", "target": {"queue": "kept"}},
        )
        assert status == 202
        deadline = time.monotonic() + 30
        while job["done"] < 1000 and time.monotonic() < deadline:
            job = send(broker, "GET", headers["Location"])[1]  # type: ignore[arg-type]
        assert job["state"] == "running", "the move ended before it could be interrupted"
        server.kill()
    finally:
        server.kill()
    server = ServerProcess(data)
    try:
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        channel = connection.channel()
        left = [int(body) for body, _, _ in drain(channel, "dlq")]
        moved = [int(body) for body, _, _ in drain(channel, "kept")]
        assert set(left) | set(moved) == set(range(total))
        assert left == sorted(left) and moved == sorted(moved)
        # twice at most: what was confirmed in the target but not yet removed here (the
        # chunks in flight, and the removals of one more still on their way to disk)
        assert len(moved) >= 1000 and len(left) + len(moved) - total <= (IN_FLIGHT + 1) * CHUNK
        connection.close()
    finally:
        server.kill()


def test_the_audit_trail_survives_a_restart(tmp_path):
    data = str(tmp_path / "data")
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=data) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        dead_letters(connection.channel())
        connection.close()
        run_job(broker, "dlq", {"action": "delete", "filter": {"body": "order", "header": ["tenant:acme"]}})
        before = send(broker, "GET", "/api/leveret/audit")[1]
    assert [e["action"] for e in before] == ["dead-letters.delete.done", "dead-letters.delete"]
    assert before[1]["details"]["filter"] == {"body": "order", "header": ["tenant:acme"]}
    with BlockingBroker(amqp_port=0, http_port=0, data_dir=data) as broker:
        assert send(broker, "GET", "/api/leveret/audit")[1] == before


def test_a_cancelled_move_stops_between_chunks_and_loses_nothing(broker, channel):
    channel.queue_declare("big", durable=True)
    channel.queue_declare("target", durable=True)
    total = 10_000
    for n in range(total):
        channel.basic_publish("", "big", str(n).encode(), pika.BasicProperties(delivery_mode=2))
    assert eventually(lambda: count(channel, "big") >= total, 120)
    status, job, headers = send(broker, "POST", "/api/leveret/dead-letters/%2F/big/actions",
                                {"action": "move", "target": {"queue": "target"}})
    assert status == 202
    assert send(broker, "DELETE", headers["Location"])[0] == 202
    job = poll(lambda: send(broker, "GET", headers["Location"])[1], lambda job: job["state"] != "running", 10)
    assert job["state"] == "cancelled" and 0 < job["done"] < total
    left, moved = drain(channel, "big"), drain(channel, "target")
    assert len(moved) == job["done"] and len(left) + len(moved) == total  # no duplicate either
    assert [int(body) for body, _, _ in moved + left] == list(range(total))
    trail = send(broker, "GET", "/api/leveret/audit?limit=1")[1]
    assert trail[0]["action"] == "dead-letters.move.cancelled" and trail[0]["details"]["done"] == job["done"]
