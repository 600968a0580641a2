"""The durability contract, RabbitMQ's semantics, against a real ``leveret server``
subprocess with real clients over TCP:

* a clean restart (SIGTERM) keeps durable exchanges, queues, bindings and persistent
  messages (in order, redelivered set on those delivered before) and nothing else;
* after SIGKILL at random moments no confirmed message, committed transaction or
  unacknowledged message is lost, and definitions are intact;
* the data directory is locked, and unusable or corrupt stores are refused by name;
* space freed by acknowledged messages goes back to the file system while running.

Fast confirmed publishing uses leveret.amqp.client (through ``tests/publisher.py``)
(pika's BlockingConnection waits for each confirm in turn).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pika
import pytest
from pamqp import commands
from pika.exceptions import ChannelClosedByBroker
from publisher import TRANSIENT, AsyncClient, ConnectionLost, body_index, make_body

PERSISTENT = pika.BasicProperties(delivery_mode=2)


# -- the server subprocess -------------------------------------------------------------
class Server:
    """``leveret server`` on ``data_dir``; its stderr (the log) goes to ``log_path``."""

    def __init__(self, data_dir: Path, log_path: Path, *args: str) -> None:
        self.data_dir, self.log_path = data_dir, log_path
        # The child keeps its own copy of the descriptor: ours is closed at once.
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "leveret", "server", "--amqp-port", "0", "--stomp-port", "0",
                 "--mqtt-port", "0", "--web-mqtt-port", "0",
                 "--web-stomp-port", "0", "--prometheus-port", "0", "--data-dir", str(data_dir), *args],
                stdout=subprocess.PIPE, stderr=log, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        match = re.match(r"leveret ready: amqp://([\d.]+):(\d+)", line)
        if not match:
            self.kill()
            raise RuntimeError(f"no ready line: {line!r}; log:\n{self.log()}")
        self.host, self.port = match.group(1), int(match.group(2))
        self.url = f"amqp://guest:guest@{self.host}:{self.port}/%2F?heartbeat=0"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 20, pump: tuple = ()) -> int:
        """SIGTERM; the exit code. Blocking pika connections in ``pump`` are serviced
        meanwhile, so that they answer the broker's connection.close at once."""
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        try:
            while pump and self.proc.poll() is None and time.monotonic() < deadline:
                pump = tuple(conn for conn in pump if conn.is_open)
                for conn in pump:
                    try:
                        conn.process_data_events(0.02)
                    except pika.exceptions.AMQPError:
                        pass
                time.sleep(0.01)
            return self.proc.wait(max(0.1, deadline - time.monotonic()))
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def assert_clean_log(self) -> None:
        text = self.log()
        assert "Traceback" not in text and " ERROR " not in text, text[-4000:]


@pytest.fixture
def start_server(tmp_path):
    """``start_server(data_dir=tmp_path/'data', *args)``; every server is killed at the
    end of the test."""
    started: list[Server] = []

    def start(data_dir: Path | None = None, *args: str) -> Server:
        server = Server(data_dir or tmp_path / "data", tmp_path / f"server-{len(started)}.log",
                        *args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


def run_server_expecting_failure(data_dir: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "leveret", "server", "--amqp-port", "0", "--stomp-port", "0",
         "--mqtt-port", "0", "--web-mqtt-port", "0",
         "--web-stomp-port", "0", "--prometheus-port", "0", "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=timeout)


# -- pika helpers ----------------------------------------------------------------------
def connect(server: Server) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(server.url))


def queue_count(conn: pika.BlockingConnection, name: str) -> int | None:
    """The ready-message count of a queue, None if it does not exist (404)."""
    ch = conn.channel()
    try:
        count = ch.queue_declare(name, passive=True).method.message_count
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404, exc
        return None
    ch.close()
    return count


def exchange_exists(conn: pika.BlockingConnection, name: str) -> bool:
    ch = conn.channel()
    try:
        ch.exchange_declare(name, passive=True)
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404, exc
        return False
    ch.close()
    return True


def refused(conn: pika.BlockingConnection, action) -> int | None:
    """Run ``action(channel)``; the reply code if the broker closed the channel."""
    ch = conn.channel()
    try:
        action(ch)
        ch.queue_declare("", exclusive=True)  # a round trip: an async close arrives first
    except ChannelClosedByBroker as exc:
        return exc.reply_code
    ch.close()
    return None


def drain(conn: pika.BlockingConnection, name: str, expected: int | None = None,
          timeout: float = 60) -> list[tuple[bytes, bool, pika.BasicProperties]]:
    """Consume (auto-ack) every message of a queue: (body, redelivered, properties)."""
    ch = conn.channel()
    if expected is None:
        expected = ch.queue_declare(name, passive=True).method.message_count
    got: list[tuple[bytes, bool, pika.BasicProperties]] = []
    if expected:
        ch.basic_qos(prefetch_count=2000)
        deadline = time.monotonic() + timeout
        for method, properties, body in ch.consume(name, auto_ack=True, inactivity_timeout=5):
            if method is None or time.monotonic() > deadline:
                break
            got.append((body, method.redelivered, properties))
            if len(got) >= expected:
                break
        ch.cancel()
    ch.close()
    return got


def get_one(conn: pika.BlockingConnection, name: str) -> bytes | None:
    ch = conn.channel()
    _, _, body = ch.basic_get(name, auto_ack=True)
    ch.close()
    return body


def publish_confirmed(server: Server, exchange: str, routing_key: str,
                      bodies, properties=None) -> list[int]:
    """Publish persistent ``bodies`` at full speed with confirms; the acked seqs."""
    async def run() -> list[int]:
        client = await AsyncClient.connect(server.host, server.port)
        try:
            channel = await client.channel(confirm=True)
            kwargs = {"properties": properties} if properties is not None else {}
            tracker = await client.publish_many(channel, exchange, routing_key, bodies, **kwargs)
            assert tracker.nacked == 0
            return tracker.acked()
        finally:
            await client.close()
    return asyncio.run(run())


def check_bodies(bodies: list[bytes]) -> dict[str, list[int]]:
    """Every body intact; the indices per tag, in the order received."""
    found: dict[str, list[int]] = {}
    for body in bodies:
        tag, index = body_index(body)
        found.setdefault(tag, []).append(index)
    return found


def increasing(values: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


# -- 1. clean restart ------------------------------------------------------------------
MAIN_COUNT = 100_000
QUEUE_ARGS = {"x-max-length": 1_000_000, "x-queue-mode": "lazy", "x-message-ttl": 3_600_000,
              "x-dead-letter-exchange": "d.ae"}
HEADERS_ALL = {"x-match": "all", "kind": "report", "level": 3}
HEADERS_ANY = {"x-match": "any", "region": "eu", "tier": "gold"}
RICH = pika.BasicProperties(
    delivery_mode=2, content_type="application/json", content_encoding="utf-8",
    headers={"a": 1, "b": "text", "nested": {"k": [1, "two", True]}, "big": 2**40},
    priority=7, correlation_id="corr-1", reply_to="replies", message_id="m-1",
    timestamp=1_700_000_000, type="kind", app_id="tests")


def declare_topology(ch) -> None:
    ch.exchange_declare("d.direct", "direct", durable=True)
    ch.exchange_declare("d.fanout", "fanout", durable=True)
    ch.exchange_declare("d.topic", "topic", durable=True)
    ch.exchange_declare("d.headers", "headers", durable=True)
    ch.exchange_declare("d.ae", "fanout", durable=True)
    ch.exchange_declare("d.with_ae", "direct", durable=True,
                        arguments={"alternate-exchange": "d.ae"})
    ch.exchange_declare("d.internal", "topic", durable=True, internal=True)
    ch.exchange_declare("d.autodel", "fanout", durable=True, auto_delete=True)
    ch.exchange_declare("t.fanout", "fanout", durable=False)
    for name in ("q.direct", "q.fanout", "q.topic", "q.e2e", "q.headers", "q.any", "q.ae",
                 "q.unacked", "q.acked", "q.purged", "q.deleted", "q.recreated", "q.props",
                 "q.autodel"):
        ch.queue_declare(name, durable=True)
    ch.queue_declare("q.main", durable=True, arguments=QUEUE_ARGS)
    ch.queue_declare("t.queue", durable=False)
    ch.queue_bind("q.direct", "d.direct", "rk1")
    ch.queue_bind("q.direct", "d.direct", "rk-unbound")
    ch.queue_unbind("q.direct", "d.direct", "rk-unbound")  # gone before the restart
    ch.queue_bind("q.fanout", "d.fanout")
    ch.queue_bind("t.queue", "d.fanout")  # durable exchange -> transient queue: not kept
    ch.exchange_bind("t.fanout", "d.fanout")  # durable -> transient exchange: not kept
    ch.queue_bind("q.topic", "d.topic", "a.*.c")
    ch.exchange_bind("d.internal", "d.topic", "e2e.#")  # exchange-to-exchange
    ch.queue_bind("q.e2e", "d.internal", "#")
    ch.queue_bind("q.headers", "d.headers", arguments=HEADERS_ALL)
    ch.queue_bind("q.any", "d.headers", arguments=HEADERS_ANY)
    ch.queue_bind("q.ae", "d.ae")
    ch.queue_bind("q.direct", "d.with_ae", "known")
    ch.queue_bind("q.autodel", "d.autodel")


def route_one_each(ch, tag: str) -> dict[str, bytes]:
    """Publish one persistent message along every route; {queue: body expected}."""
    sent = {
        "q.direct": ("d.direct", "rk1", {}), "q.fanout": ("d.fanout", "any", {}),
        "q.topic": ("d.topic", "a.b.c", {}), "q.e2e": ("d.topic", "e2e.x.y", {}),
        "q.headers": ("d.headers", "", {"kind": "report", "level": 3, "extra": 1}),
        "q.any": ("d.headers", "", {"tier": "gold"}), "q.ae": ("d.with_ae", "unknown", {}),
        "q.autodel": ("d.autodel", "", {}),
    }
    expected = {}
    for queue, (exchange, key, headers) in sent.items():
        body = f"{tag}:{queue}".encode()
        ch.basic_publish(exchange, key, body,
                         pika.BasicProperties(delivery_mode=2, headers=headers or None))
        expected[queue] = body
    # Routes that must reach nothing.
    ch.basic_publish("d.direct", "rk-unbound", f"{tag}:nowhere".encode(), PERSISTENT)
    ch.basic_publish("d.headers", "", f"{tag}:nowhere".encode(),
                     pika.BasicProperties(delivery_mode=2, headers={"kind": "report"}))
    return expected


def test_clean_restart_keeps_durable_state_and_nothing_else(start_server, tmp_path):
    data = tmp_path / "data"
    server = start_server(data)
    started = time.monotonic()

    # Persistent bulk, with transient messages around it in the same durable queue.
    conn = connect(server)
    ch = conn.channel()
    declare_topology(ch)
    ch.confirm_delivery()
    transient = publish_confirmed(server, "", "q.main",
                                  (make_body("transient", i, 40) for i in range(500)), TRANSIENT)
    assert len(transient) == 500
    acked = publish_confirmed(server, "", "q.main",
                              (make_body("main", i, 16 + i % 300) for i in range(MAIN_COUNT)))
    assert len(acked) == MAIN_COUNT
    publish_confirmed(server, "", "q.main",
                      (make_body("transient", i, 40) for i in range(500, 1000)), TRANSIENT)
    published = time.monotonic()

    before = route_one_each(ch, "before")
    ch.basic_publish("d.direct", "rk1", b"not persistent", pika.BasicProperties(delivery_mode=1))
    ch.basic_publish("", "q.props", b"rich", RICH)
    for name in ("q.unacked", "q.acked", "q.purged", "q.deleted", "q.recreated"):
        for i in range(10):
            ch.basic_publish("", name, make_body(name, i), PERSISTENT)
    ch.queue_purge("q.purged")
    ch.queue_delete("q.deleted")
    ch.queue_delete("q.recreated")
    ch.queue_declare("q.recreated", durable=True)
    for _ in range(10):  # acked: gone for good
        method, _, _ = ch.basic_get("q.acked")
        ch.basic_ack(method.delivery_tag)

    # A second connection holds deliveries (0, 1 acked; 2-5 unacked) and an exclusive
    # durable queue across the shutdown.
    holder = connect(server)
    hch = holder.channel()
    tags = [hch.basic_get("q.unacked")[0].delivery_tag for _ in range(6)]
    hch.basic_ack(tags[0])
    hch.basic_ack(tags[1])
    hch.queue_declare("x.exclusive", durable=True, exclusive=True)
    hch.basic_publish("", "x.exclusive", b"exclusive", PERSISTENT)
    hch.basic_publish("", "t.queue", b"transient queue", PERSISTENT)
    hch.queue_declare("x.exclusive", passive=True)  # a round trip: the acks are in

    assert server.terminate(pump=(conn, holder)) == 0
    stopped = time.monotonic()
    server.assert_clean_log()

    server = start_server(data)
    recovered = time.monotonic()
    conn = connect(server)

    # Definitions: durable ones are back, with their flags and arguments.
    for name in ("d.direct", "d.fanout", "d.topic", "d.headers", "d.ae", "d.with_ae",
                 "d.internal", "d.autodel"):
        assert exchange_exists(conn, name), name
    assert not exchange_exists(conn, "t.fanout")
    assert refused(conn, lambda c: c.exchange_declare("d.topic", "direct", durable=True)) == 406
    assert refused(conn, lambda c: c.exchange_declare("d.topic", "topic", durable=False)) == 406
    assert refused(conn, lambda c: c.exchange_declare(
        "d.with_ae", "direct", durable=True, arguments={"alternate-exchange": "other"})) == 406
    assert refused(conn, lambda c: c.exchange_declare(
        "d.with_ae", "direct", durable=True, arguments={"alternate-exchange": "d.ae"})) is None
    assert refused(conn, lambda c: c.basic_publish("d.internal", "x", b"")) == 403
    assert refused(conn, lambda c: c.queue_declare("q.main", durable=True,
                                                   arguments=QUEUE_ARGS)) is None
    assert refused(conn, lambda c: c.queue_declare(
        "q.main", durable=True, arguments={**QUEUE_ARGS, "x-max-length": 5})) == 406
    assert refused(conn, lambda c: c.queue_declare("q.main", durable=False,
                                                   arguments=QUEUE_ARGS)) == 406

    counts = {name: queue_count(conn, name) for name in (
        "q.main", "q.direct", "q.unacked", "q.acked", "q.purged", "q.deleted", "q.recreated",
        "t.queue", "x.exclusive", "q.props")}
    assert counts == {"q.main": MAIN_COUNT, "q.direct": 1, "q.unacked": 8, "q.acked": 0,
                      "q.purged": 0, "q.deleted": None, "q.recreated": 0, "t.queue": None,
                      "x.exclusive": None, "q.props": 1}

    # Messages routed before the restart, then routing through recovered bindings.
    for queue, body in before.items():
        assert get_one(conn, queue) == body, queue
    rch = conn.channel()
    rch.confirm_delivery()
    after = route_one_each(rch, "after")
    for queue, body in after.items():
        assert [b for b, _, _ in drain(conn, queue)] == [body], queue
    # auto_delete came back: dropping the exchange's last binding deletes it.
    rch.queue_unbind("q.autodel", "d.autodel")
    assert not exchange_exists(conn, "d.autodel")

    # Redelivery state: 2-5 were delivered (redelivered), 6-9 never were.
    got = drain(conn, "q.unacked", 8)
    assert [(body_index(b)[1], r) for b, r, _ in got] == [(i, i < 6) for i in range(2, 10)]
    (body, redelivered, props), = drain(conn, "q.props", 1)
    assert body == b"rich" and not redelivered
    for field in ("delivery_mode", "content_type", "content_encoding", "headers", "priority",
                  "correlation_id", "reply_to", "message_id", "timestamp", "type", "app_id"):
        assert getattr(props, field) == getattr(RICH, field), field

    # The bulk: every persistent message, in order, intact; nothing transient. A message
    # published now goes after them.
    rch.basic_publish("", "q.main", make_body("main", MAIN_COUNT, 20), PERSISTENT)
    got = drain(conn, "q.main", MAIN_COUNT + 1)
    assert check_bodies([b for b, _, _ in got]) == {"main": list(range(MAIN_COUNT + 1))}
    assert not any(r for _, r, _ in got)
    drained = time.monotonic()
    conn.close()

    # What was acknowledged after recovery stays gone; definitions survive a second restart.
    assert server.terminate() == 0
    server.assert_clean_log()
    server = start_server(data)
    conn = connect(server)
    assert {name: queue_count(conn, name) for name in ("q.main", "q.unacked", "q.direct")} == {
        "q.main": 0, "q.unacked": 0, "q.direct": 0}
    assert exchange_exists(conn, "d.with_ae") and not exchange_exists(conn, "d.autodel")
    ch = conn.channel()
    ch.basic_publish("d.topic", "e2e.again", b"e2e", PERSISTENT)
    assert [b for b, _, _ in drain(conn, "q.e2e", 1)] == [b"e2e"]
    conn.close()
    print(f"\nclean restart: publish {published - started:.1f}s, stop {stopped - published:.1f}s,"
          f" recover {recovered - stopped:.1f}s, verify {drained - recovered:.1f}s")


# -- 2. crashes ------------------------------------------------------------------------
async def publish_until_killed(server: Server, exchange: str, routing_key: str, tag: str,
                               delay: float, size: int = 100) -> tuple[list[int], int]:
    """Publish ``tag`` bodies with confirms until the server is SIGKILLed after
    ``delay`` s; (confirmed indices, published count)."""
    client = await AsyncClient.connect(server.host, server.port)
    channel = await client.channel(confirm=True)

    async def killer() -> None:
        await asyncio.sleep(delay)
        server.proc.kill()

    kill = asyncio.get_running_loop().create_task(killer())
    try:
        await client.publish_many(channel, exchange, routing_key,
                                  (make_body(tag, i, size) for i in itertools.count()),
                                  wait=False, timeout=delay + 20)
    except (ConnectionLost, ConnectionError, OSError):
        pass
    await kill
    tracker = client.tracker(channel)
    await client.close()
    server.kill()
    return [seq - 1 for seq in tracker.acked()], tracker.next_seq - 1


def test_kill_during_confirmed_publishing_loses_no_confirmed_message(start_server, tmp_path):
    rng = random.Random()
    data = tmp_path / "data"
    server = start_server(data)
    conn = connect(server)
    ch = conn.channel()
    ch.exchange_declare("crash.x", "topic", durable=True)
    ch.queue_declare("crash.q", durable=True, arguments={"x-max-length": 10**7})
    ch.queue_bind("crash.q", "crash.x", "crash.#")
    conn.close()
    report = []
    for round_ in range(3):
        delay = rng.uniform(0.3, 1.5)
        tag = f"r{round_}"
        confirmed, published = asyncio.run(
            publish_until_killed(server, "crash.x", "crash.k", tag, delay))
        assert confirmed, f"nothing confirmed in {delay:.2f}s"

        server = start_server(data)
        conn = connect(server)
        assert exchange_exists(conn, "crash.x")
        assert refused(conn, lambda c: c.queue_declare(
            "crash.q", durable=True, arguments={"x-max-length": 10**7})) is None
        got = check_bodies([b for b, _, _ in drain(conn, "crash.q")])
        indices = got.get(tag, [])
        assert increasing(indices), "out of order or duplicated"
        missing = set(confirmed) - set(indices)
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:5]}"
        assert set(got) <= {f"r{i}" for i in range(round_ + 1)}
        # The binding still routes.
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("crash.x", "crash.check", b"routed", PERSISTENT)
        assert get_one(conn, "crash.q") == b"routed"
        conn.close()
        report.append(f"{delay:.2f}s: {len(confirmed)} confirmed, {published} sent, "
                      f"{len(indices)} recovered")
    server.terminate()
    server.assert_clean_log()
    print("\nkill during publishing:", "; ".join(report))


def test_kill_during_consumer_acks_loses_no_unacked_message(start_server, tmp_path):
    rng = random.Random()
    data = tmp_path / "data"
    server = start_server(data)
    conn = connect(server)
    conn.channel().queue_declare("acks.q", durable=True)
    conn.close()
    count = 25_000
    assert len(publish_confirmed(server, "", "acks.q",
                                 (make_body("ack", i, 64) for i in range(count)))) == count

    acked: list[int] = []  # indices whose basic.ack was (about to be) sent
    done = threading.Event()

    def consume() -> None:
        try:
            consumer = connect(server)
            cch = consumer.channel()
            cch.basic_qos(prefetch_count=300)
            for method, _, body in cch.consume("acks.q", inactivity_timeout=5):
                if method is None:
                    break
                acked.append(body_index(body)[1])
                if rng.random() < 0.5:
                    cch.basic_ack(method.delivery_tag)
                else:  # some with multiple=True
                    cch.basic_ack(method.delivery_tag, multiple=True)
        except Exception:
            pass
        finally:
            done.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while len(acked) < 2000 and time.monotonic() < deadline and not done.is_set():
        time.sleep(0.005)
    time.sleep(rng.uniform(0, 0.4))
    server.kill()
    thread.join(15)
    assert not thread.is_alive()
    acked_before_kill = len(acked)
    assert 2000 <= acked_before_kill < count, "the kill did not land during the acks"

    server = start_server(data)
    conn = connect(server)
    got = check_bodies([b for b, _, _ in drain(conn, "acks.q")]).get("ack", [])
    assert increasing(got)
    lost = set(range(count)) - set(acked) - set(got)
    assert not lost, f"{len(lost)} unacknowledged messages lost"
    conn.close()
    server.terminate()
    server.assert_clean_log()
    print(f"\nkill during acks: {acked_before_kill} acked before the kill, {len(got)} recovered,"
          f" {len(set(got) & set(acked))} acked ones came back")


def test_kill_during_transaction_commits_keeps_committed_ones(start_server, tmp_path):
    rng = random.Random()
    data = tmp_path / "data"
    server = start_server(data)
    batch = 50
    committed: list[int] = []
    failures: list[BaseException] = []

    def transact() -> None:
        try:
            tconn = connect(server)
            tch = tconn.channel()
            tch.queue_declare("tx.q", durable=True)
            tch.tx_select()
            for n in itertools.count():
                for j in range(batch):
                    tch.basic_publish("", "tx.q", make_body("tx", n * batch + j, 64), PERSISTENT)
                tch.tx_commit()
                committed.append(n)
        except (pika.exceptions.AMQPError, OSError) as exc:
            failures.append(exc)

    thread = threading.Thread(target=transact, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not committed and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.01)
    time.sleep(rng.uniform(0.3, 1.0))
    server.kill()
    thread.join(15)
    assert not thread.is_alive() and committed and failures

    server = start_server(data)
    conn = connect(server)
    got = check_bodies([b for b, _, _ in drain(conn, "tx.q")]).get("tx", [])
    assert increasing(got)
    batches = {i // batch for i in got}
    assert set(committed) <= batches, "a committed transaction was lost"
    # leveret writes a commit as one store transaction: none survives half-way.
    assert len(got) == batch * len(batches)
    assert max(batches) <= max(committed) + 1
    conn.close()
    server.terminate()
    server.assert_clean_log()
    print(f"\nkill during tx: {len(committed)} commits ok'd, {len(batches)} recovered")


async def churn_until_killed(server: Server, names: list[str], initial: dict[str, list[bytes]],
                             rng: random.Random, delay: float, round_: int
                             ) -> tuple[list[tuple], int]:
    """Declare, publish to, purge and delete durable queues in a random sequence on one
    confirm channel until the server is killed. Returns the operation log and how many
    of its operations a received confirm proves durable."""
    client = await AsyncClient.connect(server.host, server.port)
    channel = await client.channel(confirm=True)
    log: list[tuple] = []
    log_at: dict[int, int] = {}  # publish seq -> len(log) when sent
    exists = {name: name in initial for name in names}
    counter = itertools.count()

    async def killer() -> None:
        await asyncio.sleep(delay)
        server.proc.kill()

    kill = asyncio.get_running_loop().create_task(killer())
    try:
        while True:
            name = rng.choice(names)
            roll = rng.random()
            if not exists[name]:
                log.append(("declare", name))
                await client.rpc(channel, commands.Queue.Declare(queue=name, durable=True))
                exists[name] = True
            elif roll < 0.6:
                for _ in range(rng.randint(1, 30)):
                    body = make_body(f"{name}.{round_}", next(counter), 32)
                    log.append(("publish", name, body))
                    log_at[client.publish(channel, "", name, body)] = len(log)
                if rng.random() < 0.3:
                    await client.wait_confirms(channel)
                await client.drain()
            elif roll < 0.8:
                log.append(("purge", name))
                await client.rpc(channel, commands.Queue.Purge(queue=name))
            else:
                log.append(("delete", name))
                await client.rpc(channel, commands.Queue.Delete(queue=name))
                exists[name] = False
    except (ConnectionLost, ConnectionError, OSError):
        pass
    await kill
    acked = client.tracker(channel).acked()
    await client.close()
    server.kill()
    return log, max((log_at[seq] for seq in acked), default=0)


def observe(conn: pika.BlockingConnection, names: list[str]) -> dict[str, list[bytes]]:
    """Each existing queue's messages, in order, left in place (gets, then requeue)."""
    state = {}
    for name in names:
        if queue_count(conn, name) is None:
            continue
        ch = conn.channel()
        bodies = []
        while True:
            method, _, body = ch.basic_get(name)
            if method is None:
                break
            bodies.append(body)
        ch.close()  # requeues them all
        state[name] = bodies
    return state


def test_kill_while_deleting_and_purging_leaves_a_consistent_state(start_server, tmp_path):
    """Writes reach the disk in order, so what a restart finds is the state after some
    prefix of the operations, one that includes every operation a confirm covered."""
    rng = random.Random()
    data = tmp_path / "data"
    names = [f"churn{i}" for i in range(5)]
    server = start_server(data)
    state: dict[str, list[bytes]] = {}
    report = []
    for round_ in range(3):
        delay = rng.uniform(0.3, 1.2)
        log, durable = asyncio.run(churn_until_killed(server, names, state, rng, delay, round_))
        assert len(log) > 50 and durable > 0

        server = start_server(data)
        conn = connect(server)
        observed = observe(conn, names)
        for bodies in observed.values():
            check_bodies(bodies)
        # Replay the log; the observed state must be one of those at or after `durable`.
        replay = {name: list(bodies) for name, bodies in state.items()}
        matched = 0 if durable == 0 and replay == observed else None
        for done, op in enumerate(log, 1):
            if matched is not None:
                break
            if op[0] == "declare":
                replay.setdefault(op[1], [])
            elif op[0] == "publish":
                replay[op[1]].append(op[2])
            elif op[0] == "purge":
                replay[op[1]].clear()
            else:
                del replay[op[1]]
            if done >= durable and replay == observed:
                matched = done
        assert matched is not None, (
            f"round {round_}: state after restart is no prefix >= {durable} of {len(log)} ops:"
            f" {({k: len(v) for k, v in observed.items()})}")
        report.append(f"{len(log)} ops, {durable} confirmed, recovered after {matched}")
        state = observed
        # Start the next round from empty queues; a confirmed publish makes the purges
        # durable (a confirm covers every write queued before it).
        ch = conn.channel()
        ch.confirm_delivery()
        for name in observed:
            ch.queue_purge(name)
        ch.queue_declare("barrier", durable=True)
        ch.basic_publish("", "barrier", b"barrier", PERSISTENT)
        state = {name: [] for name in observed}
        conn.close()
    server.terminate()
    server.assert_clean_log()
    print("\nkill during delete/purge:", "; ".join(report))


# -- 3. the data directory -------------------------------------------------------------
def test_second_server_on_the_same_data_dir_is_refused(start_server, tmp_path):
    data = tmp_path / "data"
    server = start_server(data)
    result = run_server_expecting_failure(data)
    assert result.returncode != 0
    assert str(data) in result.stderr and "in use" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    # The first one is unharmed.
    conn = connect(server)
    conn.channel().queue_declare("still-here", durable=True)
    conn.close()
    assert server.terminate() == 0
    server = start_server(data)  # the lock went with the process
    conn = connect(server)
    assert queue_count(conn, "still-here") == 0
    conn.close()


@pytest.mark.parametrize("case", ["under-a-file", "db-is-a-directory", "lock-is-a-directory"])
def test_unusable_data_dir_is_refused_by_name(tmp_path, case):
    if case == "under-a-file":
        blocker = tmp_path / "a-file"
        blocker.write_text("not a directory")
        data = named = blocker / "data"
    else:
        data = tmp_path / "data"
        named = data / ("leveret.db" if case == "db-is-a-directory" else "leveret.lock")
        named.mkdir(parents=True)
    result = run_server_expecting_failure(data)
    assert result.returncode != 0
    assert str(named) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to read-only directories")
def test_read_only_data_dir_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o500)
    try:
        result = run_server_expecting_failure(data)
    finally:
        data.chmod(0o700)
    assert result.returncode != 0
    assert str(data) in result.stderr, result.stderr


def test_corrupt_store_is_refused_by_name(start_server, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "leveret.db").write_bytes(os.urandom(64 * 1024))
    result = run_server_expecting_failure(data)
    assert result.returncode != 0
    assert "leveret.db" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_store_with_damaged_pages_is_refused_by_name(start_server, tmp_path):
    data = tmp_path / "data"
    server = start_server(data)
    conn = connect(server)
    ch = conn.channel()
    ch.queue_declare("q", durable=True)
    conn.close()
    publish_confirmed(server, "", "q", (make_body("x", i, 1000) for i in range(2000)))
    assert server.terminate() == 0
    db = data / "leveret.db"
    with open(db, "r+b") as f:  # keep the header page, damage the rest
        f.seek(4096)
        f.write(os.urandom(db.stat().st_size - 4096))
    result = run_server_expecting_failure(data)
    assert result.returncode != 0
    assert "leveret.db" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


# -- 4. space ---------------------------------------------------------------------------
def store_size(data: Path) -> int:
    return sum((data / name).stat().st_size for name in ("leveret.db", "leveret.db-wal")
               if (data / name).exists())


def test_space_of_acknowledged_messages_is_reclaimed_while_running(start_server, tmp_path):
    data = tmp_path / "data"
    server = start_server(data)
    conn = connect(server)
    conn.channel().queue_declare("big", durable=True)
    count = 50_000
    assert len(publish_confirmed(server, "", "big",
                                 (make_body("big", i, 4096) for i in range(count)))) == count
    peak = store_size(data)
    assert peak > count * 4096

    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    for received, (method, _, _) in enumerate(ch.consume("big", inactivity_timeout=5), 1):
        assert method is not None
        if received % 500 == 0:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if received == count:
            break
    ch.cancel()
    assert queue_count(conn, "big") == 0
    acked = time.monotonic()
    sizes = []
    while time.monotonic() - acked < 15:
        conn.process_data_events(0.25)
        sizes.append(store_size(data))
        if sizes[-1] < peak // 10:
            break
    reclaimed = time.monotonic() - acked
    assert sizes[-1] < peak // 10, f"peak {peak}, then {sizes[::4]}"
    # Still working, and nothing came back.
    conn.channel().basic_publish("", "big", b"after", PERSISTENT)
    assert get_one(conn, "big") == b"after"
    conn.close()
    assert server.terminate() == 0
    server.assert_clean_log()
    print(f"\nspace: peak {peak / 1e6:.0f} MB, {sizes[-1] / 1e6:.1f} MB {reclaimed:.1f}s after"
          " the last ack")


def evict_from_page_cache(directory: Path) -> None:
    """Drop the files of ``directory`` from the page cache, as after a host restart
    (POSIX_FADV_DONTNEED on clean pages; no root needed, other files untouched)."""
    for path in directory.iterdir():
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def test_kill_with_a_gigabyte_queued_restarts_in_seconds_with_a_cold_cache(start_server, tmp_path):
    """Recovery does not read the backlog: start-up after kill -9 with 1 GiB of
    persistent messages queued (16,384 × 64 KiB) and the store out of the page cache
    takes seconds; the messages are all there, in order."""
    data, count, size = tmp_path / "data", 16_384, 64 * 1024
    server = start_server(data)

    async def fill() -> None:
        client = await AsyncClient.connect(server.host, server.port)
        channel = await client.channel(confirm=True)
        await client.rpc(channel, commands.Queue.Declare(queue="backlog", durable=True))
        bodies = (make_body("gb", i, size) for i in range(count))
        tracker = await client.publish_many(channel, "", "backlog", bodies, window=256, timeout=300)
        assert len(tracker.acked()) == count and tracker.nacked == 0
        await client.close()

    started = time.monotonic()
    asyncio.run(fill())
    filled = time.monotonic() - started
    server.proc.kill()
    server.kill()
    evict_from_page_cache(data)
    started = time.monotonic()
    server = start_server(data)
    recovered = time.monotonic() - started
    print(f"\n1 GiB: filled in {filled:.1f} s, ready {recovered:.2f} s after kill -9 (cold cache)")
    assert recovered < 5, f"start-up took {recovered:.1f} s"
    conn = connect(server)
    ch = conn.channel()
    assert ch.queue_declare("backlog", durable=True, passive=True).method.message_count == count
    for expected in (0, 1):  # the head of the queue reads back intact
        _method, _, body = ch.basic_get("backlog", auto_ack=True)
        assert body_index(body) == ("gb", expected) and len(body) == size
    conn.close()
    server.terminate()
    server.assert_clean_log()
