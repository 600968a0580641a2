"""kombu (py-amqp transport) and a real celery worker against leveret over TCP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import amqp
import kombu
import pytest
from framework_brokers import close_celery_client
from kombu.simple import SimpleQueue


def kombu_url(broker) -> str:
    """kombu's form of the URL: the trailing ``//`` is the vhost ``/``."""
    return f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}//"


@pytest.fixture
def conn(leveret_broker) -> Iterator[kombu.Connection]:
    with kombu.Connection(kombu_url(leveret_broker), transport="pyamqp") as connection:
        connection.connect()
        yield connection


def drain(conn: kombu.Connection, received: list, count: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while len(received) < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"timed out with {len(received)} of {count}"
        try:
            conn.drain_events(timeout=remaining)
        except TimeoutError:
            pass


def serializer_available(name: str) -> bool:
    try:
        kombu.serialization.loads(*kombu.serialization.dumps({}, serializer=name), accept=[name])
    except Exception:  # the library behind it is not installed
        return False
    return True


def test_connects_with_py_amqp_transport(conn):
    assert conn.transport.driver_type == "amqp"
    assert isinstance(conn.connection, amqp.Connection)  # py-amqp underneath
    assert conn.connected
    server = conn.connection.server_properties
    assert server["product"] == "leveret"
    assert server["capabilities"]["publisher_confirms"] is True


def test_producer_consumer_round_trip_with_ack(conn):
    exchange = kombu.Exchange("media", type="direct", durable=True)
    video = kombu.Queue("video", exchange, routing_key="video")
    received = []

    def on_message(body, message):
        received.append((body, message.delivery_info["routing_key"], message.content_type))
        message.ack()

    producer = kombu.Producer(conn, exchange=exchange)
    for i in range(3):
        producer.publish({"n": i, "title": "clip"}, routing_key="video", declare=[video],
                         serializer="json")
    with kombu.Consumer(conn, queues=[video], callbacks=[on_message], prefetch_count=1):
        drain(conn, received, 3)
    assert received == [({"n": i, "title": "clip"}, "video", "application/json") for i in range(3)]
    assert video.bind(conn.default_channel).queue_declare(passive=True).message_count == 0


def test_serializers_and_compression(conn):
    queue = kombu.Queue("serial", kombu.Exchange("serial", "direct"), "serial")
    payloads = [("json", {"a": [1, 2]}), ("pickle", {"set": {1, 2}, "bytes": b"\x00"}),
                ("yaml", {"k": "v"}), ("msgpack", {"m": 1})]
    payloads = [(s, p) for s, p in payloads if serializer_available(s)]
    received = []
    with kombu.Consumer(conn, [queue], accept=[s for s, _ in payloads],
                        callbacks=[lambda body, m: (received.append(body), m.ack())]):
        producer = conn.Producer()
        for serializer, payload in payloads:
            producer.publish(payload, exchange=queue.exchange, routing_key="serial",
                             serializer=serializer, compression="zlib", declare=[queue])
        drain(conn, received, len(payloads))
    assert received == [p for _, p in payloads]


def test_publish_with_confirms(leveret_broker):
    with kombu.Connection(kombu_url(leveret_broker), transport_options={"confirm_publish": True}) as c:
        queue = kombu.Queue("confirmed-kombu")
        producer = c.Producer()
        for i in range(20):
            producer.publish({"i": i}, routing_key="confirmed-kombu", declare=[queue])
        assert queue.bind(c.default_channel).queue_declare(passive=True).message_count == 20


def test_reject_requeue_redelivers(conn):
    queue = kombu.Queue("flaky")
    conn.Producer().publish("job", routing_key="flaky", declare=[queue])
    seen = []

    def on_message(body, message):
        seen.append(message.delivery_info["redelivered"])
        if len(seen) == 1:
            message.requeue()
        else:
            message.ack()

    with kombu.Consumer(conn, [queue], callbacks=[on_message]):
        drain(conn, seen, 2)
    assert seen == [False, True]


def test_simple_queue_put_get(conn):
    queue: SimpleQueue = conn.SimpleQueue("simple")
    for i in range(5):
        queue.put({"i": i}, headers={"attempt": i})
    assert queue.qsize() == 5
    got = []
    for _ in range(5):
        message = queue.get(block=True, timeout=5)
        got.append((message.payload["i"], message.headers["attempt"]))
        message.ack()
    assert got == [(i, i) for i in range(5)]
    with pytest.raises(queue.Empty):
        queue.get(block=True, timeout=0.2)
    assert queue.qsize() == 0
    queue.close()


def test_simple_buffer_no_ack(conn):
    buffer = conn.SimpleBuffer("simple-buffer")
    buffer.put("fire-and-forget")
    assert buffer.get(timeout=5).payload == "fire-and-forget"
    buffer.close()


def test_fanout_broadcast_to_two_consumers(conn):
    exchange = kombu.Exchange("broadcast", type="fanout", auto_delete=True)
    queues = [kombu.Queue(f"bc-{i}", exchange, exclusive=True) for i in range(2)]
    received = []
    with kombu.Consumer(conn, queues, callbacks=[lambda body, m: (received.append(body), m.ack())]):
        conn.Producer().publish("hello all", exchange=exchange, declare=[exchange])
        drain(conn, received, 2)
    assert received == ["hello all", "hello all"]


# -- celery ---------------------------------------------------------------------------

CELERY_APP = '''
from celery import Celery

app = Celery("lvtasks", broker={broker!r}, backend="rpc://")
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_hijack_root_logger=False,
)


@app.task
def add(x, y):
    return x + y


@app.task
def fail():
    raise ValueError("boom")
'''


class CeleryWorker:
    """``celery -A lvtasks worker --pool=solo`` in a subprocess, stopped with SIGTERM."""

    FAST = ("--without-mingle", "--without-gossip")

    def __init__(self, module_dir: Path, broker_url: str, options: tuple[str, ...] = FAST) -> None:
        (module_dir / "lvtasks.py").write_text(textwrap.dedent(CELERY_APP.format(broker=broker_url)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(module_dir), *filter(None, [os.environ.get("PYTHONPATH")])]))
        self.log = module_dir / "worker.log"
        self._log_file = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "lvtasks", "worker", "--pool=solo",
             "-c", "1", "--loglevel=INFO", "-n", "lvworker@%h", *options],
            cwd=module_dir, env=env, stdout=self._log_file, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()


@pytest.fixture
def start_celery(leveret_broker, tmp_path, monkeypatch):
    """Start a worker with the given options; returns the imported task module."""
    started = []

    def start(options: tuple[str, ...] = CeleryWorker.FAST):
        worker = CeleryWorker(tmp_path, kombu_url(leveret_broker), options)
        monkeypatch.syspath_prepend(str(tmp_path))
        sys.modules.pop("lvtasks", None)
        import lvtasks
        started.append((worker, lvtasks))
        return lvtasks

    yield start
    for worker, module in started:
        close_celery_client(module.app)
        worker.stop()
        if worker.proc.returncode not in (0, -signal.SIGTERM):
            print(worker.log.read_text())
    sys.modules.pop("lvtasks", None)


@pytest.fixture
def celery_app(start_celery):
    return start_celery()


def test_celery_worker_runs_task_with_rpc_backend(celery_app):
    result = celery_app.add.delay(2, 3)
    assert result.get(timeout=20) == 5
    assert result.successful()
    # Several in flight at once, each answered through the rpc:// backend.
    results = [celery_app.add.delay(i, i) for i in range(10)]
    assert [r.get(timeout=10) for r in results] == [2 * i for i in range(10)]


def test_celery_task_failure_is_reported(celery_app):
    result = celery_app.fail.delay()
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=20)
    assert result.state == "FAILURE"


def test_celery_control_ping_through_pidbox(celery_app):
    """Remote control uses kombu's pidbox: a fanout exchange with a reply exchange."""
    celery_app.add.delay(1, 1).get(timeout=20)  # the worker is up
    replies = celery_app.app.control.ping(timeout=10, limit=1)  # returns on the first reply
    assert any("lvworker@" in name and reply == {"ok": "pong"}
               for r in replies for name, reply in r.items()), replies


def test_celery_worker_with_mingle_gossip_and_events(start_celery):
    """The default worker start-up: mingle (broadcast and wait for replies), gossip and
    task events (-E) on the celeryev topic exchange, with TTL/expiry queue arguments."""
    tasks = start_celery(("-E",))
    assert tasks.add.delay(20, 22).get(timeout=20) == 42
