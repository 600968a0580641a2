"""celery 5.x (kombu, py-amqp) end to end on leveret and on RabbitMQ 3.10, into the corners.

An in-process celery worker (``celery.contrib.testing.worker.start_worker``, solo pool)
runs the tasks of a fresh app per test, in a fresh vhost of the test's broker (the
``target`` fixture: a new leveret, or the session's private RabbitMQ node, skipped when
RabbitMQ is not installed). The app's task queue is a quorum queue bound to a topic
exchange, so celery (>= 5.5) and kombu set up kombu's *native delayed delivery*
(``kombu.transport.native_delayed_delivery``): 28 topic exchanges ``celery_delayed_N``
with a quorum queue each (``x-message-ttl`` 2^N s, ``x-overflow: reject-publish``,
dead-lettered to the next level), and ``apply_async(countdown=...)``, ``eta=`` and
``retry(countdown=...)`` publish to ``celery_delayed_27`` with the delay's 28 bits as
the first words of the routing key (``0.0.….1.0.<routing key>``). The broker holds the
message, the worker never does.

What is checked beside results: the topology as the management API shows it, where a
long delay waits (the queue of its highest bit), the routing key the task arrives
with, the order of tasks by ETA, and that tasks are not early.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery, chord, group
from celery.contrib.testing.worker import start_worker
from celery.worker import state as worker_state
from eventually import eventually
from framework_brokers import close_celery_client
from kombu import Exchange, Queue
from targets import Target

TASK_QUEUE = "jobs"
TASK_EXCHANGE = "jobs"
ROUTING_KEY = "jobs.run"
LEVELS = 28  # kombu's MAX_NUMBER_OF_BITS_TO_USE


def vhost_url(target: Target, vhost: str) -> str:
    return f"amqp://guest:guest@{target.host}:{target.amqp_port}/{urllib.parse.quote(vhost, safe='')}"


def delay_prefix(seconds: int) -> str:
    """The first 28 words of a native-delayed routing key: the delay's bits, highest first."""
    return ".".join(f"{seconds:0{LEVELS}b}")


def make_app(broker_url: str, quorum: bool = True, backend: str = "rpc://") -> Celery:
    """A celery app whose one task queue is a quorum (or classic) queue on a topic exchange,
    with results through ``rpc://`` (replies to the caller's own queue) by default."""
    app = Celery(f"fw-{time.monotonic_ns()}", broker=broker_url, backend=backend, set_as_current=False)
    arguments = {"x-queue-type": "quorum"} if quorum else {}
    app.conf.update(
        task_queues=[Queue(TASK_QUEUE, Exchange(TASK_EXCHANGE, type="topic"), routing_key=ROUTING_KEY,
                           queue_arguments=arguments)],
        task_default_queue=TASK_QUEUE,
        task_default_exchange=TASK_EXCHANGE,
        task_default_exchange_type="topic",
        task_default_routing_key=ROUTING_KEY,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=4,
        result_expires=None,
    )

    @app.task(bind=True, name=f"{app.main}.add")
    def add(self, x, y):
        return {"sum": x + y, "at": time.time(), "routing_key": self.request.delivery_info.get("routing_key")}

    @app.task(name=f"{app.main}.total")
    def total(results):
        return sum(r["sum"] for r in results)

    @app.task(bind=True, name=f"{app.main}.flaky", max_retries=5)
    def flaky(self, fail_times, countdown):
        if self.request.retries < fail_times:
            raise self.retry(countdown=countdown)
        return {"retries": self.request.retries, "at": time.time(),
                "routing_key": self.request.delivery_info.get("routing_key")}

    @app.task(name=f"{app.main}.stamp")
    def stamp(label):
        return {"label": label, "at": time.time()}

    return app


@contextmanager
def running_worker(app: Celery) -> Iterator[None]:
    """An in-process worker (solo pool) for ``app``, stopped at once on exit.

    ``start_worker`` stops its thread by setting ``should_terminate`` and joining; the
    worker only sees that flag when its event loop wakes, which is after up to 10 s of an
    idle poll, so the hub is woken here (``call_soon`` writes to its waker, which the
    loop makes when it starts: a worker stopped at once is first let reach its loop)."""
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=15) as worker:
        try:
            yield
        finally:
            worker_state.should_terminate = 0
            hub = getattr(worker, "hub", None)
            if hub is not None:
                eventually(lambda: hub._waker is not None, 5)
                hub.call_soon(lambda: None)


@pytest.fixture
def celery_app(target: Target, vhost: str) -> Iterator[Callable[..., Celery]]:
    """``start(quorum=True, backend="rpc://")``: a fresh app on the test's vhost, its
    worker running."""
    stack = []

    def start(quorum: bool = True, backend: str = "rpc://") -> Celery:
        app = make_app(vhost_url(target, vhost), quorum, backend)
        worker = running_worker(app)
        worker.__enter__()
        stack.append((app, worker))
        return app

    yield start
    for app, worker in reversed(stack):
        worker.__exit__(None, None, None)
        close_celery_client(app)


def http_json(target: Target, vhost: str, path: str):
    status, body = target.http("GET", path.format(vhost=urllib.parse.quote(vhost, safe="")))
    assert status == 200, (path, status, body)
    return body


def queue_messages(target: Target, vhost: str, name: str) -> int:
    """Messages in a queue, from a passive declare (the management API's counts lag)."""
    connection = target.amqp(vhost=vhost)
    try:
        return connection.channel().queue_declare(name, passive=True).method.message_count
    finally:
        connection.close()


# -- tasks, results, topology ---------------------------------------------------------
def test_task_runs_on_a_quorum_queue(target, vhost, celery_app):
    app = celery_app()
    result = app.tasks[f"{app.main}.add"].delay(2, 3).get(timeout=10)
    assert result["sum"] == 5
    assert result["routing_key"] == ROUTING_KEY  # no delay: straight to the task exchange
    queue = http_json(target, vhost, f"/api/queues/{{vhost}}/{TASK_QUEUE}")
    assert queue["type"] == "quorum"
    assert queue["arguments"]["x-queue-type"] == "quorum"
    # Several in flight at once, each answered through the rpc:// backend.
    results = [app.tasks[f"{app.main}.add"].delay(i, i) for i in range(20)]
    assert [r.get(timeout=10)["sum"] for r in results] == [2 * i for i in range(20)]


def test_native_delayed_delivery_topology(target, vhost, celery_app):
    """What the worker declares at start-up, as the management API reports it."""
    celery_app()
    for level in (0, 1, 13, 27):
        name = f"celery_delayed_{level}"
        exchange = http_json(target, vhost, f"/api/exchanges/{{vhost}}/{name}")
        assert exchange["type"] == "topic"
        queue = http_json(target, vhost, f"/api/queues/{{vhost}}/{name}")
        assert queue["type"] == "quorum"
        next_hop = f"celery_delayed_{level - 1}" if level else "celery_delayed_delivery"
        assert queue["arguments"] == {
            "x-queue-type": "quorum", "x-overflow": "reject-publish",
            "x-message-ttl": 2**level * 1000, "x-dead-letter-exchange": next_hop,
            "x-dead-letter-strategy": "at-least-once"}
        bindings = http_json(target, vhost, f"/api/exchanges/{{vhost}}/{name}/bindings/source")
        stars = "*." * (LEVELS - 1 - level)
        got = sorted((b["destination_type"], b["destination"], b["routing_key"]) for b in bindings)
        # A 1 bit: wait in this level's queue; a 0 bit: on to the next level at once
        # (from level 0: to the delivery exchange).
        expected = [("queue", name, f"{stars}1.#"), ("exchange", next_hop, f"{stars}0.#")]
        assert got == sorted(expected)
    delivery = http_json(target, vhost, "/api/exchanges/{vhost}/celery_delayed_delivery/bindings/source")
    assert [(b["destination_type"], b["destination"], b["routing_key"]) for b in delivery] == [
        ("exchange", TASK_EXCHANGE, f"#.{ROUTING_KEY}")]
    task_bindings = http_json(target, vhost, f"/api/exchanges/{{vhost}}/{TASK_EXCHANGE}/bindings/source")
    assert sorted(b["routing_key"] for b in task_bindings) == sorted([ROUTING_KEY, f"#.{ROUTING_KEY}"])


# -- countdown, ETA, retries -----------------------------------------------------------
def test_countdown_waits_in_the_broker(target, vhost, celery_app):
    app = celery_app()
    sent = time.time()
    result = app.tasks[f"{app.main}.add"].apply_async((1, 1), countdown=2)
    # 2 = 0b10: it waits in celery_delayed_1 (2 s), then celery_delayed_0 is skipped.
    assert eventually(lambda: queue_messages(target, vhost, "celery_delayed_1") == 1, 1.5)
    assert queue_messages(target, vhost, TASK_QUEUE) == 0
    done = result.get(timeout=10)
    assert done["sum"] == 2
    assert 1.9 <= done["at"] - sent < 4.0
    assert done["routing_key"] == f"{delay_prefix(2)}.{ROUTING_KEY}"


def test_eta_waits_in_the_broker(target, vhost, celery_app):
    app = celery_app()
    eta = datetime.now(UTC) + timedelta(seconds=3)
    done = app.tasks[f"{app.main}.add"].apply_async((4, 5), eta=eta).get(timeout=10)
    assert done["sum"] == 9
    # celery turns the ETA into whole seconds from now (int(countdown)): 2 or 3 s.
    assert eta.timestamp() - 1.1 <= done["at"] < eta.timestamp() + 1.5
    assert done["routing_key"].endswith(f".{ROUTING_KEY}")
    assert done["routing_key"].count(".") == LEVELS + ROUTING_KEY.count(".")


def test_tasks_arrive_in_eta_order(target, vhost, celery_app):
    """Published 3, 1, 2 s ahead: they run at 1, 2, 3 s, each through its own levels."""
    app = celery_app()
    stamp = app.tasks[f"{app.main}.stamp"]
    sent = time.time()
    results = {label: stamp.apply_async((label,), countdown=label) for label in (3, 1, 2)}
    done = {label: r.get(timeout=10) for label, r in results.items()}
    order = sorted(done, key=lambda label: done[label]["at"])
    assert order == [1, 2, 3]
    for label, answer in done.items():
        assert label - 0.1 <= answer["at"] - sent < label + 1.5


def test_long_countdown_waits_at_its_highest_bit(target, vhost, celery_app):
    """A 12-day delay (2^20 + 5 s) waits in celery_delayed_20, the queue of its top bit,
    having been routed through 7 exchanges by 28-word keys; nothing reaches the task."""
    app = celery_app()
    app.tasks[f"{app.main}.add"].apply_async((0, 0), countdown=2**20 + 5)
    assert eventually(lambda: queue_messages(target, vhost, "celery_delayed_20") == 1, 3)
    for level in (27, 21, 19, 2, 0):
        assert queue_messages(target, vhost, f"celery_delayed_{level}") == 0
    assert queue_messages(target, vhost, TASK_QUEUE) == 0


def test_retry_with_countdown_goes_through_the_delayed_topology(target, vhost, celery_app):
    """Two retries of 1 s each: the routing key keeps one delay prefix (kombu strips the
    previous one), and the task is not run early."""
    app = celery_app()
    sent = time.time()
    done = app.tasks[f"{app.main}.flaky"].apply_async((2, 1)).get(timeout=15)
    assert done["retries"] == 2
    assert done["at"] - sent >= 1.9
    assert done["routing_key"] == f"{delay_prefix(1)}.{ROUTING_KEY}"


def test_countdown_on_a_classic_queue_is_held_by_the_worker(target, vhost, celery_app):
    """Without quorum queues there is no native delayed delivery: the worker holds the
    message unacknowledged until its ETA (what consumer timeouts break)."""
    app = celery_app(quorum=False)
    sent = time.time()
    result = app.tasks[f"{app.main}.add"].apply_async((3, 4), countdown=2)
    # Published straight to the task queue; the worker took it at once and holds it
    # unacked: none ready, no result yet (a passive declare: RabbitMQ's management
    # counts lag by its statistics interval).
    time.sleep(1)
    assert queue_messages(target, vhost, TASK_QUEUE) == 0
    assert not result.ready()
    queue = http_json(target, vhost, f"/api/queues/{{vhost}}/{TASK_QUEUE}")
    assert queue["type"] == "classic"
    done = result.get(timeout=10)
    assert done == {"sum": 7, "at": done["at"], "routing_key": ROUTING_KEY}
    assert done["at"] - sent >= 1.9
    # No native delayed delivery without quorum queues: celery_delayed_27 is not declared.
    quoted = urllib.parse.quote(vhost, safe="")
    assert target.http("GET", f"/api/exchanges/{quoted}/celery_delayed_27")[0] == 404


# -- canvas: groups and chords with rpc:// ------------------------------------------------
def test_group_with_rpc_backend(celery_app):
    app = celery_app()
    add = app.tasks[f"{app.main}.add"]
    results = group(add.s(i, 10 * i) for i in range(8)).apply_async().get(timeout=15)
    assert [r["sum"] for r in results] == [11 * i for i in range(8)]


def test_chord_with_rpc_backend_is_refused_by_celery(celery_app):
    """celery's rpc:// backend has no chords (the results go to the caller, where no
    task can join them): refused before anything is sent, on any broker."""
    app = celery_app()
    add, total = app.tasks[f"{app.main}.add"], app.tasks[f"{app.main}.total"]
    with pytest.raises(NotImplementedError, match="does not support chords"):
        chord(add.s(i, i) for i in range(6))(total.s())


def test_chord_with_a_result_store(celery_app):
    """A chord needs a backend that stores results: the in-process memory cache (the
    worker is in this process) with the tasks still on the broker's quorum queue."""
    app = celery_app(backend="cache+memory://")
    add, total = app.tasks[f"{app.main}.add"], app.tasks[f"{app.main}.total"]
    assert chord(add.s(i, i) for i in range(6))(total.s()).get(timeout=15) == 30
    # A chord whose header tasks are delayed: the body waits for the last of them.
    sent = time.time()
    header = [add.s(i, 1).set(countdown=1 + i % 2) for i in range(4)]
    assert chord(header)(total.s()).get(timeout=15) == 10
    assert time.time() - sent >= 1.9


def test_group_of_countdowns(celery_app):
    """A group whose members are delayed: each goes through the delayed topology."""
    app = celery_app()
    add = app.tasks[f"{app.main}.add"]
    sent = time.time()
    results = group(add.s(i, i).set(countdown=1 + i % 2) for i in range(4)).apply_async().get(timeout=15)
    assert [r["sum"] for r in results] == [0, 2, 4, 6]
    for i, r in enumerate(results):
        assert r["routing_key"] == f"{delay_prefix(1 + i % 2)}.{ROUTING_KEY}"
        assert r["at"] - sent >= 0.9 + i % 2


# -- workers come and go -----------------------------------------------------------------
def test_delayed_task_waits_for_a_worker(target, vhost):
    """The broker holds a countdown task whatever the workers do: sent with no worker
    running, it reaches the task queue when due and waits there; a worker started
    later runs it."""
    app = make_app(vhost_url(target, vhost))
    try:
        with running_worker(app):  # declares the topology, then stops
            pass
        sent = time.time()
        result = app.tasks[f"{app.main}.add"].apply_async((5, 5), countdown=1)
        assert eventually(lambda: queue_messages(target, vhost, TASK_QUEUE) == 1, 5)
        assert time.time() - sent >= 0.9
        with running_worker(app):
            assert result.get(timeout=10)["sum"] == 10
        assert queue_messages(target, vhost, TASK_QUEUE) == 0
    finally:
        close_celery_client(app)


def test_classic_queue_eta_task_returns_when_its_worker_stops(target, vhost):
    """Held unacked by a worker (no native delays on a classic queue), an ETA task goes
    back to the queue when that worker stops, and the next worker runs it when due."""
    app = make_app(vhost_url(target, vhost), quorum=False)
    try:
        sent = time.time()
        with running_worker(app):
            result = app.tasks[f"{app.main}.add"].apply_async((6, 6), countdown=3)
            time.sleep(1)
            assert queue_messages(target, vhost, TASK_QUEUE) == 0  # taken, held unacked
            assert not result.ready()
        assert eventually(lambda: queue_messages(target, vhost, TASK_QUEUE) == 1, 5)
        with running_worker(app):
            done = result.get(timeout=10)
        assert done["sum"] == 12
        assert done["at"] - sent >= 2.9
    finally:
        close_celery_client(app)
