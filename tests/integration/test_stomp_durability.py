"""STOMP's durability promises against a real ``leveret server`` killed with SIGKILL:
a RECEIPT for a persistent SEND means the message is on disk, a committed transaction's
RECEIPT means all of it is, an uncommitted one leaves nothing, and unacknowledged
messages come back (redelivered) after the crash."""

from __future__ import annotations

import time

from servers import ServerProcess
from stomp_clients import Client


def test_receipted_persistent_sends_survive_kill_9(tmp_path):
    data = tmp_path / "data"
    server = ServerProcess(data)
    try:
        with Client(server.stomp_port) as client:
            for i in range(200):
                client.send("/queue/kept", f"m{i}", persistent="true", receipt=(i % 50 == 49))
            client.subscribe("/queue/kept", ack="client-individual", **{"activemq.prefetchSize": "1"})
            first = client.message()  # delivered, never acknowledged
            assert first.body == b"m0"
            time.sleep(0.3)  # the delivery count is written with the store's next batch
            server.proc.kill()  # SIGKILL, with the client still connected
            server.proc.wait()
    finally:
        server.kill()
    server = ServerProcess(data)
    try:
        with Client(server.stomp_port) as client:
            client.subscribe("/queue/kept", ack="auto")
            frames = [client.message() for _ in range(200)]
            client.no_message()
        assert [f.body for f in frames] == [f"m{i}".encode() for i in range(200)]
        assert frames[0].headers["redelivered"] == "true"
        assert "redelivered" not in frames[1].headers
    finally:
        server.kill()


def test_kill_9_during_a_transaction_keeps_the_committed_and_drops_the_open(tmp_path):
    data = tmp_path / "data"
    server = ServerProcess(data)
    try:
        with Client(server.stomp_port) as client:
            client.conn.begin("committed")
            for i in range(50):
                client.send("/queue/tx-crash", f"c{i}", receipt=False, persistent="true",
                            transaction="committed")
            client.conn.commit("committed", receipt="commit")
            client.wait_receipt("commit")
            client.conn.begin("open")
            for i in range(50):
                client.send("/queue/tx-crash", f"o{i}", receipt=False, persistent="true", transaction="open")
            client.send("/queue/sync", "x", persistent="true")  # the open transaction's sends were read
            server.proc.kill()
            server.proc.wait()
    finally:
        server.kill()
    server = ServerProcess(data)
    try:
        with Client(server.stomp_port) as client:
            client.subscribe("/queue/tx-crash")
            bodies = [client.message().body for _ in range(50)]
            client.no_message()
        assert bodies == [f"c{i}".encode() for i in range(50)]
    finally:
        server.kill()
