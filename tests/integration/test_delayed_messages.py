"""Delayed and scheduled messages over real TCP: RabbitMQ's delayed-message exchange
(``x-delayed-message``; the plugin is not in Debian's RabbitMQ, so these follow its
documented behaviour), ActiveMQ's ``AMQ_SCHEDULED_*`` headers from AMQP and STOMP
publishers, and the durability of pending jobs across a ``kill -9``."""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, UnroutableError
from servers import ServerProcess
from stomp_clients import Client

from leveret import BlockingBroker
from leveret.core import scheduler as scheduler_module
from leveret.core.auth import Permission, User


@pytest.fixture
def broker():
    with BlockingBroker(amqp_port=0, stomp_port=0) as running:
        yield running


def connect(url: str) -> tuple[pika.BlockingConnection, pika.adapters.blocking_connection.BlockingChannel]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    return connection, channel


#: How late a delivery may be in these tests: they run beside other work on a small
#: machine (lateness itself is measured by bench/delayed_bench.py).
SLACK = 1.0


def collect(
    connection, channel, queue: str, count: int, timeout: float = 5.0, start: float | None = None
) -> list[tuple[bytes, float, dict]]:
    """(body, seconds since ``start`` (monotonic; default: the call), headers) of
    ``count`` deliveries, then a short wait in which nothing more may come."""
    got: list[tuple[bytes, float, dict]] = []
    start = time.monotonic() if start is None else start
    tag = channel.basic_consume(
        queue,
        lambda _c, _m, p, body: got.append((body, time.monotonic() - start, p.headers or {})),
        auto_ack=True,
    )
    deadline = start + timeout
    while len(got) < count and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.02)
    connection.process_data_events(time_limit=0.3)
    channel.basic_cancel(tag)
    return got


def delayed_exchange(channel, name: str = "delayed", kind: str = "direct") -> None:
    channel.exchange_declare(name, "x-delayed-message", arguments={"x-delayed-type": kind})


# -- the delayed-message exchange ---------------------------------------------------------
def test_messages_come_out_when_due_whatever_the_order_they_went_in(broker):
    connection, ch = connect(broker.amqp_url)
    delayed_exchange(ch)
    ch.queue_declare("q")
    ch.queue_bind("q", "delayed", "k")
    published = time.monotonic()
    for delay in (600, 200, 400, 0):  # a long delay does not hold back a short one
        ch.basic_publish("delayed", "k", b"%d" % delay, pika.BasicProperties(headers={"x-delay": delay}))
    got = collect(connection, ch, "q", 4, start=published)
    assert [body for body, _, _ in got] == [b"0", b"200", b"400", b"600"]
    for body, elapsed, headers in got[1:]:
        delay = int(body) / 1000
        assert delay <= elapsed <= delay + SLACK, (body, elapsed)  # never early
        assert headers["x-delay"] == -int(body)  # negated on delivery, as the plugin does
    assert got[0][2]["x-delay"] == 0  # not delayed: routed as it came


@pytest.mark.parametrize(
    ("header", "delayed"), [("1500", True), (-1500, False), ("soon", False), (None, False)]
)
def test_the_x_delay_header_is_read_as_the_plugin_reads_it(broker, header, delayed):
    connection, ch = connect(broker.amqp_url)
    delayed_exchange(ch)
    ch.queue_declare("q")
    ch.queue_bind("q", "delayed", "k")
    headers = {} if header is None else {"x-delay": header}
    published = time.monotonic()
    ch.basic_publish("delayed", "k", b"m", pika.BasicProperties(headers=headers))
    ((_, elapsed, _),) = collect(connection, ch, "q", 1, start=published)
    assert (elapsed >= 1.5) == delayed


def test_routing_happens_when_due_with_the_bindings_of_that_moment(broker):
    connection, ch = connect(broker.amqp_url)
    delayed_exchange(ch, "delayed-topic", "topic")
    ch.queue_declare("early")
    ch.queue_declare("late")
    ch.queue_bind("early", "delayed-topic", "orders.*")
    ch.basic_publish("delayed-topic", "orders.eu", b"x", pika.BasicProperties(headers={"x-delay": 300}))
    ch.queue_unbind("early", "delayed-topic", "orders.*")
    ch.queue_bind("late", "delayed-topic", "orders.#")
    assert [body for body, _, _ in collect(connection, ch, "late", 1)] == [b"x"]
    assert ch.queue_declare("early", passive=True).method.message_count == 0


def test_a_delayed_exchange_needs_a_routing_type(broker):
    connection, ch = connect(broker.amqp_url)
    for arguments in ({}, {"x-delayed-type": "nope"}, {"x-delayed-type": "x-delayed-message"}):
        with pytest.raises(ChannelClosedByBroker) as refused:
            ch.exchange_declare("bad", "x-delayed-message", arguments=arguments)
        assert refused.value.reply_code == 406
        assert refused.value.reply_text == (
            "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type"
        )
        ch = connection.channel()


def test_jobs_beyond_the_memory_window_come_back_from_the_store_in_order(tmp_path, monkeypatch):
    monkeypatch.setattr(scheduler_module, "WINDOW", 20)
    monkeypatch.setattr(scheduler_module, "EVICT_SLACK", 20)
    monkeypatch.setattr(scheduler_module, "READ_BATCH", 7)
    with BlockingBroker(amqp_port=0, data_dir=tmp_path / "data") as running:
        connection, ch = connect(running.amqp_url)
        delayed_exchange(ch)
        ch.queue_declare("q", durable=True)
        ch.queue_bind("q", "delayed", "k")
        # 120 jobs (6 times the window), 20 ms apart in a shuffled order, published in
        # one burst (no confirms): they come out in the order of their delays, but for
        # neighbours the burst's own spread may swap (a busy machine takes 100 ms for it)
        delays = [500 + ((i * 37) % 120) * 20 for i in range(120)]
        burst = connection.channel()
        start = time.monotonic()
        for i, delay in enumerate(delays):
            burst.basic_publish("delayed", "k", b"%d" % i, pika.BasicProperties(headers={"x-delay": delay}))
        ch.queue_declare("q", durable=True)  # a round trip: the burst was read
        spread = time.monotonic() - start
        scheduler = running.core.scheduler
        assert running.call(lambda: scheduler.pending) == 120
        assert running.call(lambda: len(scheduler._memory)) <= 2 * 20
        got = collect(connection, ch, "q", 120, timeout=10, start=start)
        order = [int(body) for body, _, _ in got]
        assert sorted(order) == list(range(120))
        for earlier, later in itertools.pairwise(order):
            assert delays[earlier] <= delays[later] + spread * 1000, (earlier, later, spread)
        for body, elapsed, _ in got:
            assert elapsed >= delays[int(body)] / 1000  # never early


# -- ActiveMQ's scheduler -------------------------------------------------------------------
def test_activemq_delay_period_and_repeat_from_an_amqp_publisher(broker):
    connection, ch = connect(broker.amqp_url)
    ch.queue_declare("jobs")
    headers = {
        "AMQ_SCHEDULED_DELAY": 200,
        "AMQ_SCHEDULED_PERIOD": 150,
        "AMQ_SCHEDULED_REPEAT": 2,
        "kept": "yes",
    }
    published = time.monotonic()
    ch.basic_publish("", "jobs", b"tick", pika.BasicProperties(message_id="job-1", headers=headers))
    got = collect(connection, ch, "jobs", 3, start=published)
    assert len(got) == 3  # REPEAT 2: three deliveries
    for (_, elapsed, _), due in zip(got, (0.2, 0.35, 0.5), strict=True):
        assert due <= elapsed <= due + SLACK  # each at its time, never early
    for _, _, delivered in got:
        assert delivered == {"kept": "yes", "scheduledJobId": "job-1"}  # AMQ_SCHEDULED_* removed


def test_bad_schedule_headers_are_refused(broker):
    _connection, ch = connect(broker.amqp_url)
    ch.queue_declare("jobs")
    with pytest.raises(ChannelClosedByBroker) as refused:
        ch.basic_publish("", "jobs", b"x", pika.BasicProperties(headers={"AMQ_SCHEDULED_CRON": "every day"}))
    assert refused.value.reply_code == 406
    assert "AMQ_SCHEDULED_CRON" in refused.value.reply_text


def test_a_transaction_with_a_bad_schedule_is_refused_at_the_publish(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    ch = connection.channel()
    ch.queue_declare("jobs")
    ch.tx_select()
    ch.basic_publish("", "jobs", b"first")
    with pytest.raises(ChannelClosedByBroker) as refused:  # not half-way through tx.commit
        ch.basic_publish("", "jobs", b"bad", pika.BasicProperties(headers={"AMQ_SCHEDULED_DELAY": "soon"}))
        ch.tx_commit()
    assert refused.value.reply_code == 406
    assert connection.channel().queue_declare("jobs", passive=True).method.message_count == 0  # rolled back


def test_an_unscheduled_mandatory_message_is_still_returned(broker):
    connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
    ch = connection.channel()
    ch.confirm_delivery()
    headers = {"AMQ_SCHEDULED_DELAY": 0}  # no schedule: routed now, returned when it cannot be
    with pytest.raises(UnroutableError) as returned:
        properties = pika.BasicProperties(headers=headers)
        ch.basic_publish("amq.direct", "nobody", b"lost?", properties, mandatory=True)
    assert [message.body for message in returned.value.messages] == [b"lost?"]


def test_stomp_send_with_a_delay_arrives_later_with_its_job_id(broker):
    port = broker.broker.stomp_port
    with Client(port) as consumer, Client(port) as producer:
        consumer.subscribe("/queue/later")
        start = time.monotonic()
        producer.send("/queue/later", "hello", AMQ_SCHEDULED_DELAY="300", persistent="true")
        consumer.no_message(within=0.2)
        frame = consumer.message()
        assert time.monotonic() - start >= 0.28
        assert frame.body == b"hello"
        assert frame.headers["scheduledJobId"] == frame.headers["message-id"]
        assert "AMQ_SCHEDULED_DELAY" not in frame.headers
        producer.conn.send("/queue/later", "bad", headers={"AMQ_SCHEDULED_REPEAT": "often"})
        assert "AMQ_SCHEDULED_REPEAT" in producer.error().headers["message"]


def test_a_job_can_be_listed_and_cancelled(broker):
    connection, ch = connect(broker.amqp_url)
    ch.queue_declare("jobs")
    ch.basic_publish(
        "",
        "jobs",
        b"x",
        pika.BasicProperties(
            message_id="cancel-me",
            headers={"AMQ_SCHEDULED_DELAY": 300, "AMQ_SCHEDULED_PERIOD": 100, "AMQ_SCHEDULED_REPEAT": -1},
        ),
    )
    scheduler = broker.core.scheduler
    (info,) = [job for job in scheduler.jobs() if job.job_id == "cancel-me"]
    assert (info.routing_key, info.delay, info.period, info.repeat) == ("jobs", 300, 100, -1)
    assert broker.call(lambda: scheduler.cancel("cancel-me")) is True
    assert collect(connection, ch, "jobs", 1, timeout=0.6) == []
    assert scheduler.job("cancel-me") is None


# -- durability ---------------------------------------------------------------------------
def test_pending_jobs_survive_a_kill_and_fire_at_their_time(tmp_path):
    data = tmp_path / "data"
    server = ServerProcess(data)
    try:
        connection, ch = connect(server.url)
        delayed_exchange(ch)
        ch.exchange_declare(
            "delayed-durable", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"}
        )
        ch.queue_declare("q", durable=True)
        ch.queue_bind("q", "delayed-durable", "k")
        persistent = pika.BasicProperties(delivery_mode=2, headers={"x-delay": 500})
        transient = pika.BasicProperties(delivery_mode=1, headers={"x-delay": 500})
        later = pika.BasicProperties(delivery_mode=2, headers={"x-delay": 4000})
        ch.basic_publish("delayed-durable", "k", b"due-during-restart", persistent)
        ch.basic_publish("delayed-durable", "k", b"transient", transient)
        published = time.monotonic()  # (before the publish: the broker's clock starts later)
        ch.basic_publish("delayed-durable", "k", b"due-later", later)
        server.kill()  # each publish above was confirmed
        time.sleep(0.6)  # the first falls due while the broker is down
        server = ServerProcess(data)
        connection, ch = connect(server.url)
        start = time.monotonic()
        got = collect(connection, ch, "q", 2, timeout=6)
        assert [body for body, _, _ in got] == [b"due-during-restart", b"due-later"]
        assert got[0][1] < 0.5  # at once after the restart
        late = start + got[1][1] - published  # seconds after its publish
        assert 4.0 <= late <= 4.0 + SLACK  # at its time, not early
    finally:
        server.kill()


def scheduler_cli(data, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "leveret", "scheduler", "--data-dir", str(data), "-q", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_leveret_scheduler_lists_shows_and_cancels_jobs(tmp_path):
    data = tmp_path / "data"
    server = ServerProcess(data)
    try:
        _connection, ch = connect(server.url)
        ch.queue_declare("reports", durable=True)
        for job_id, delay in (("nightly", 60_000), ("hourly", 30_000)):
            headers = {"AMQ_SCHEDULED_DELAY": delay, "AMQ_SCHEDULED_PERIOD": 1000, "AMQ_SCHEDULED_REPEAT": 4}
            ch.basic_publish(
                "",
                "reports",
                b"run",
                pika.BasicProperties(message_id=job_id, delivery_mode=2, headers=headers),
            )
        listing = scheduler_cli(data, "list")
        assert listing.returncode == 0, listing.stderr
        header, *lines = [line.split("\t") for line in listing.stdout.splitlines()]
        assert header[:4] == ["job_id", "vhost", "exchange", "routing_key"]
        assert [(line[0], line[3], line[5], line[6], line[7]) for line in lines] == [
            ("hourly", "reports", "30000", "1000", "4"),  # the soonest due first
            ("nightly", "reports", "60000", "1000", "4"),
        ]
        shown = scheduler_cli(data, "show", "nightly")
        assert "persistent\ttrue" in shown.stdout
        cancelled = scheduler_cli(data, "cancel", "nightly")
        assert cancelled.returncode == 0, cancelled.stderr
        missing = scheduler_cli(data, "cancel", "nightly")
        assert missing.returncode == 1 and "no scheduled job 'nightly'" in missing.stderr
        server.kill()
        server = ServerProcess(data)  # the cancellation was kept, the other job too
        after = scheduler_cli(data, "list")
        assert [line.split("\t")[0] for line in after.stdout.splitlines()[1:]] == ["hourly"]
    finally:
        server.kill()


def http(url: str, method: str, path: str, user: str = "guest") -> tuple[int, object]:
    request = urllib.request.Request(url.rstrip("/") + path, method=method)
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{user}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
            return response.status, json.loads(body) if body else None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def test_the_http_api_lists_shows_and_cancels_jobs():
    with BlockingBroker(amqp_port=0, http_port=0) as running:
        running.call(lambda: running.core.add_user(User.with_password("reader", "reader", ["management"])))
        running.call(lambda: running.core.set_permission("reader", "/", Permission(".*", "^$", ".*")))
        _connection, ch = connect(running.amqp_url)
        ch.queue_declare("reports")
        headers = {"AMQ_SCHEDULED_DELAY": 60_000}
        ch.basic_publish("", "reports", b"run", pika.BasicProperties(message_id="weekly", headers=headers))
        url = running.http_url
        status, jobs = http(url, "GET", "/api/scheduled-jobs/%2F")
        assert status == 200 and [(j["job_id"], j["routing_key"], j["delay"]) for j in jobs] == [
            ("weekly", "reports", 60_000)
        ]
        assert http(url, "GET", "/api/scheduled-jobs/%2F/weekly")[1]["exchange"] == ""
        refused = http(url, "DELETE", "/api/scheduled-jobs/%2F/weekly", user="reader")
        assert refused[0] == 401  # may not publish to the job's exchange
        assert http(url, "DELETE", "/api/scheduled-jobs/%2F/weekly") == (204, None)
        assert http(url, "GET", "/api/scheduled-jobs/%2F/weekly")[0] == 404
        assert http(url, "GET", "/api/scheduled-jobs")[1] == []
