"""Task frameworks through a broker: dramatiq and taskiq round trips, and dramatiq's
delayed messages (held unacked on its ``.DQ`` consumer), on leveret and RabbitMQ 3.10.

Usage::

    # leveret, and RabbitMQ if installed:
    PYTHONPATH=$PWD/src:$PWD/bench python bench/frameworks_probe.py
    PYTHONPATH=$PWD/src:$PWD/bench python bench/frameworks_probe.py --src /other/tree/src --no-rabbitmq

For each broker (a private one, started and stopped here; leveret as ``leveret server``
from ``--src`` or the importable tree, so the same probe measures before and after a
change):

* **dramatiq**: ``--tasks`` messages sent with ``RabbitmqBroker(confirm_delivery=True)``,
  run by a ``dramatiq.Worker`` (4 threads) in this process; then ``--delayed`` messages
  with delays spread over 0-1 s, whose lateness (run time minus eta) is recorded.
* **taskiq**: ``--tasks`` tasks kicked with ``AioPikaBroker`` and awaited through the
  in-memory result backend, the receiver in this process.

Reported: wall seconds per phase and the broker's CPU (its process tree, from /proc) per
task in µs, and the delayed messages' lateness p50/p99 in ms. Bounded: every wait has a
deadline (``--timeout`` s per phase).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time

from brokers import Leveret, RabbitMQ, proc_cpu_seconds, process_tree, rabbitmq_installed


def broker_cpu(pid: int) -> float:
    return sum(proc_cpu_seconds(p) for p in process_tree(pid))


def wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done in {timeout} s")
        time.sleep(0.005)


def dramatiq_phase(url: str, pid: int, tasks: int, delayed: int, timeout: float) -> dict:
    import dramatiq
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    logging.getLogger("dramatiq").setLevel(logging.CRITICAL)
    logging.getLogger("taskiq").setLevel(logging.CRITICAL)
    broker = RabbitmqBroker(url=url, confirm_delivery=True)
    dramatiq.set_broker(broker)
    done: list[float] = []
    late: list[float] = []

    @dramatiq.actor(queue_name="probe", broker=broker)
    def job(eta: float) -> None:
        now = time.time()
        if eta:
            late.append((now - eta) * 1000)
        done.append(now)

    worker = dramatiq.Worker(broker, worker_threads=4, worker_timeout=50)
    worker.start()
    try:
        job.send(0.0)
        wait(lambda: len(done) == 1, timeout, "dramatiq warm-up")
        done.clear()
        cpu0, t0 = broker_cpu(pid), time.monotonic()
        for _ in range(tasks):
            job.send(0.0)
        wait(lambda: len(done) == tasks, timeout, "dramatiq tasks")
        wall, cpu = time.monotonic() - t0, broker_cpu(pid) - cpu0
        for i in range(delayed):
            delay = (i * 7919) % 1000  # ms, spread over 0-1 s
            job.send_with_options(args=(time.time() + delay / 1000,), delay=delay)
        wait(lambda: len(late) == delayed, timeout, "dramatiq delayed")
    finally:
        worker.stop(timeout=5000)
        broker.flush_all()
        broker.close()
    late.sort()
    return {
        "dramatiq s": wall,
        "dramatiq cpu us/task": cpu / tasks * 1e6,
        "delay p50 ms": statistics.median(late),
        "delay p99 ms": late[min(len(late) - 1, int(len(late) * 0.99))],
    }


def taskiq_phase(url: str, pid: int, tasks: int, timeout: float) -> dict:
    from taskiq.brokers.inmemory_broker import InmemoryResultBackend
    from taskiq_aio_pika import AioPikaBroker, Exchange, Queue
    from taskiq_receiver import worker

    async def main() -> dict:
        broker = AioPikaBroker(
            url, exchange=Exchange(name="probe-taskiq"), task_queues=[Queue(name="probe-taskiq")]
        ).with_result_backend(InmemoryResultBackend(max_stored_results=-1))

        @broker.task
        async def add(a: int, b: int) -> int:
            return a + b

        async with worker(broker, max_async_tasks=50):
            await (await add.kiq(0, 0)).wait_result(check_interval=0.01, timeout=timeout)
            cpu0, t0 = broker_cpu(pid), time.monotonic()
            kicked = [await add.kiq(i, 1) for i in range(tasks)]
            for task in kicked:
                await task.wait_result(check_interval=0.005, timeout=timeout)
            wall, cpu = time.monotonic() - t0, broker_cpu(pid) - cpu0
        return {"taskiq s": wall, "taskiq cpu us/task": cpu / tasks * 1e6}

    return asyncio.run(main())


def run(name: str, node, args) -> dict:
    node.start()
    try:
        url = f"amqp://guest:guest@127.0.0.1:{node.port}/%2F"
        pid = node.find_pid() if isinstance(node, RabbitMQ) else node.pid
        result = {"broker": name}
        result.update(dramatiq_phase(url, pid, args.tasks, args.delayed, args.timeout))
        result.update(taskiq_phase(url, pid, args.tasks, args.timeout))
        return result
    finally:
        node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--delayed", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--src", help="the leveret tree's src/ to run (default: the importable one)")
    parser.add_argument("--no-rabbitmq", action="store_true")
    args = parser.parse_args()
    rows = [run("leveret", Leveret(src=args.src), args)]
    if not args.no_rabbitmq and rabbitmq_installed():
        rows.append(run("rabbitmq", RabbitMQ(), args))
    keys = [k for k in rows[0] if k != "broker"]
    print(f"{'':24}" + "".join(f"{r['broker']:>12}" for r in rows))
    for key in keys:
        print(f"{key:24}" + "".join(f"{r[key]:12.2f}" for r in rows))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
