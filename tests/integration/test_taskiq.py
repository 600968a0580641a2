"""taskiq with taskiq-aio-pika's AioPikaBroker against leveret and a RabbitMQ 3.10 node:
tasks and their results, errors, retries (SimpleRetryMiddleware), routing to several
queues, priorities, and both ways it delays a task: its TTL-and-dead-letter delay queue
and the delayed-message exchange (leveret's built-in ``x-delayed-message``; RabbitMQ
3.10 here has not the plugin).

The worker runs in this process: ``taskiq.api.run_receiver_task`` on the same broker
object (``is_worker_process`` set before ``startup``, so it also opens its reading
connection), with taskiq's in-memory result backend, shared by kicker and worker since
they are one process (no result server needed). Exchanges and queues have unique names,
since the RabbitMQ node is shared by the session.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiormq
import pytest
from framework_brokers import AmqpBroker, _amqp_broker, _framework_rabbitmq, run, unique, until  # noqa: F401 (fixtures)
from servers import ServerProcess
from taskiq import SimpleRetryMiddleware
from taskiq.brokers.inmemory_broker import InmemoryResultBackend
from taskiq_aio_pika import AioPikaBroker, Exchange, Queue, QueueType
from taskiq_receiver import worker  # bench/, on the path through framework_brokers

pytestmark = pytest.mark.timeout(60)


def layout(prefix: str, queues: list[Queue] | None = None) -> dict[str, Any]:
    """AioPikaBroker's exchange and queues named after ``prefix``: the exchange itself
    (auto-delete), ``queues`` (default: ``<prefix>.tasks``), dead letters in
    ``<prefix>.dead``."""
    return {
        "exchange": Exchange(name=prefix, auto_delete=True, durable=False),
        "task_queues": queues or [Queue(name=f"{prefix}.tasks")],
        "dead_letter_queue": Queue(name=f"{prefix}.dead"),
    }


def new_broker(amqp: AmqpBroker, *, queues: list[Queue] | None = None, delay_queue: bool = False,
               **options: Any) -> AioPikaBroker:
    """An AioPikaBroker on its own exchange and queues (unique names, :func:`layout`) with
    the in-memory result backend; ``delay_queue``: delays go through the TTL delay queue
    ``<prefix>.delay``; ``options`` go to AioPikaBroker."""
    prefix = unique("tq")
    if delay_queue:
        options["delay_queue"] = Queue(name=f"{prefix}.delay")
    broker = AioPikaBroker(amqp.url, **layout(prefix, queues), **options)
    broker = broker.with_result_backend(InmemoryResultBackend())
    broker.prefix = prefix  # type: ignore[attr-defined]
    return broker


def ping_task(broker: AioPikaBroker, ran: list[tuple[str, float]]) -> Any:
    """Register the task ``ping(text)`` on ``broker``: it returns ``text`` and appends
    ``(text, time.monotonic())`` to ``ran``."""

    @broker.task
    async def ping(text: str) -> str:
        ran.append((text, time.monotonic()))
        return text

    return ping


async def delete_queues(amqp: AmqpBroker, broker: AioPikaBroker, *suffixes: str) -> None:
    """The quorum queues taskiq declares are durable: delete them from the shared node."""
    names = [f"{broker.prefix}.{suffix}" for suffix in suffixes]  # type: ignore[attr-defined]
    await asyncio.to_thread(amqp.delete_queues, *names)


def test_tasks_return_results(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker)

        @broker.task
        async def add(a: int, b: int) -> int:
            return a + b

        @broker.task
        def shout(text: str) -> str:  # a sync task runs in the receiver's thread pool
            return text.upper()

        async with worker(broker):
            tasks = [await add.kiq(i, i) for i in range(20)] + [await shout.kiq("hi")]
            results = [await t.wait_result(check_interval=0.01, timeout=5) for t in tasks]
        assert [r.return_value for r in results] == [2 * i for i in range(20)] + ["HI"]
        assert not any(r.is_err for r in results)
        assert amqp_broker.message_count(f"{broker.prefix}.tasks") == 0  # all acked
        await delete_queues(amqp_broker, broker, "tasks", "dead")

    run(body)


def test_error_result_and_retries(amqp_broker):
    async def body():
        broker = new_broker(amqp_broker).with_middlewares(SimpleRetryMiddleware(default_retry_count=3))
        tries: dict[str, int] = {}

        @broker.task(retry_on_error=True, max_retries=3)
        async def flaky(key: str, fail_times: int) -> str:
            tries[key] = tries.get(key, 0) + 1
            if tries[key] <= fail_times:
                raise RuntimeError(f"{key} attempt {tries[key]}")
            return f"{key} ok"

        @broker.task
        async def broken() -> None:
            raise ValueError("broken for good")

        async with worker(broker):
            good = await flaky.kiq("good", 2)
            bad = await flaky.kiq("bad", 10)
            plain = await broken.kiq()
            assert (await good.wait_result(check_interval=0.01, timeout=5)).return_value == "good ok"
            failed = await bad.wait_result(check_interval=0.01, timeout=5)
            error = await plain.wait_result(check_interval=0.01, timeout=5)
        assert tries == {"good": 3, "bad": 3}  # retried (re-kicked) until max_retries
        assert failed.is_err and "bad attempt 3" in str(failed.error)
        assert error.is_err and isinstance(error.error, ValueError)
        await delete_queues(amqp_broker, broker, "tasks", "dead")

    run(body)


def test_tasks_routed_to_several_queues_by_label(amqp_broker):
    async def body():
        prefix = unique("tqr")
        queues = [Queue(name=f"{prefix}.fast", routing_key="fast", type=QueueType.CLASSIC,
                        auto_delete=True, durable=False),
                  Queue(name=f"{prefix}.slow", routing_key="slow", type=QueueType.CLASSIC,
                        auto_delete=True, durable=False)]
        broker = new_broker(amqp_broker, queues=queues)
        seen: list[tuple[str, float]] = []
        job = ping_task(broker, seen)

        async with worker(broker):
            kicked = [await job.kicker().with_labels(queue_name=w).kiq(w)
                      for w in ("fast", "slow", "fast")]
            results = [await t.wait_result(check_interval=0.01, timeout=5) for t in kicked]
        assert [r.return_value for r in results] == ["fast", "slow", "fast"]
        assert sorted(where for where, _ in seen) == ["fast", "fast", "slow"]
        await delete_queues(amqp_broker, broker, "dead")

    run(body)


def test_priority_label_on_a_priority_queue(amqp_broker):
    async def body():
        prefix = unique("tqp")
        queue = Queue(name=f"{prefix}.prio", type=QueueType.CLASSIC, max_priority=10,
                      durable=False, auto_delete=False)
        broker = new_broker(amqp_broker, queues=[queue], qos=1)
        order: list[int] = []

        @broker.task
        async def job(n: int) -> None:
            order.append(n)

        await broker.startup()  # a client: declares, kicks, does not consume
        for n, priority in enumerate([1, 5, 9, 0, 5]):
            await job.kicker().with_labels(priority=priority).kiq(n)
        await broker.shutdown()
        async with worker(new_broker_like(broker, amqp_broker, queue, job_name=job.task_name,
                                          into=order)):
            await until(lambda: len(order) == 5, what="5 tasks")
        assert order == [2, 1, 4, 0, 3]  # highest first, FIFO within a priority
        await asyncio.to_thread(amqp_broker.delete_queues, queue.name)
        await delete_queues(amqp_broker, broker, "dead")

    run(body)


def new_broker_like(broker: AioPikaBroker, amqp: AmqpBroker, queue: Queue, job_name: str,
                    into: list[int]) -> AioPikaBroker:
    """A second AioPikaBroker on the same exchange and queue (a worker process), with the
    same task registered under the same name, appending its argument to ``into``."""
    again = AioPikaBroker(amqp.url, qos=1, **layout(broker.prefix, [queue]))  # type: ignore[attr-defined]

    @again.task(task_name=job_name)
    async def job(n: int) -> None:
        into.append(n)

    return again


async def delayed_pings(broker: AioPikaBroker,
                        kicks: list[tuple[str, float | None]]) -> tuple[list[str], dict[str, float]]:
    """Kick ``ping(text)`` (:func:`ping_task`) for each ``(text, delay)`` in turn, with the
    delay label (seconds; None: no delay), on a worker; wait for each result (its text).
    Answer the texts in the order they ran, and when each ran (seconds after the first kick)."""
    ran: list[tuple[str, float]] = []
    ping = ping_task(broker, ran)
    async with worker(broker):
        sent = time.monotonic()
        kicked = []
        for text, delay in kicks:
            kicker = ping.kicker() if delay is None else ping.kicker().with_labels(delay=delay)
            kicked.append((text, await kicker.kiq(text)))
        for text, task in kicked:
            assert (await task.wait_result(check_interval=0.01, timeout=5)).return_value == text
    return [text for text, _ in ran], {text: when - sent for text, when in ran}


def test_delay_through_the_ttl_delay_queue(amqp_broker):
    """taskiq's "simple" delay: the message goes to the delay queue with a per-message
    expiration; the queue dead-letters it, when it expires, to the tasks exchange."""

    async def body():
        broker = new_broker(amqp_broker, delay_queue=True)
        order, at = await delayed_pings(broker, [("later", 0.3), ("now", None)])
        assert order == ["now", "later"]
        assert at["later"] >= 0.3
        await delete_queues(amqp_broker, broker, "tasks", "dead", "delay")

    run(body)


def test_delay_through_the_delayed_message_exchange(amqp_broker):
    amqp_broker.require_delayed_exchange()

    async def body():
        broker = new_broker(amqp_broker, delayed_message_exchange_plugin=True)
        order, at = await delayed_pings(broker, [("slow", 0.4), ("fast", 0.1)])
        # each message is held for its own delay: the shorter one does not wait behind
        assert order == ["fast", "slow"]
        assert at["slow"] >= 0.4
        await delete_queues(amqp_broker, broker, "tasks", "dead")

    run(body)


def test_delay_queue_short_delay_behind_a_long_one(amqp_broker):
    """The delay queue's corner: RabbitMQ expires a message (per-message TTL) only at the
    head of the queue, so a short delay kicked after a longer one waits for it; leveret
    expires each message when due (docs/failed-messages.md), so the short one runs first."""

    async def body():
        broker = new_broker(amqp_broker, delay_queue=True)
        order, at = await delayed_pings(broker, [("long", 0.5), ("short", 0.05)])
        if amqp_broker.name == "rabbitmq":
            assert order == ["long", "short"] and at["short"] >= 0.5
        else:
            assert order == ["short", "long"] and at["short"] < 0.5 <= at["long"]
        await delete_queues(amqp_broker, broker, "tasks", "dead", "delay")

    run(body)


def test_task_in_flight_when_a_worker_stops_runs_on_the_next(amqp_broker):
    """taskiq acks after the result is saved: a worker stopped mid-task closes its
    channel with the message unacked, and the quorum queue gives it to the next worker."""

    async def body():
        first = new_broker(amqp_broker)
        started = asyncio.Event()

        @first.task(task_name="tq.stuck")
        async def stuck(n: int) -> int:
            started.set()
            await asyncio.sleep(3600)  # never finishes on this worker
            return n

        async with worker(first):
            await stuck.kiq(7)
            await asyncio.wait_for(started.wait(), 5)
        second = AioPikaBroker(amqp_broker.url, **layout(first.prefix))  # type: ignore[attr-defined]
        done: list[int] = []

        @second.task(task_name="tq.stuck")
        async def finishes(n: int) -> None:
            done.append(n)

        async with worker(second):
            await until(lambda: done, what="the returned task")
        assert done == [7]
        await delete_queues(amqp_broker, first, "tasks", "dead")

    run(body)


def test_a_stream_task_queue_is_refused(amqp_broker):
    """taskiq gives each queue dead-letter arguments; a stream takes none (RabbitMQ 3.10's
    406, which leveret now gives too), so startup fails on both brokers alike."""

    async def body():
        prefix = unique("tqs")
        broker = new_broker(amqp_broker, queues=[Queue(name=f"{prefix}.stream", type=QueueType.STREAM)])
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as refused:
            await broker.startup()
        assert "invalid arg 'x-dead-letter-exchange'" in str(refused.value)
        assert "of queue type rabbit_stream_queue" in str(refused.value)
        await broker.shutdown()
        await delete_queues(amqp_broker, broker, "dead")

    run(body)


def test_delayed_task_survives_a_broker_kill_9(amqp_broker, tmp_path):
    """leveret's delayed-message exchange keeps a persistent delayed message on disk
    before its confirm (the plugin keeps it in one node's Mnesia): a task kicked with a
    delay, then a ``kill -9`` of the broker, still runs after the restart."""
    if amqp_broker.name != "leveret":
        pytest.skip("the delayed-message exchange is leveret's (the plugin is not installed)")

    async def body():
        server = ServerProcess(tmp_path / "data")
        try:
            prefix = unique("tqk")
            layout = {"exchange": Exchange(name=prefix), "task_queues": [Queue(name=f"{prefix}.tasks")],
                      "dead_letter_queue": Queue(name=f"{prefix}.dead"),
                      "delayed_message_exchange_plugin": True}
            kicker = AioPikaBroker(server.url, **layout)

            @kicker.task(task_name="tq.survivor")
            async def survivor(text: str) -> None:
                pass

            await kicker.startup()  # declares; publishes persistent, with confirms
            await survivor.kicker().with_labels(delay=0.5).kiq("still here")
            server.kill()  # kill -9 with the message due in 0.5 s
            await kicker.shutdown()
            server = ServerProcess(tmp_path / "data")
            worker_broker = AioPikaBroker(server.url, **layout)
            ran: list[str] = []

            @worker_broker.task(task_name="tq.survivor")
            async def survivor_runs(text: str) -> None:
                ran.append(text)

            async with worker(worker_broker):
                await until(lambda: ran, timeout=10, what="the delayed task after the restart")
            assert ran == ["still here"]
        finally:
            server.kill()

    run(body)
