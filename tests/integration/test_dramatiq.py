"""dramatiq with its RabbitmqBroker (pika) and an in-process Worker, against leveret and
a RabbitMQ 3.10 node: actors, delays through the ``.DQ`` queues, queue priorities,
retries with back-off, dead letters in ``.XQ`` and results.

Each test builds its own broker object and actors (dramatiq keeps actors per broker), on
queues with unique names, since the RabbitMQ node is shared by the session.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import AgeLimit, Callbacks, Pipelines, Retries, TimeLimit
from dramatiq.results import Results
from dramatiq.results.backends import StubBackend
from framework_brokers import AmqpBroker, _amqp_broker, _framework_rabbitmq, unique, wait_for  # noqa: F401 (fixtures)

pytestmark = pytest.mark.timeout(60)


def make_broker(amqp: AmqpBroker, *, max_priority: int | None = None, results: bool = False,
                min_backoff: int = 50, max_backoff: int = 200) -> RabbitmqBroker:
    """A RabbitmqBroker with dramatiq's default middleware, Retries' back-off (ms) set low
    and, if asked, the Results middleware on an in-memory backend (the broker is real)."""
    middleware = [AgeLimit(), TimeLimit(), Callbacks(), Pipelines(),
                  Retries(min_backoff=min_backoff, max_backoff=max_backoff, max_retries=20)]
    if results:
        middleware.append(Results(backend=StubBackend()))
    broker = RabbitmqBroker(url=amqp.url, max_priority=max_priority, middleware=middleware,
                            confirm_delivery=True)
    dramatiq.set_broker(broker)
    return broker


@contextmanager
def running(broker: RabbitmqBroker, threads: int = 2) -> Iterator[dramatiq.Worker]:
    """A dramatiq Worker in this process (consumers poll every 50 ms)."""
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=50)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(timeout=5000)
        broker.close()


@pytest.fixture
def amqp(amqp_broker: AmqpBroker) -> Iterator[AmqpBroker]:
    yield amqp_broker


def cleanup(amqp: AmqpBroker, queue: str) -> None:
    amqp.delete_queues(queue, f"{queue}.DQ", f"{queue}.XQ")


def recorder(broker: RabbitmqBroker, queue: str, into: list) -> dramatiq.Actor:
    """An actor on ``queue`` that appends its one argument to ``into``."""

    @dramatiq.actor(queue_name=queue, broker=broker)
    def record(n):
        into.append(n)

    return record


def test_actor_messages_are_processed_and_acked(amqp):
    broker = make_broker(amqp)
    queue, done = unique("dq-basic"), []

    @dramatiq.actor(queue_name=queue, broker=broker)
    def add(x, y):
        done.append(x + y)

    for i in range(20):
        add.send(i, 1)
    assert amqp.message_count(queue) == 20  # declared with its .DQ and .XQ, all waiting
    with running(broker):
        wait_for(lambda: len(done) == 20, what="20 messages")
        broker.join(queue, timeout=5000)  # dramatiq's own check: queue and .DQ empty
    assert sorted(done) == [i + 1 for i in range(20)]
    assert amqp.message_count(queue) == 0
    assert amqp.message_count(f"{queue}.XQ") == 0
    cleanup(amqp, queue)


def test_delayed_message_waits_in_dq_then_runs(amqp):
    broker = make_broker(amqp)
    queue, ran_at = unique("dq-delay"), []

    @dramatiq.actor(queue_name=queue, broker=broker)
    def later():
        ran_at.append(time.monotonic())

    with running(broker):
        sent = time.monotonic()
        message = later.send_with_options(delay=400)
        assert message.queue_name == f"{queue}.DQ"  # the delay queue, with an eta option
        assert message.options["eta"] > 0
        # the worker holds it unacked on the .DQ consumer until the eta, then enqueues
        # it on the canonical queue and acks the delayed copy
        wait_for(lambda: ran_at, what="the delayed message")
        later.send()  # an undelayed one right after runs at once
        wait_for(lambda: len(ran_at) == 2, what="the immediate message")
    assert ran_at[0] - sent >= 0.4
    assert amqp.message_count(f"{queue}.DQ") == 0
    cleanup(amqp, queue)


def test_many_delays_come_out_in_eta_order(amqp):
    broker = make_broker(amqp)
    queue, order = unique("dq-etas"), []
    tick = recorder(broker, queue, order)

    delays = [600, 100, 400, 200, 500, 300]
    with running(broker, threads=1):
        # the etas count from the sends: first make sure both consumers (NAME.DQ and
        # NAME) are up, with one message through them
        tick.send_with_options(args=(-1,), delay=1)
        wait_for(lambda: order == [-1], what="the warm-up message")
        order.clear()
        for n, delay in enumerate(delays):
            tick.send_with_options(args=(n,), delay=delay)
        wait_for(lambda: len(order) == len(delays), what="all delayed messages")
    assert order == sorted(range(len(delays)), key=lambda n: delays[n])
    cleanup(amqp, queue)


def test_higher_broker_priority_is_consumed_first(amqp):
    broker = make_broker(amqp, max_priority=10)
    queue, order = unique("dq-prio"), []
    job = recorder(broker, queue, order)

    for n, priority in enumerate([0, 1, 9, 5, 9, 3, 0, 7]):
        job.send_with_options(args=(n,), broker_priority=priority)
    with running(broker, threads=1):
        wait_for(lambda: len(order) == 8, what="8 messages")
    # x-max-priority queue: highest first, FIFO within a priority
    assert order == [2, 4, 7, 3, 5, 1, 0, 6]
    cleanup(amqp, queue)


def test_retries_back_off_through_dq_until_success(amqp):
    broker = make_broker(amqp, min_backoff=100, max_backoff=400)
    queue, attempts = unique("dq-retry"), []

    @dramatiq.actor(queue_name=queue, broker=broker, max_retries=5)
    def flaky():
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise RuntimeError("not yet")

    with running(broker), _quiet_dramatiq():
        message = flaky.send()
        wait_for(lambda: len(attempts) == 3, what="3 attempts")
        broker.join(queue, timeout=5000)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert all(gap >= 0.1 for gap in gaps), gaps  # each retry waited its back-off in .DQ
    assert amqp.message_count(queue) == amqp.message_count(f"{queue}.XQ") == 0
    assert message.options == {}  # the caller's copy; the retries carried their own
    cleanup(amqp, queue)


def test_exhausted_retries_dead_letter_into_xq(amqp):
    broker = make_broker(amqp, min_backoff=20, max_backoff=40)
    queue, attempts = unique("dq-dead"), []

    @dramatiq.actor(queue_name=queue, broker=broker, max_retries=2)
    def doomed(n):
        attempts.append(n)
        raise ValueError(f"no {n}")

    with running(broker), _quiet_dramatiq():
        doomed.send(7)
        wait_for(lambda: len(attempts) == 3, what="1 try and 2 retries")
        # the last failure is nacked (requeue=False) and the queue's dead-letter
        # arguments (exchange "", routing key NAME.XQ) move it to the .XQ queue
        wait_for(lambda: amqp.message_count(f"{queue}.XQ") == 1, what="the dead letter")
    assert attempts == [7, 7, 7]
    assert amqp.message_count(queue) == amqp.message_count(f"{queue}.DQ") == 0
    dead = _get_one(amqp, f"{queue}.XQ")
    assert dead["actor_name"] == "doomed" and dead["args"] == [7]
    # the body as last enqueued (by the second retry): dramatiq does not rewrite it on nack
    assert dead["options"]["retries"] == 2
    assert "no 7" in dead["options"]["traceback"]
    cleanup(amqp, queue)


def test_results_and_pipelines(amqp):
    broker = make_broker(amqp, results=True)
    queue = unique("dq-results")

    @dramatiq.actor(queue_name=queue, broker=broker, store_results=True)
    def double(x):
        return 2 * x

    @dramatiq.actor(queue_name=queue, broker=broker, store_results=True)
    def plus(x, y):
        return x + y

    with running(broker):
        assert double.send(21).get_result(block=True, timeout=10_000) == 42
        pipe = dramatiq.pipeline([double.message(5), plus.message(1)], broker=broker).run()
        assert pipe.get_result(block=True, timeout=10_000) == 11
        group = dramatiq.group([double.message(i) for i in range(5)], broker=broker).run()
        assert list(group.get_results(block=True, timeout=10_000)) == [0, 2, 4, 6, 8]
    cleanup(amqp, queue)


def test_worker_stopped_mid_delay_returns_the_message(amqp):
    """A worker that stops while it holds a delayed message unacked (dramatiq's .DQ
    design) closes its channel; the message returns to .DQ, and the next worker runs it."""
    broker = make_broker(amqp)
    queue, ran = unique("dq-return"), []

    @dramatiq.actor(queue_name=queue, broker=broker)
    def slow_start():
        ran.append(True)

    with running(broker):
        slow_start.send_with_options(delay=60_000)  # held by this worker, not yet due
        wait_for(lambda: _consumers_hold(broker, f"{queue}.DQ"), what="the .DQ consumer")
    assert amqp.message_count(f"{queue}.DQ") == 1 and not ran  # back, ready, unrun
    cleanup(amqp, queue)


def test_mixed_load_each_message_succeeds_once(amqp):
    """200 messages at once on 8 worker threads: immediate ones, delayed ones (0-500 ms)
    and ones failing their first attempt; each succeeds exactly once, nothing is left."""
    broker = make_broker(amqp, min_backoff=20, max_backoff=100)
    queue = unique("dq-load")
    succeeded: list[int] = []
    failed_once: set[int] = set()
    lock = threading.Lock()

    @dramatiq.actor(queue_name=queue, broker=broker, max_retries=3)
    def work(n, fail_first):
        with lock:
            if fail_first and n not in failed_once:
                failed_once.add(n)
                raise RuntimeError("first try")
            succeeded.append(n)

    with running(broker, threads=8), _quiet_dramatiq():
        for n in range(200):
            if n % 4 == 1:
                work.send_with_options(args=(n, False), delay=(n * 7) % 500)
            else:
                work.send(n, n % 4 == 2)
        wait_for(lambda: len(succeeded) == 200, timeout=15, what="200 successes")
        broker.join(queue, timeout=5000)
    assert sorted(succeeded) == list(range(200))
    assert failed_once == {n for n in range(200) if n % 4 == 2}
    assert [amqp.message_count(f"{queue}{suffix}") for suffix in ("", ".DQ", ".XQ")] == [0, 0, 0]
    cleanup(amqp, queue)


def test_enqueue_redeclares_a_queue_deleted_behind_its_back(amqp):
    """With confirm_delivery, dramatiq publishes mandatory: the broker returns the message
    (basic.return, 312 NO_ROUTE) before its confirm, pika raises UnroutableError, and
    dramatiq declares the queue again and resends."""
    broker = make_broker(amqp)
    queue = unique("dq-gone")

    @dramatiq.actor(queue_name=queue, broker=broker)
    def job(n):
        pass

    job.send(1)
    amqp.delete_queues(queue)  # dramatiq still counts it as declared
    job.send(2)
    assert amqp.message_count(queue) == 1
    assert broker.get_queue_message_counts(queue) == (1, 0, 0)
    broker.close()
    cleanup(amqp, queue)


def test_flush_all_purges_queue_dq_and_xq(amqp):
    broker = make_broker(amqp)
    queue = unique("dq-flush")

    @dramatiq.actor(queue_name=queue, broker=broker)
    def job():
        pass

    for _ in range(3):
        job.send()
    job.send_with_options(delay=60_000)
    assert broker.get_queue_message_counts(queue) == (3, 1, 0)
    broker.flush_all()
    assert broker.get_queue_message_counts(queue) == (0, 0, 0)
    broker.close()
    cleanup(amqp, queue)


def _consumers_hold(broker: RabbitmqBroker, queue: str) -> bool:
    """True once the worker's consumer of ``NAME.DQ`` has taken its message (none ready)."""
    return broker.get_queue_message_counts(queue.removesuffix(".DQ"))[1] == 0


def _get_one(amqp: AmqpBroker, queue: str) -> dict:
    import json

    import pika

    with pika.BlockingConnection(pika.URLParameters(amqp.url)) as connection:
        method, _, body = connection.channel().basic_get(queue, auto_ack=True)
        assert method is not None, f"{queue} is empty"
        return json.loads(body)


@contextmanager
def _quiet_dramatiq() -> Iterator[None]:
    """Failing actors log their tracebacks at ERROR/WARNING; keep the test output clean."""
    import logging

    logger = logging.getLogger("dramatiq")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)

