"""STOMP over WebSocket (``ws://HOST:PORT/ws``): stomp.py's WebSocket connection and a
browser-style client, @stomp/stompjs under node (installed by scripts/test from
tests/js/package-lock.json), exchanging messages with AMQP clients."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pika
import pytest
import stomp
from eventually import eventually

from leveret import BlockingBroker

JS = Path(__file__).resolve().parent.parent / "js"


@pytest.fixture
def broker():
    with BlockingBroker(amqp_port=0, web_stomp_port=0) as running:
        yield running


def test_stomp_py_over_websocket_with_the_v12_subprotocol(broker):
    port = broker.broker.web_stomp.port
    received = []

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            received.append(frame)

    conn = stomp.WSStompConnection([("127.0.0.1", port)], ws_path="/ws",
                                   header=["Sec-WebSocket-Protocol: v12.stomp"])
    conn.set_listener("", Listener())
    conn.connect("guest", "guest", wait=True)
    conn.subscribe("/queue/over-ws", "1", ack="client-individual")
    conn.send("/queue/over-ws", "hello over websocket", headers={"color": "red", "receipt": "r1"})
    assert eventually(lambda: received), "no MESSAGE over WebSocket"
    frame = received[0]
    assert frame.body == "hello over websocket" and frame.headers["color"] == "red"
    conn.ack(frame.headers["ack"])
    conn.disconnect()


@pytest.mark.skipif(shutil.which("node") is None or not (JS / "node_modules" / "@stomp").exists(),
                    reason="node or tests/js/node_modules (npm ci --prefix tests/js) is missing")
def test_stompjs_in_node_exchanges_messages_with_amqp(broker):
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url)) as connection:
        channel = connection.channel()
        channel.queue_declare("js", durable=True)
        channel.basic_publish("", "js", b"from amqp", pika.BasicProperties(headers={"n": 1}))
    result = subprocess.run(["node", str(JS / "stomp_roundtrip.mjs"), broker.web_stomp_url, "js"],
                            capture_output=True, text=True, timeout=60, cwd=JS)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["version"] == "1.2"
    first, second, third = report["seen"]
    assert bytes(first["body"]) == b"from amqp" and first["headers"]["n"] == "1"
    assert bytes(second["body"]) == b"from stomp.js" and second["headers"]["color"] == "red"
    assert bytes(third["body"]) == b"\x00\x01\x02\xff"
    assert third["headers"]["content-type"] == "application/octet-stream"
    with pika.BlockingConnection(pika.URLParameters(broker.amqp_url)) as connection:
        assert connection.channel().queue_declare("js", passive=True).method.message_count == 0  # all acked
