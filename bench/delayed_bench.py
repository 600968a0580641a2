"""Delayed messages at scale: leveret's delayed-message exchange against RabbitMQ's
TTL + dead-letter pattern (issue 12).

Usage::

    PYTHONPATH=$PWD/src:$PWD/bench python bench/delayed_bench.py                  # 1,000,000 over 60 s
    PYTHONPATH=$PWD/src:$PWD/bench python bench/delayed_bench.py --messages 100000 --spread 10

For each broker (a private one, started and stopped here):

* **leveret**: a durable ``x-delayed-message`` exchange (``x-delayed-type: direct``)
  bound to a durable queue; every message carries ``x-delay`` (ms).
* **RabbitMQ** (no delayed-message plugin in Debian's package): what its users do
  without it. Each message goes, with ``expiration`` = its delay, to a durable holding
  queue without consumers whose ``x-dead-letter-exchange`` (a durable direct
  exchange) routes it to the consumed queue when it expires. RabbitMQ expires messages
  only at the head of a queue, so a short delay behind a long one waits for it.

N messages (``--messages``) with delays drawn uniformly from 1 ms to ``--spread``
seconds (the same seeded draw for both brokers), persistent, 16-byte bodies
(``>QII``: the publisher's ``time.monotonic_ns()`` just before the message is
encoded, the delay in ms, the message's index), published as fast as the broker
takes them with publisher confirms (at most ``--confirm-window`` unconfirmed: 100 by
default, since lateness counts from the publish, and with a window of 1000 a saturated
broker holds ~1000 / rate seconds of messages in its socket buffer before it reads
them, which is queueing in front of the broker, not its timer). A
consumer in its own process, started before publishing (prefetch ``--prefetch``,
acks ``multiple=True`` every ``--ack-every``), records each message's lateness:
arrival (``time.monotonic_ns()`` when the read holding it is parsed) minus (publish
time + delay). Both processes are on one host, so CLOCK_MONOTONIC is shared.

Reported per broker: publish rate (messages ÷ the time from the first write to the
last confirm) and broker CPU µs per message over that window, the peak RSS of the
broker's process tree (``VmRSS``, sampled every 0.5 s from the start of the broker to
the end of the run), lateness p50/p99/max over all messages, messages lost (confirmed
and never delivered) and delivered twice, and which process saturated in the publish
phase and in the delivery phase (after the last confirm). Everything is bounded in
time (``--publish-timeout``, ``--grace``) and the brokers are stopped on any exit.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import math
import multiprocessing as mp
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from array import array
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loadgen  # noqa: E402
from brokers import (  # noqa: E402
    Broker,
    Leveret,
    RabbitMQ,
    machine_cpu,
    proc_cpu_seconds,
    rabbitmq_installed,
)
from report import (  # noqa: E402
    fmt,
    log,
    print_errors,
    print_table,
    run_each,
    run_meta,
    sigterm,
    start,
    write_results,
)
from stomp_bench import busiest_thread, profile_summary, thread_cpu, verdict  # noqa: E402

from leveret.amqp.frames import FRAME_BODY, FRAME_HEADER, FRAME_METHOD, encode_publish  # noqa: E402

BROKERS = ("leveret", "rabbitmq")
GIL_BOUND = frozenset({"leveret"})
TARGET_P99_MS = 10.0  # issue 12, leveret, for the million
TARGET_RSS_MB = 300.0
RSS_EVERY = 0.5  # seconds between RSS samples
PROFILE_RATE = 200  # py-spy samples per second (stomp_bench's profile_summary assumes it)
ROUTING_KEY = "k"

_BODY = struct.Struct(">QII")  # publish monotonic_ns, delay ms, index
_DELAY = struct.Struct(">i")  # the x-delay header value (field type 'I', a signed 32-bit integer)
_HDR = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ACK = struct.Struct(">BHIHHQBB")
_BASIC_DELIVER = (60 << 16) | 60
_BASIC_ACK = (60 << 16) | 80
_BASIC_NACK = (60 << 16) | 120
FRAME_END = 0xCE


@dataclass
class Settings:
    messages: int = 1_000_000
    spread: float = 60.0  # seconds: delays are uniform over (0, spread]
    confirm_window: int = 100  # see the module doc
    prefetch: int = 1000
    ack_every: int = 100
    publish_timeout: float = 900.0  # seconds the publish phase may last (then it stops)
    grace: float = 180.0  # seconds after the last message's due time before the consumer gives up
    seed: int = 12


# ------------------------------------------------------------------ publishing
class Encoder:
    """The frames of message ``i`` from a template made once by ``encode_publish``:
    only the delay (the ``x-delay`` value or the ``expiration`` digits) and the body
    change, so a message costs ~1 µs of the publisher, stamped just before it is
    encoded."""

    def __init__(self, template: bytes, marker: bytes, value_at: int, delay_bytes) -> None:
        at = template.find(marker)
        if at < 0 or template.find(marker, at + 1) >= 0 or template[-17:-1] != bytes(16):
            raise ValueError("the publish template is not as expected")
        self.pre = template[: at + value_at]
        self.mid = template[at + len(marker) : -17]
        self.delay_bytes = delay_bytes

    def frames(self, delays: array, start: int, count: int) -> bytes:
        pre, mid, delay_bytes, pack, now = self.pre, self.mid, self.delay_bytes, _BODY.pack, time.monotonic_ns
        parts = []
        for i in range(start, start + count):
            d = delays[i]
            parts += (pre, delay_bytes(d), mid, pack(now(), d, i), b"\xce")
        return b"".join(parts)


def leveret_encoder(channel: int, exchange: str, frame_max: int) -> Encoder:
    placeholder = 0x1234567
    template = encode_publish(channel, exchange, ROUTING_KEY, bytes(16),
                              {"delivery_mode": 2, "headers": {"x-delay": placeholder}}, frame_max)
    return Encoder(template, b"\x07x-delayI" + _DELAY.pack(placeholder), 9, _DELAY.pack)


def rabbitmq_encoder(channel: int, queue: str, frame_max: int, spread_ms: int) -> Encoder:
    width = len(str(spread_ms))  # fixed-width expiration: RabbitMQ reads "00042" as 42
    template = encode_publish(channel, "", queue, bytes(16),
                              {"delivery_mode": 2, "expiration": "9" * width}, frame_max)
    fmt = f"%0{width}d".encode()
    return Encoder(template, bytes([width]) + b"9" * width, 1, lambda d: fmt % d)


def make_delays(n: int, spread: float, seed: int) -> array:
    """Delays in ms, uniform over [1, spread × 1000], the same for every broker."""
    rnd = random.Random(seed)
    top = max(1, int(spread * 1000))
    return array("i", (rnd.randint(1, top) for _ in range(n)))


# ------------------------------------------------------------------ the consumer
class LatenessConnection(loadgen.Connection):
    """loadgen's connection with a parser that reads each delivery's 16-byte body:
    lateness (ns) in ``lateness``, deliveries per index in ``seen``."""

    lateness: array
    seen: bytearray
    delivered = 0
    duplicates = 0
    foreign = 0  # bodies that are not ours (wrong size or index)
    last_arrival_ns = 0

    def prepare(self, n: int) -> None:
        self.lateness = array("q")
        self.seen = bytearray(n)

    def data_received(self, data: bytes) -> None:  # hot path, flat on purpose (as loadgen's)
        buf = self._buf
        buf += data
        n = len(buf)
        pos = 0
        chans = self._channels
        now = 0
        progress = False
        while n - pos >= 8:
            ftype, chid, size = _HDR.unpack_from(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if ftype == FRAME_BODY:
                ch = chans.get(chid)
                if ch is not None:
                    if ch._body_first:
                        ch._body_first = False
                        if not now:
                            now = time.monotonic_ns()
                        if size == 16:
                            sent, delay, index = _BODY.unpack_from(buf, pos + 7)
                            self.lateness.append(now - sent - delay * 1_000_000)
                            if index < len(self.seen):
                                if self.seen[index]:
                                    self.duplicates += 1
                                else:
                                    self.seen[index] = 1
                            else:
                                self.foreign += 1
                        else:
                            self.foreign += 1
                    ch._body_left -= size
                    if ch._body_left <= 0:
                        self._delivered(ch, chid)
                        progress = True
            elif ftype == FRAME_HEADER:
                ch = chans.get(chid)
                if ch is not None:
                    ch._body_left = _U64.unpack_from(buf, pos + 11)[0]
                    ch._body_first = True
                    if ch._body_left == 0:
                        self.foreign += 1
                        self._delivered(ch, chid)
                        progress = True
            elif ftype == FRAME_METHOD:
                cm = _U32.unpack_from(buf, pos + 7)[0]
                ch = chans.get(chid)
                if cm == _BASIC_DELIVER and ch is not None:
                    ch.last_tag = _U64.unpack_from(buf, pos + 12 + buf[pos + 11])[0]
                elif cm in (_BASIC_ACK, _BASIC_NACK):
                    pass  # the consumer's channel has no confirms
                else:
                    self._on_method(bytes(buf[pos:end + 1]))
                    if self.error is not None:
                        return
            pos = end + 1
        if pos:
            del buf[:pos]
        if now:
            self.last_arrival_ns = now
        self._flush()
        if progress and self._progress_waiters:
            self._wake(self._progress_waiters)

    def _delivered(self, ch: loadgen.Channel, chid: int) -> None:
        self.delivered += 1
        ch._unacked += 1
        if ch._unacked >= ch.ack_every:
            self._write(_ACK.pack(FRAME_METHOD, chid, 13, 60, 80, ch.last_tag, 1, FRAME_END))
            ch._unacked = 0



def percentile(ordered: list[int], p: float) -> int:
    """Nearest-rank percentile of a sorted list."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def lateness_summary(values: array) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    ms = 1e6
    out = {f"p{p:g}_ms": round(percentile(ordered, p) / ms, 2) for p in (50, 90, 99, 99.9)}
    out.update(min_ms=round(ordered[0] / ms, 2), max_ms=round(ordered[-1] / ms, 2),
               mean_ms=round(sum(ordered) / len(ordered) / ms, 2),
               early=bisect.bisect_left(ordered, 0),  # arrived before publish time + delay
               over_10ms=len(ordered) - bisect.bisect_right(ordered, 10 * ms))
    return out


async def _consume(host: str, port: int, queue: str, n: int, s: Settings, ready, expected, deadline,
                   stop) -> dict:
    conn = await LatenessConnection.open(host, port)
    conn.prepare(n)
    try:
        ch = await conn.channel()
        await ch.qos(s.prefetch)
        tag = await ch.consume(queue, ack_every=s.ack_every)
        ready.put(("ready", ""))
        while not stop.is_set():
            want = expected.value
            if 0 <= want <= conn.delivered or time.monotonic() > deadline.value:
                break
            await conn.wait_progress(0.5)
            if conn.closed:
                raise conn.closed
        ch.ack_pending()
        try:
            await asyncio.wait_for(ch.cancel(tag), 10)
        except (TimeoutError, loadgen.AMQPError):
            pass
    finally:
        try:
            await asyncio.wait_for(conn.close(), 5)
        except Exception:
            conn.abort()
    return {
        "delivered": conn.delivered,
        "unique": conn.delivered - conn.duplicates - conn.foreign,
        "duplicates": conn.duplicates,
        "foreign": conn.foreign,
        "last_arrival": conn.last_arrival_ns / 1e9,
        "lateness": lateness_summary(conn.lateness),
        "cpu_s": time.process_time(),
    }


def consumer_main(host: str, port: int, queue: str, n: int, s: Settings, ready, results, expected, deadline,
                  stop) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends it (stop, then terminate)
    loop = loadgen.new_event_loop()
    try:
        out = loop.run_until_complete(_consume(host, port, queue, n, s, ready, expected, deadline, stop))
        results.put(("ok", out))
    except BaseException as exc:
        msg = f"{type(exc).__name__}: {exc}"
        ready.put(("error", msg))
        results.put(("error", msg))
    finally:
        loop.close()


# ------------------------------------------------------------------ measuring
class RssSampler(threading.Thread):
    """VmRSS of the broker's process tree every :data:`RSS_EVERY` seconds; ``peak`` in
    bytes, ``samples`` as (seconds since the start, MB)."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.broker = broker
        self.peak = 0
        self.samples: list[tuple[float, float]] = []
        self._halt = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(RSS_EVERY)

    def sample(self) -> int:
        rss = self.broker.rss_bytes()
        self.peak = max(self.peak, rss)
        self.samples.append((round(time.monotonic() - self._t0, 1), round(rss / 2**20, 1)))
        return rss

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.sample()


class Window:
    """CPU of the broker (process tree, busiest thread), the client processes and the
    machine between :meth:`start` and :meth:`stop`."""

    def __init__(self, broker: Broker, consumer_pid: int) -> None:
        self.broker, self.consumer_pid = broker, consumer_pid

    def _read(self) -> tuple:
        return (time.monotonic(), self.broker.cpu_seconds(), thread_cpu(self.broker), machine_cpu(),
                time.process_time(), proc_cpu_seconds(self.consumer_pid))

    def start(self) -> Window:
        self.a = self._read()
        return self

    def stop(self) -> Window:
        self.b = self._read()
        return self

    def row(self, messages: int, gil_bound: bool) -> dict:
        (t0, cpu0, th0, m0, pub0, con0), (t1, cpu1, th1, m1, pub1, con1) = self.a, self.b
        window = max(t1 - t0, 1e-9)
        broker = cpu1 - cpu0
        name, busiest = busiest_thread(th0, th1)
        clients = [pub1 - pub0, con1 - con0]
        machine = m1[0] - m0[0]
        row = {
            "seconds": round(window, 3),
            "broker_cpu_s": round(broker, 2),
            "broker_cpu_us_per_msg": round(broker / messages * 1e6, 2) if messages else None,
            "broker_cpu_pct": round(100 * broker / window, 1),
            "busiest_thread": name,
            "busiest_thread_pct": round(100 * busiest / window, 1),
            "publisher_cpu_pct": round(100 * clients[0] / window, 1),
            "consumer_cpu_pct": round(100 * clients[1] / window, 1),
            "client_max_cpu_pct": round(100 * max(clients) / window, 1),
            "machine_cpu_pct": round(100 * machine / window, 1),
            "other_cpu_pct": round(100 * max(0.0, machine - broker - sum(clients)) / window, 1),
            "iowait_pct": round(100 * (m1[1] - m0[1]) / window, 1),
        }
        row["saturated"] = verdict(row, os.cpu_count() or 1, gil_bound)
        if row["saturated"] == "client":
            row["saturated"] = "client (publisher)" if clients[0] >= clients[1] else "client (consumer)"
        return row


class Profiler:
    """py-spy on leveret for one phase (``--profile DIR``)."""

    def __init__(self, broker: Broker, directory: str | None, phase: str) -> None:
        self.path = os.path.join(directory, f"delayed-{broker.name}-{phase}.txt") if directory else None
        self.proc: subprocess.Popen | None = None
        self.t0 = 0.0
        if self.path:
            self.proc = subprocess.Popen(["py-spy", "record", "--pid", str(broker.pid), "--format", "raw",
                                          "--threads", "--rate", str(PROFILE_RATE), "-o", self.path],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attaches
        self.t0 = time.monotonic()

    def stop(self) -> dict:
        if self.proc is None:
            return {}
        window = time.monotonic() - self.t0
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output and exits
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None
        return {"profile": self.path, **profile_summary(self.path, window, False)}


# ------------------------------------------------------------------ one broker
def _uid() -> str:
    return os.urandom(3).hex()


async def _declare(broker: Broker, s: Settings) -> dict:
    """The topology; returns the names."""
    uid = _uid()
    names = {"queue": f"delayed-out-{uid}"}
    conn = await loadgen.Connection.open(broker.host, broker.port)
    try:
        ch = await conn.channel()
        await ch.queue_declare(names["queue"], durable=True)
        if broker.name == "leveret":
            names["exchange"] = f"delayed-x-{uid}"
            await ch.exchange_declare(names["exchange"], "x-delayed-message", durable=True,
                                      arguments={"x-delayed-type": "direct"})
            await ch.queue_bind(names["queue"], names["exchange"], ROUTING_KEY)
        else:
            names["exchange"] = f"delayed-dlx-{uid}"
            names["hold"] = f"delayed-hold-{uid}"
            await ch.exchange_declare(names["exchange"], "direct", durable=True)
            await ch.queue_bind(names["queue"], names["exchange"], ROUTING_KEY)
            await ch.queue_declare(names["hold"], durable=True, arguments={
                "x-dead-letter-exchange": names["exchange"], "x-dead-letter-routing-key": ROUTING_KEY})
    finally:
        await conn.close()
    return names


async def _publish(broker: Broker, names: dict, delays: array, s: Settings, on_start) -> dict:
    """Publish every message with confirms; returns the figures of the phase."""
    conn = await loadgen.Connection.open(broker.host, broker.port)
    try:
        ch = await conn.channel()
        await ch.confirm_select()
        if broker.name == "leveret":
            enc = leveret_encoder(ch.id, names["exchange"], conn.frame_max)
        else:
            enc = rabbitmq_encoder(ch.id, names["hold"], conn.frame_max, max(1, int(s.spread * 1000)))
        n = len(delays)
        on_start()
        t0 = time.monotonic()
        deadline = t0 + s.publish_timeout
        sent = 0
        next_log = t0 + 10
        while sent < n and time.monotonic() < deadline:
            allowed = min(s.confirm_window - (sent - ch.confirmed), n - sent)
            if allowed <= 0:
                await conn.wait_progress(1.0)
                if conn.closed:
                    raise conn.closed
                continue
            conn.write(enc.frames(delays, sent, allowed))
            sent += allowed
            await conn.drain()
            if time.monotonic() >= next_log:
                next_log += 10
                log(f"    [{broker.name}] {sent:,} published, {ch.confirmed:,} confirmed "
                    f"({sent / (time.monotonic() - t0):,.0f} msg/s)")
        while ch.confirmed < sent and time.monotonic() < deadline + 60:
            await conn.wait_progress(1.0)
            if conn.closed:
                raise conn.closed
        t1 = time.monotonic()
        out = {"published": sent, "confirmed": ch.confirmed, "nacked": ch.nacked, "publish_s": t1 - t0,
               "t0": t0, "t1": t1, "timed_out": sent < n or ch.confirmed < sent}
        await conn.close()
        return out
    except BaseException:
        conn.abort()
        raise


def _run(loop: asyncio.AbstractEventLoop, coro):
    return loop.run_until_complete(coro)


def run_broker(name: str, s: Settings, delays: array, args: argparse.Namespace) -> dict:
    """Start one broker, run the bench on it, stop it (also on an error or a signal)."""
    out: dict = {"errors": {}}
    broker: Broker = Leveret(python=args.python, src=args.leveret_src) if name == "leveret" else RabbitMQ(
        schedulers=args.rabbitmq_schedulers)
    if start(name, broker, out) is None:
        return out
    sampler = RssSampler(broker)
    ctx = mp.get_context("fork")
    consumer = None
    stop = ctx.Event()
    try:
        sampler.start()
        out["idle_rss_mb"] = round(broker.rss_bytes() / 2**20, 1)
        log(f"[{name}] ready on {broker.host}:{broker.port} (pid {broker.pid}), RSS {out['idle_rss_mb']} MB")
        loop = loadgen.new_event_loop()
        try:
            names = _run(loop, _declare(broker, s))
        finally:
            loop.close()
        n = len(delays)
        ready, results = ctx.Queue(), ctx.Queue()
        expected = ctx.Value("q", -1)
        deadline = ctx.Value("d", time.monotonic() + s.publish_timeout + 60 + s.spread + s.grace)
        consumer = ctx.Process(target=consumer_main, daemon=True, args=(
            broker.host, broker.port, names["queue"], n, s, ready, results, expected, deadline, stop))
        consumer.start()
        what, detail = ready.get(timeout=60)
        if what == "error":
            raise RuntimeError(f"consumer: {detail}")
        publish_window = Window(broker, consumer.pid)
        profiler: list[Profiler] = []

        def on_start() -> None:
            profiler.append(Profiler(broker, args.profile if name == "leveret" else None, "publish"))
            publish_window.start()

        log(f"[{name}] publishing {n:,} persistent messages, delays uniform over {s.spread:g} s, "
            f"confirm window {s.confirm_window}")
        loop = loadgen.new_event_loop()
        try:
            pub = _run(loop, _publish(broker, names, delays, s, on_start))
        finally:
            loop.close()
        publish_window.stop()
        publish_profile = profiler[0].stop() if profiler else {}
        rss_published = sampler.sample()
        expected.value = pub["confirmed"] - pub["nacked"]
        last_due = pub["t1"] + s.spread  # every message is due by then (published before t1)
        deadline.value = last_due + s.grace
        log(f"[{name}] {pub['published']:,} published, {pub['confirmed']:,} confirmed in "
            f"{pub['publish_s']:.1f} s ({pub['published'] / pub['publish_s']:,.0f} msg/s); waiting for "
            f"the deliveries (until {s.spread + s.grace:.0f} s at most)")
        deliver_window = Window(broker, consumer.pid).start()
        deliver_profiler = Profiler(broker, args.profile if name == "leveret" else None, "deliver")
        result = None
        next_log = time.monotonic() + 10
        while result is None:
            try:
                result = results.get(timeout=1.0)
            except Exception:  # queue.Empty
                if not consumer.is_alive():
                    raise RuntimeError("the consumer process died") from None
                if time.monotonic() > deadline.value + 60:
                    raise TimeoutError("the consumer did not report") from None
                if time.monotonic() >= next_log:
                    next_log += 10
                    log(f"    [{name}] waiting for deliveries; "
                        f"broker RSS {broker.rss_bytes() / 2**20:,.0f} MB")
        deliver_window.stop()
        deliver_profile = deliver_profiler.stop()
        if result[0] == "error":
            raise RuntimeError(f"consumer: {result[1]}")
        c = result[1]
        sampler.stop()
        confirmed_ok = pub["confirmed"] - pub["nacked"]
        lat = c["lateness"]
        pub_row = publish_window.row(pub["published"], name in GIL_BOUND)
        del_row = deliver_window.row(c["delivered"], name in GIL_BOUND)
        out.update({
            "messages": n,
            "published": pub["published"],
            "confirmed": pub["confirmed"],
            "nacked": pub["nacked"],
            "publish_timed_out": pub["timed_out"],
            "publish_s": round(pub["publish_s"], 3),
            "publish_msg_per_s": round(pub["published"] / pub["publish_s"], 1),
            "publish_cpu_us_per_msg": pub_row["broker_cpu_us_per_msg"],
            "publish_phase": {**pub_row, **publish_profile},
            "deliver_phase": {**del_row, **deliver_profile},
            "delivered": c["delivered"],
            "duplicates": c["duplicates"],
            "foreign": c["foreign"],
            "lost": confirmed_ok - c["unique"],
            "last_arrival_after_last_confirm_s": round(c["last_arrival"] - pub["t1"], 3),
            "lateness": lat,
            "rss_after_publish_mb": round(rss_published / 2**20, 1),
            "peak_rss_mb": round(sampler.peak / 2**20, 1),
            "rss_samples_mb": sampler.samples,
            "consumer_cpu_s": round(c["cpu_s"], 2),
            "whole_run_cpu_us_per_msg": round((pub_row["broker_cpu_s"] + del_row["broker_cpu_s"])
                                              / max(1, pub["published"]) * 1e6, 2),
        })
        log(f"[{name}] delivered {c['delivered']:,} (lost {out['lost']}, twice {c['duplicates']}); "
            f"lateness p50 {lat.get('p50_ms')} ms, p99 {lat.get('p99_ms')} ms, max {lat.get('max_ms')} ms; "
            f"peak RSS {out['peak_rss_mb']:,.0f} MB; publish: {out['publish_msg_per_s']:,.0f} msg/s, "
            f"{out['publish_cpu_us_per_msg']} µs CPU/msg, {pub_row['saturated']}; delivery: "
            f"{del_row['saturated']}")
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        out["errors"]["run"] = f"{type(exc).__name__}: {exc}"
        log(f"[{name}] FAILED: {type(exc).__name__}: {exc}\n{broker.log_tail()}")
    finally:
        try:  # whatever happens here, the broker is stopped
            stop.set()
            if consumer is not None:
                consumer.join(10)
                if consumer.is_alive():
                    consumer.terminate()
                    consumer.join(5)
            if sampler.is_alive():
                sampler.stop()
            out.setdefault("peak_rss_mb", round(sampler.peak / 2**20, 1))
        finally:
            log(f"[{name}] stopping")
            broker.stop()
    return out


# ------------------------------------------------------------------ output
def table(results: dict, s: Settings) -> tuple[list[str], list[list[str]]]:
    names = [b for b in BROKERS if b in results]
    labels = {"leveret": "leveret (x-delayed-message)", "rabbitmq": "RabbitMQ (TTL + DLX)"}
    head = ["figure"] + [labels[b] for b in names]

    def get(b: str, *path):
        v = results[b]
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        return v

    rows = [
        ["publish msg/s"] + [fmt(get(b, "publish_msg_per_s")) for b in names],
        ["broker µs CPU/msg (publish phase)"] + [
            fmt(get(b, "publish_cpu_us_per_msg"), ".1f") for b in names],
        ["peak broker RSS MB"] + [fmt(get(b, "peak_rss_mb")) for b in names],
        ["lateness p50 ms"] + [fmt(get(b, "lateness", "p50_ms"), ",.1f") for b in names],
        ["lateness p99 ms"] + [fmt(get(b, "lateness", "p99_ms"), ",.1f") for b in names],
        ["lateness max ms"] + [fmt(get(b, "lateness", "max_ms"), ",.1f") for b in names],
        ["messages lost (delivered twice)"] + [
            f"{fmt(get(b, 'lost'))} ({fmt(get(b, 'duplicates'))})" for b in names],
        ["saturated, publish phase"] + [str(get(b, "publish_phase", "saturated") or "-") for b in names],
        ["  broker % / busiest thread % / publisher % / consumer % / others %"] + [
            "/".join(fmt(get(b, "publish_phase", k)) for k in (
                "broker_cpu_pct", "busiest_thread_pct", "publisher_cpu_pct", "consumer_cpu_pct",
                "other_cpu_pct")) for b in names],
        ["saturated, delivery phase"] + [str(get(b, "deliver_phase", "saturated") or "-") for b in names],
        ["  broker % / busiest thread % / publisher % / consumer % / others %"] + [
            "/".join(fmt(get(b, "deliver_phase", k)) for k in (
                "broker_cpu_pct", "busiest_thread_pct", "publisher_cpu_pct", "consumer_cpu_pct",
                "other_cpu_pct")) for b in names],
    ]
    if "leveret" in names and get("leveret", "lateness", "p99_ms") is not None:
        p99, rss = get("leveret", "lateness", "p99_ms"), get("leveret", "peak_rss_mb")
        verdicts = [f"p99 ≤ {TARGET_P99_MS:g} ms: {'met' if p99 <= TARGET_P99_MS else 'missed'}",
                    f"RSS ≤ {TARGET_RSS_MB:g} MB: {'met' if rss <= TARGET_RSS_MB else 'missed'}",
                    f"lost 0: {'met' if get('leveret', 'lost') == 0 else 'missed'}"]
        rows.append(["targets (leveret, issue 12)"] + ["; ".join(verdicts) if b == "leveret" else ""
                                                        for b in names])
    return head, rows


def print_results(results: dict, s: Settings) -> None:
    head, rows = table(results, s)
    title = (f"Delayed messages: {s.messages:,} persistent, delays uniform over {s.spread:g} s, "
             f"confirm window {s.confirm_window}")
    print_table(title, head, rows)
    print_errors(results)


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated (default: both)")
    p.add_argument("--messages", type=int, default=d.messages, help=f"default {d.messages}")
    p.add_argument("--spread", type=float, default=d.spread,
                   help=f"delays are uniform over this many seconds (default {d.spread:g})")
    p.add_argument("--confirm-window", type=int, default=d.confirm_window,
                   help=f"unconfirmed publishes at most (default {d.confirm_window})")
    p.add_argument("--prefetch", type=int, default=d.prefetch, help=f"consumer (default {d.prefetch})")
    p.add_argument("--ack-every", type=int, default=d.ack_every,
                   help=f"consumer acks multiple=True every N (default {d.ack_every})")
    p.add_argument("--publish-timeout", type=float, default=d.publish_timeout,
                   help=f"seconds the publish phase may last (default {d.publish_timeout:g})")
    p.add_argument("--grace", type=float, default=d.grace,
                   help=f"seconds after the last due time before the consumer gives up (default {d.grace:g})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"of the delays (default {d.seed})")
    p.add_argument("--rabbitmq-schedulers", type=int, default=None,
                   help="Erlang scheduler threads for RabbitMQ (default: one per core)")
    p.add_argument("--python", default=sys.executable, help="interpreter used to start leveret")
    p.add_argument("--leveret-src", default=None, help="run the leveret broker from another tree's src/")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="record leveret with py-spy into DIR/delayed-leveret-{publish,deliver}.txt "
                        "(slows the broker: do not compare those figures)")
    p.add_argument("--output", default=str(HERE / "results" / "delayed-latest.json"),
                   help="JSON results path")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    s = Settings(messages=args.messages, spread=args.spread, confirm_window=args.confirm_window,
                 prefetch=args.prefetch, ack_every=args.ack_every, publish_timeout=args.publish_timeout,
                 grace=args.grace, seed=args.seed)
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    for b in brokers:
        if b not in BROKERS:
            raise SystemExit(f"unknown broker {b!r}: {', '.join(BROKERS)}")
    if "rabbitmq" in brokers and not rabbitmq_installed():
        log("NOTE: rabbitmq-server is not installed, skipped (apt-get install -y rabbitmq-server)")
        brokers.remove("rabbitmq")
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    delays = make_delays(s.messages, s.spread, s.seed)
    results = run_each(brokers, lambda b: run_broker(b, s, delays, args))
    if results is None:
        return 130
    print_results(results, s)
    meta = run_meta(loop=loadgen.loop_name(), settings=asdict(s), leveret_src=args.leveret_src)
    return write_results(args.output, meta, results)


if __name__ == "__main__":
    sys.exit(main())
