"""`leveret dlq` and the management API against a running `leveret server`, with the
e-mail example from examples/ producing the dead letters."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pika
import pytest
from servers import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import email_retry  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = ServerProcess(tmp_path_factory.mktemp("dlq") / "data", "--http-port", "0")
    yield server
    server.kill()


def leveret(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}  # rich wraps tables to the terminal's width
    return subprocess.run([sys.executable, "-m", "leveret", *args], capture_output=True,
                          text=True, timeout=60, input=input, env=env)


def api(server, path: str, user: str = "guest", password: str = "guest"):
    request = urllib.request.Request(server.http_url + path)
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def dead_letters(server):
    """Run the e-mail example: two bouncing addresses end in DLQ.emails."""
    result = email_retry.run(server.url, seconds=3.0)
    assert sorted(result["sent"]) == ["ada@example.org", "cy@example.org"]
    assert result["dead_lettered"] == 2
    return result


def test_management_api_lists_queues_with_counts(server, dead_letters):
    queues = {q["name"]: q for q in api(server, "/api/queues")}
    assert queues["DLQ.emails"]["messages"] == 2 and queues["DLQ.emails"]["durable"] is True
    assert queues["emails"]["arguments"]["x-max-redeliveries"] == 3
    assert api(server, "/api/overview")["product_name"] == "leveret"
    with pytest.raises(urllib.error.HTTPError) as info:
        api(server, "/api/queues", password="wrong")
    assert info.value.code == 401


def test_dlq_list_and_show(server, dead_letters):
    listed = leveret("dlq", "list", "--http-url", server.http_url)
    assert listed.returncode == 0, listed.stderr
    assert "DLQ.emails" in listed.stdout and "emails " not in listed.stdout.replace("DLQ.emails", "")

    shown = leveret("dlq", "show", "DLQ.emails", "--url", server.url)
    assert shown.returncode == 0, shown.stderr
    for text in ("mail-1", "mail-3", "delivery_limit", "emails"):
        assert text in shown.stdout
    # show leaves them in place
    ch = pika.BlockingConnection(pika.URLParameters(server.url)).channel()
    assert ch.queue_declare("DLQ.emails", passive=True).method.message_count == 2
    ch.connection.close()


def test_dlq_errors_are_clear(server):
    missing = leveret("dlq", "show", "no-such-queue", "--url", server.url)
    assert missing.returncode != 0 and "no queue 'no-such-queue'" in missing.stderr
    unreachable = leveret("dlq", "show", "DLQ.emails", "--url", "amqp://guest:guest@127.0.0.1:1/%2F")
    assert (unreachable.returncode != 0
            and "cannot connect to amqp://guest:***@127.0.0.1:1" in unreachable.stderr)


def test_refused_replay_leaves_the_dead_letter(server, dead_letters):
    failed = leveret("dlq", "replay", "DLQ.emails", "--url", server.url,
                     "--exchange", "", "--routing-key", "nowhere", "--limit", "1")
    assert failed.returncode != 0 and "refused" in failed.stderr
    ch = pika.BlockingConnection(pika.URLParameters(server.url)).channel()
    assert ch.queue_declare("DLQ.emails", passive=True).method.message_count == 2
    ch.connection.close()


def test_replay_to_the_original_queue_keeps_history(server, dead_letters):
    conn = pika.BlockingConnection(pika.URLParameters(server.url))
    ch = conn.channel()
    ch.queue_purge("emails")
    replayed = leveret("dlq", "replay", "DLQ.emails", "--url", server.url,
                       "--reason", "delivery_limit", "--header", "x-first-death-queue=emails")
    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 2 message(s)" in replayed.stdout
    assert ch.queue_declare("DLQ.emails", passive=True).method.message_count == 0
    bodies = []
    for _ in range(2):
        method, props, body = ch.basic_get("emails", auto_ack=True)
        assert method is not None
        assert props.headers["x-replay-count"] == 1
        assert props.headers["x-death"][0]["reason"] == "delivery_limit"
        assert props.delivery_mode == 2
        bodies.append(json.loads(body)["to"])
    assert sorted(bodies) == ["bob@bounce.example", "dee@bounce.example"]

    ch.basic_publish("", "DLQ.emails", b"x")
    purged = leveret("dlq", "purge", "DLQ.emails", "--url", server.url, "--yes")
    assert purged.returncode == 0 and "purged 1 message(s)" in purged.stdout
    conn.close()
