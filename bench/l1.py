"""LavinMQ's L1 workload: ``lavinmqperf throughput -x1 -y1 -s16`` (and ``-s1024``).

lavinmqperf's throughput test (``src/lavinmqperf/amqp/throughput.cr``) with those
options: one publisher and one consumer at the same time on one queue (``perf-test``,
declared durable by the consumer), transient messages (no ``delivery_mode``), no
publisher confirms, no transactions, no rate limit, and a consumer with ``no_ack``
(auto-ack) and no ``basic.qos``. It reports the average publish rate and the average
consume rate over the same wall-clock window.

Here the window is the publishers' flood (``--seconds`` / ``--messages``). The
publishers run in their own processes (``--l1-publishers``, default 1 as ``-x1``), so
the consumer (this process, the load generator's fast parser) and each publisher
have a core's worth of Python each; every process reports its CPU so a reader sees
which one saturates. Run as a script, this module is one publisher::

    python bench/l1.py HOST PORT QUEUE BODY_SIZE SECONDS COUNT BATCH

It connects, prints ``ready``, waits for a line on stdin, floods for at most SECONDS
or COUNT messages, makes one round trip (so every publish was read by the broker),
and prints one JSON line ``{"sent", "seconds", "cpu_s"}`` (seconds from the go to the
round trip's reply; CPU of this process in that time).
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time

from brokers import Broker
from loadgen import Connection, new_event_loop
from workloads import Meter, Row, Settings, _cleanup, _close, _flood, _name, _open, _phase, _wait_until

L1_SECTION = "l1"  # Row.extra["section"]: the L1 rows also get their own table


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def lavinmq_body(size: int) -> bytes:
    """lavinmqperf's body: byte i is ``i % 27 + 64``."""
    return bytes(i % 27 + 64 for i in range(size))


# ------------------------------------------------------------ the publisher process
async def publisher(host: str, port: int, queue: str, size: int, seconds: float, count: int,
                    batch: int) -> dict:
    """One publisher (see the module docstring); returns its JSON line's fields."""
    conn = await Connection.open(host, port)
    try:
        ch = await conn.channel()
        msg = ch.message("", queue, lavinmq_body(size))
        print("ready", flush=True)
        if not await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline):
            return {"sent": 0, "seconds": 0.0, "cpu_s": 0.0}  # the harness went away: no flood
        cpu0, t0 = _cpu(), time.monotonic()
        sent = await _flood(conn, msg, count, t0 + seconds, batch)
        await ch.queue_declare(queue, passive=True)  # round trip: all publishes read
        return {"sent": sent, "seconds": time.monotonic() - t0, "cpu_s": _cpu() - cpu0}
    finally:
        await conn.close()


def publisher_main(argv: list[str]) -> int:
    host, port, queue, size, seconds, count, batch = argv
    loop = new_event_loop()
    try:
        out = loop.run_until_complete(publisher(host, int(port), queue, int(size), float(seconds),
                                                int(count), int(batch)))
    finally:
        loop.close()
    print(json.dumps(out), flush=True)
    return 0


# ------------------------------------------------------------------- the workload
async def _start_publishers(broker: Broker, q: str, size: int,
                            s: Settings) -> list[asyncio.subprocess.Process]:
    n = max(1, s.l1_publishers)
    procs = []
    for i in range(n):
        count = s.messages // n + (1 if i < s.messages % n else 0)
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, __file__, broker.host, str(broker.port), q, str(size), str(s.seconds),
            str(count), str(s.batch), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE))
    for p in procs:
        line = await asyncio.wait_for(p.stdout.readline(), 60)
        if line.strip() != b"ready":
            raise RuntimeError(f"L1 publisher did not start: {line!r}")
    return procs


async def _l1(broker: Broker, s: Settings, meter: Meter, size: int, label: str) -> list[Row]:
    """One L1 run with ``size``-byte bodies. Two rows over one window (the publishers'
    flood, until their round trips): ``LABEL publish`` (publishes the broker read ÷
    window) and ``LABEL consume`` (deliveries received in that window ÷ window), each
    with the window's broker CPU divided by its own count. Then the queue is drained
    (untimed: ``drain_s``, ``backlog_at_end``)."""
    q = _name("l1")
    cconn, cch = await _open(broker)
    procs: list[asyncio.subprocess.Process] = []
    try:
        await cch.queue_declare(q, durable=True)
        tag = await cch.consume(q, ack_every=0)  # no_ack, no basic.qos: lavinmqperf -a 0
        procs = await _start_publishers(broker, q, size, s)
        meter.start()
        for p in procs:
            p.stdin.write(b"go\n")
        outs = []
        for p in procs:
            line = await asyncio.wait_for(p.stdout.readline(), s.seconds + s.grace + 60)
            outs.append(json.loads(line))
        meter.stop()
        consumed = cch.delivered
        sent = sum(o["sent"] for o in outs)
        window = meter.seconds
        t_end = time.monotonic()
        drained = await _wait_until(lambda: cch.delivered >= sent, [cconn], t_end + s.grace)
        drain_s = time.monotonic() - t_end
        await cch.cancel(tag)
        pub_pct = [round(100 * o["cpu_s"] / o["seconds"], 1) for o in outs]
        common = {
            "section": L1_SECTION, "body_size": size, "publishers": len(procs),
            "published": sent, "consumed": consumed,
            "published_msg_per_s": round(sent / window, 1), "consumed_msg_per_s": round(consumed / window, 1),
            "consumer_cpu_pct": round(100 * meter.gen_cpu / window, 1),
            "publisher_cpu_pct": pub_pct,
            "backlog_at_end": sent - consumed, "drain_s": round(drain_s, 3), "drained": drained,
        }
        phase = _phase(meter)
        phase["phase_loadgen_cpu_s"] = meter.gen_cpu + sum(o["cpu_s"] for o in outs)
        return [Row(f"{label} publish", sent, window, {**common, **phase}),
                Row(f"{label} consume", consumed, window, {**common, **phase})]
    finally:
        for p in procs:
            if p.returncode is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
            await p.wait()
        await _close(cconn)
        await _cleanup(broker, [q])


async def wl_l1_16b(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """L1 with 16-byte bodies (``lavinmqperf throughput -x1 -y1 -s16``)."""
    return await _l1(broker, s, meter, 16, "l1-16b")


async def wl_l1_1k(broker: Broker, s: Settings, meter: Meter) -> list[Row]:
    """L1 with 1 KiB bodies (``lavinmqperf throughput -x1 -y1 -s1024``)."""
    return await _l1(broker, s, meter, 1024, "l1-1k")


if __name__ == "__main__":
    sys.exit(publisher_main(sys.argv[1:]))
