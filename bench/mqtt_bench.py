"""MQTT throughput: leveret beside mosquitto and RabbitMQ's MQTT plugin, same client, same run.

Usage::

    python bench/mqtt_bench.py                                 # every broker that can, all cases
    python bench/mqtt_bench.py --messages 50000 --seconds 5    # a quicker run
    python bench/mqtt_bench.py --protocol 5                    # MQTT 5.0 (RabbitMQ 3.10 has none)

Cases (100-byte payloads, anonymous clients, clean sessions, MQTT 3.1.1 unless
``--protocol 5``):

* ``qos0``: one publisher, one subscriber on the same topic, QoS 0 both ways.
* ``qos1``: the same at QoS 1: the publisher keeps at most ``--inflight`` (100) PUBLISHes
  without their PUBACK, and the subscription is QoS 1, so the subscriber PUBACKs every
  delivery (mosquitto's ``max_inflight_messages``, RabbitMQ's ``mqtt.prefetch`` and the
  MQTT 5 receive maximum are set to ``--inflight`` too).
* ``fanout``: one publisher, ``--fan`` (100) subscribers on the same topic, QoS 0.
* ``fanin``: ``--fan`` (100) publishers, each to its own topic ``.../in/N``, one
  subscriber to ``.../in/+``, QoS 0.

Each case is bounded by ``--messages`` (deliveries: for ``fanout``, 100 per publish) and
``--seconds``, whichever comes first. The publisher also keeps at most ``--window``
(10,000) deliveries between what it published and what the subscribers counted, so no
broker builds a backlog it would then have to page or drop. The rate is end to end:
deliveries counted by the subscribers ÷ time from the start to the last delivery.

Processes: the subscribers run in ``--sub-procs`` (1) processes, the publishers in one
other process, and this process only starts them and samples ``/proc``: CPU of the
broker's process tree, of each load generator process and of the whole machine, over the
window from the start to the last delivery. The tables show msg/s, broker µs CPU per
delivery, the ratios leveret/RabbitMQ and leveret/mosquitto, and which process saturated.
Details: bench/README.md, section "MQTT".
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import queue
import secrets
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402
from brokers import (  # noqa: E402
    Broker,
    Leveret,
    Mosquitto,
    RabbitMQ,
    machine_cpu,
    mosquitto_installed,
    proc_cpu_seconds,
    rabbitmq_installed,
    raise_nofile_limit,
)
from mqtt_client import Client, MqttError, Publishes, connect_many, install_uvloop  # noqa: E402
from report import fmt, log, ratio  # noqa: E402

BROKERS = ("leveret", "mosquitto", "rabbitmq")
CASES = ("qos0", "qos1", "fanout", "fanin")


# ------------------------------------------------------------------ settings and jobs
@dataclass
class Settings:
    messages: int = 200_000  # deliveries per case at most
    seconds: float = 10.0  # publishing time per case at most
    body_size: int = 100
    fan: int = 100  # fanout subscribers / fanin publishers
    inflight: int = 100  # QoS 1: PUBLISHes without PUBACK per publisher connection
    window: int = 10_000  # deliveries published but not yet counted, at most
    batch: int = 50  # PUBLISH packets per write
    sub_procs: int = 1
    read_pause_ms: float = 1.0  # subscribers: pause after a small read (see mqtt_client.Client)
    protocol: int = 4  # 4: MQTT 3.1.1, 5: MQTT 5.0
    idle: float = 3.0  # seconds without a delivery after publishing ends: the rest is lost
    pause: float = 1.0


@dataclass
class Case:
    """One case's shape: ``publishers`` connections publish, ``subscribers`` connections
    each receive every message (their filter matches every topic the publishers use)."""

    name: str
    qos: int
    publishers: int
    subscribers: int

    @staticmethod
    def of(name: str, s: Settings) -> Case:
        return {
            "qos0": Case(name, 0, 1, 1),
            "qos1": Case(name, 1, 1, 1),
            "fanout": Case(name, 0, 1, s.fan),
            "fanin": Case(name, 0, s.fan, 1),
        }[name]


@dataclass
class Job:
    """What one worker process does (picklable)."""

    host: str
    port: int
    prefix: str  # topic prefix, unique per case and broker
    case: Case
    settings: Settings
    first: int = 0  # subscribers: index of this process's first connection
    count: int = 0  # subscribers: connections in this process


# ------------------------------------------------------------------ worker processes
async def _subscribe_all(job: Job, counts, slot: int) -> list[Client]:
    s, case = job.settings, job.case
    ids = [f"{job.prefix}-sub-{job.first + i}" for i in range(job.count)]
    clients = await connect_many(job.host, job.port, ids, s.protocol, receive_maximum=s.inflight)
    topic_filter = f"{job.prefix}/in/+" if case.name == "fanin" else f"{job.prefix}/t"
    await asyncio.gather(*(c.subscribe(topic_filter, case.qos) for c in clients))
    for c in clients:
        c.shared, c.slot = counts, slot
        # each of many connections gets a share of the deliveries: pause longer so that
        # a read still takes several (100 subscribers: 10 ms)
        c.read_pause = s.read_pause_ms / 1000 * max(1, job.count // 10)
    return clients


async def _subscriber(job: Job, slot: int, ready, start, counts, published, results) -> None:
    clients = await _subscribe_all(job, counts, slot)
    ready.put(("ready", slot, os.getpid()))
    while not start.is_set():
        await asyncio.sleep(0.001)
    hard_stop = time.monotonic() + job.settings.seconds + 120
    last_total, last_change = -1, time.monotonic()
    while True:
        await asyncio.sleep(0.02)
        total = sum(c.received for c in clients)
        now = time.monotonic()
        if total != last_total:
            last_total, last_change = total, now
        done = published.value
        # once the publisher has finished, everything it published is due here
        if done >= 0 and (total >= done * job.count or now - last_change > job.settings.idle):
            break
        if now > hard_stop or all(c.closed for c in clients):
            break
    lost_connections = [c.close_reason for c in clients if c.closed]
    for c in clients:
        c.disconnect()
    await asyncio.sleep(0.05)
    results.put(
        (
            "sub",
            slot,
            {
                "received": last_total,
                "last_rx": max(c.last_rx for c in clients),
                "closed": lost_connections[:3],
                "closed_count": len(lost_connections),
            },
        )
    )


async def _publisher(job: Job, ready, start, counts, published, results) -> None:
    s, case = job.settings, job.case
    ids = [f"{job.prefix}-pub-{i}" for i in range(case.publishers)]
    clients = await connect_many(job.host, job.port, ids, s.protocol)
    payload = b"m" * s.body_size
    if case.name == "fanin":
        topics = [f"{job.prefix}/in/{i}" for i in range(case.publishers)]
    else:
        topics = [f"{job.prefix}/t"]
    encoders = [
        Publishes(topics[i % len(topics)], payload, case.qos, s.protocol) for i in range(len(clients))
    ]
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future] = []

    def wake() -> None:  # a PUBACK arrived (or 1 ms passed): the window may have room
        if waiting and not waiting[0].done():
            waiting[0].set_result(None)

    for c in clients:
        c.wake = wake
    fan = case.subscribers
    total = max(1, s.messages // fan)  # messages to publish
    quota = [total // len(clients) + (i < total % len(clients)) for i in range(len(clients))]
    sent = [0] * len(clients)
    ready.put(("ready", "pub", os.getpid()))
    while not start.is_set():
        await asyncio.sleep(0.001)
    deadline = time.monotonic() + s.seconds
    published_total = 0
    turn = 0
    n = len(clients)
    while published_total < total and time.monotonic() < deadline:
        room = (s.window - (published_total * fan - sum(counts))) // fan
        if room < min(s.batch, total - published_total):
            room = 0  # wait for a whole batch's room: fewer, larger writes
        wrote = False
        for k in range(n):
            if room <= 0:
                break
            i = (turn + k) % n
            c = clients[i]
            if c.closed:
                raise MqttError(f"publisher {i}: {c.close_reason}")
            want = min(s.batch, quota[i] - sent[i], room)
            if case.qos:
                free = s.inflight - (sent[i] - c.acked)
                # a quarter of the window at a time: not a write (and a wake-up) per PUBACK
                want = min(want, free) if free >= min(s.inflight // 4 or 1, quota[i] - sent[i]) else 0
            if want <= 0:
                continue
            c.write(encoders[i].batch(want))
            sent[i] += want
            published_total += want
            room -= want
            wrote = True
            if c.paused:
                await c.drain()
        turn = (turn + 1) % n
        if wrote:
            await asyncio.sleep(0)  # let the loop read PUBACKs
        elif case.qos:  # until a PUBACK comes, or 1 ms for the end-to-end window
            waiting[:] = [loop.create_future()]
            timer = loop.call_later(0.001, wake)
            await waiting[0]
            timer.cancel()
        else:  # (uvloop's timers count whole ms: a shorter sleep would spin)
            await asyncio.sleep(0.001)
    t_end = time.monotonic()
    published.value = published_total
    acked = 0
    if case.qos:  # wait (bounded) for the last PUBACKs
        limit = time.monotonic() + 30
        while sum(c.acked for c in clients) < published_total and time.monotonic() < limit:
            if all(c.closed for c in clients):
                break
            await asyncio.sleep(0.01)
        acked = sum(c.acked for c in clients)
    for c in clients:
        c.disconnect()
    await asyncio.sleep(0.05)
    results.put(("pub", 0, {"published": published_total, "acked": acked, "t_end": t_end}))


def _worker(kind: str, job: Job, slot: int, ready, start, counts, published, results) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    install_uvloop()
    try:
        if kind == "sub":
            asyncio.run(_subscriber(job, slot, ready, start, counts, published, results))
        else:
            asyncio.run(_publisher(job, ready, start, counts, published, results))
    except Exception as exc:  # reported to the parent, which fails the case
        msg = f"{type(exc).__name__}: {exc}"
        ready.put(("error", slot, msg))
        results.put(("error", kind, msg))


# ------------------------------------------------------------------ measuring
@dataclass
class Sample:
    t: float
    received: int
    broker: float
    pub: float
    subs: list[float]
    machine: float
    harness: float


def sample(broker: Broker, pub_pid: int, sub_pids: list[int], counts) -> Sample:
    return Sample(
        time.monotonic(),
        sum(counts),
        broker.cpu_seconds(),
        proc_cpu_seconds(pub_pid),
        [proc_cpu_seconds(p) for p in sub_pids],
        machine_cpu()[0],
        proc_cpu_seconds(os.getpid()),
    )


def verdict(
    broker_pct: float, pub_pct: float, sub_pct: float, machine_pct: float, other_pct: float, cores: int
) -> str:
    """Which process limited the rate: a load generator process or the broker at ≥ 85% of
    a core (mosquitto and leveret's event loop use one; RabbitMQ's schedulers may use
    more, so it counts as saturated at 85% of one core too, and the figure shows how many
    it used); else the machine (≥ 85% of every core busy), saying so when processes
    outside the run (``other_pct``) took 25% of a core or more; else neither (the
    windows: end to end, or the PUBACKs)."""
    if pub_pct >= 85:
        return "publisher"
    if sub_pct >= 85:
        return "subscriber"
    if broker_pct >= 85:
        return "broker"
    if machine_pct >= 85 * cores:
        if other_pct >= 25:
            return f"all cores busy (others {other_pct:.0f}%)"
        return "machine (all cores)"
    return "neither (windows)"


def run_case(broker: Broker, port: int, name: str, s: Settings) -> dict:
    """Start the subscribers, then the publisher, then the clock; sample /proc every
    0.1 s until the workers report; the figures cover the start to the last delivery."""
    case = Case.of(name, s)
    ctx = mp.get_context("fork")
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    published = ctx.Value("q", -1, lock=False)
    procs = max(1, min(s.sub_procs, case.subscribers))
    counts = ctx.RawArray("q", procs)
    prefix = f"bench/{name}-{secrets.token_hex(3)}"
    workers = []
    per = [case.subscribers // procs + (i < case.subscribers % procs) for i in range(procs)]
    first = 0
    for slot in range(procs):
        job = Job(broker.host, port, prefix, case, s, first, per[slot])
        first += per[slot]
        workers.append(
            ctx.Process(
                target=_worker, args=("sub", job, slot, ready, start, counts, published, results), daemon=True
            )
        )
    pub = ctx.Process(
        target=_worker,
        args=("pub", Job(broker.host, port, prefix, case, s), 0, ready, start, counts, published, results),
        daemon=True,
    )
    try:
        for w in workers:
            w.start()
        _await_ready(ready, procs, name)
        pub.start()
        _await_ready(ready, 1, name)
        time.sleep(0.2)
        sub_pids = [w.pid or 0 for w in workers]
        first_sample = sample(broker, pub.pid or 0, sub_pids, counts)
        t0 = first_sample.t
        start.set()
        last = first_sample
        got: dict = {}
        limit = t0 + s.seconds + 180
        while len(got) < procs + 1 and time.monotonic() < limit:
            try:
                kind, slot, data = results.get(timeout=0.1)
                if kind == "error":
                    raise RuntimeError(f"{slot} worker: {data}")
                got[(kind, slot)] = data
            except queue.Empty:
                pass
            now = sample(broker, pub.pid or 0, sub_pids, counts)
            if now.received != last.received:
                last = now
        if len(got) < procs + 1:
            raise RuntimeError("the workers did not finish in time")
    finally:
        for p in (pub, *workers):
            p.join(5)
            if p.is_alive():
                p.kill()
    pub_res = got[("pub", 0)]
    subs = [got[("sub", i)] for i in range(procs)]
    received = sum(r["received"] for r in subs)
    last_rx = max(r["last_rx"] for r in subs)
    seconds = max(last_rx - t0, 1e-9)
    window = max(last.t - t0, 1e-9)
    broker_cpu = last.broker - first_sample.broker
    pub_cpu = last.pub - first_sample.pub
    sub_cpu = [b - a for a, b in zip(first_sample.subs, last.subs)]
    machine = last.machine - first_sample.machine
    harness = last.harness - first_sample.harness
    other = max(0.0, machine - broker_cpu - pub_cpu - sum(sub_cpu) - harness)
    expected = pub_res["published"] * case.subscribers
    row = {
        "case": name,
        "published": pub_res["published"],
        "acked": pub_res["acked"],
        "received": received,
        "lost": expected - received,
        "seconds": round(seconds, 4),
        "msg_per_s": round(received / seconds, 1),
        "broker_cpu_s": round(broker_cpu, 3),
        "broker_cpu_us_per_msg": round(broker_cpu / received * 1e6, 2) if received else None,
        "broker_cpu_pct": round(100 * broker_cpu / window, 1),
        "pub_cpu_pct": round(100 * pub_cpu / window, 1),
        "sub_cpu_pct": round(100 * max(sub_cpu) / window, 1),
        "loadgen_cpu_us_per_msg": round((pub_cpu + sum(sub_cpu)) / received * 1e6, 2) if received else None,
        "machine_cpu_pct": round(100 * machine / window, 1),
        "harness_cpu_pct": round(100 * harness / window, 1),
        "other_cpu_pct": round(100 * other / window, 1),
        "closed": [c for r in subs for c in r["closed"]],
    }
    row["saturated"] = verdict(
        row["broker_cpu_pct"],
        row["pub_cpu_pct"],
        row["sub_cpu_pct"],
        row["machine_cpu_pct"],
        row["other_cpu_pct"],
        os.cpu_count() or 1,
    )
    return row


def _await_ready(ready, n: int, name: str) -> None:
    for _ in range(n):
        kind, slot, data = ready.get(timeout=120)
        if kind == "error":
            raise RuntimeError(f"{name}: worker {slot} failed to set up: {data}")


# ------------------------------------------------------------------ brokers
def make_broker(name: str, s: Settings, args: argparse.Namespace) -> Broker:
    if name == "leveret":
        return Leveret(src=args.leveret_src, mqtt=True)
    if name == "mosquitto":
        return Mosquitto(max_inflight_messages=s.inflight)
    return RabbitMQ(schedulers=args.rabbitmq_schedulers, mqtt=True, mqtt_prefetch=s.inflight)


def available(name: str, s: Settings, args: argparse.Namespace) -> str | None:
    """None if the broker can run here, else why not."""
    if name == "leveret" and not Leveret(src=args.leveret_src).has_mqtt():
        return "this leveret has no MQTT yet (no `leveret server --mqtt-port`): skipped"
    if name == "mosquitto" and not mosquitto_installed():
        return "mosquitto is not installed (apt-get install -y mosquitto): skipped"
    if name == "rabbitmq":
        if not rabbitmq_installed():
            return "rabbitmq-server is not installed (apt-get install -y rabbitmq-server): skipped"
        if s.protocol == 5:
            return "RabbitMQ 3.10's MQTT plugin has no MQTT 5.0 (3.13 has): skipped"
    return None


def run_broker(name: str, cases: list[str], s: Settings, args: argparse.Namespace) -> dict:
    """Start one broker, run the cases, stop it (also on error or a signal)."""

    def body(broker: Broker, out: dict) -> None:
        report.run_cases(
            name,
            broker,
            cases,
            lambda case: run_case(broker, broker.mqtt_port, case, s),
            describe,
            out,
            s.pause,
        )

    return report.run_broker(name, make_broker(name, s, args), "MQTT", body)


def describe(case: str, row: dict) -> str:
    """A case's log line."""
    return (
        f"{case:7s} {row['received']:>8d} deliveries in {row['seconds']:6.2f} s = "
        f"{row['msg_per_s']:>9,.0f} msg/s  {row['broker_cpu_us_per_msg'] or 0:6.1f} µs CPU/msg  "
        f"broker {row['broker_cpu_pct']:5.1f}%  pub {row['pub_cpu_pct']:5.1f}%  "
        f"sub {row['sub_cpu_pct']:5.1f}%  machine {row['machine_cpu_pct']:5.1f}% "
        f"(others {row['other_cpu_pct']:.0f}%)  lost {row['lost']}"
        f"  -> {row['saturated']}"
    )


# ------------------------------------------------------------------ output
def tables(results: dict, cases: list[str]) -> list[tuple[str, list[str], list[list[str]]]]:
    names = [b for b in BROKERS if b in results]
    rows = {b: results[b].get("rows", {}) for b in names}
    head = ["case", *(f"{b} msg/s" for b in names), *(f"{b} µs CPU/msg" for b in names)]
    lev, mos, rmq = rows.get("leveret", {}), rows.get("mosquitto", {}), rows.get("rabbitmq", {})
    ratios = []
    if lev and rmq:
        ratios += ["leveret/RabbitMQ msg/s", "leveret/RabbitMQ CPU/msg"]
    if lev and mos:
        ratios += ["leveret/mosquitto msg/s", "leveret/mosquitto CPU/msg"]
    if not lev and mos and rmq:
        ratios += ["mosquitto/RabbitMQ msg/s", "mosquitto/RabbitMQ CPU/msg"]
    head += ratios
    main_rows = []
    for case in cases:
        cells = [case]
        cells += [fmt(rows[b].get(case, {}).get("msg_per_s")) for b in names]
        cells += [fmt(rows[b].get(case, {}).get("broker_cpu_us_per_msg"), ".2f") for b in names]
        for label in ratios:
            a_name, b_name = label.split(" ")[0].split("/")
            a, b = rows[a_name.lower()].get(case, {}), rows[b_name.lower()].get(case, {})
            key = "msg_per_s" if label.endswith("msg/s") else "broker_cpu_us_per_msg"
            cells.append(fmt(ratio(a.get(key), b.get(key)), ".2f"))
        main_rows.append(cells)
    sat_head = [
        "broker",
        "case",
        "broker CPU %",
        "publisher CPU %",
        "subscriber CPU %",
        "machine CPU %",
        "others CPU %",
        "loadgen µs CPU/msg",
        "lost",
        "saturated",
    ]
    sat_rows = []
    for b in names:
        for case in cases:
            r = rows[b].get(case)
            if r is None:
                err = results[b].get("errors", {}).get(case) or results[b].get("errors", {}).get("start")
                if err:
                    sat_rows.append([b, case, *["-"] * (len(sat_head) - 3), f"error: {err[:60]}"])
                continue
            sat_rows.append(
                [
                    b,
                    case,
                    fmt(r["broker_cpu_pct"], ".0f"),
                    fmt(r["pub_cpu_pct"], ".0f"),
                    fmt(r["sub_cpu_pct"], ".0f"),
                    fmt(r["machine_cpu_pct"], ".0f"),
                    fmt(r["other_cpu_pct"], ".0f"),
                    fmt(r["loadgen_cpu_us_per_msg"], ".2f"),
                    str(r["lost"]),
                    r["saturated"],
                ]
            )
    return [
        ("MQTT throughput (deliveries/s, end to end)", head, main_rows),
        ("Saturation check (100% = one core)", sat_head, sat_rows),
    ]


def print_tables(results: dict, cases: list[str]) -> None:
    for title, head, rows in tables(results, cases):
        report.print_markdown_table(head, rows, title)


#: the Settings given on the command line (``--sub-procs`` for ``sub_procs``): help text
OPTIONS = {
    "messages": "deliveries per case at most",
    "seconds": "publishing time per case at most (s)",
    "body_size": "payload bytes",
    "fan": "fanout subscribers and fanin publishers",
    "inflight": "QoS 1: PUBLISHes awaiting PUBACK per publisher; also the brokers' QoS 1 delivery window",
    "window": "deliveries published but not yet received, at most (end to end)",
    "batch": "PUBLISH packets per write",
    "sub_procs": "subscriber processes",
    "read_pause_ms": "subscribers stop reading this long (× connections/10 in a process with more) "
    "after a read under 32 KiB (0: never)",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated: " + ", ".join(BROKERS))
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    for name, text in OPTIONS.items():
        default = getattr(d, name)
        p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default, help=text)
    p.add_argument(
        "--protocol", type=int, choices=(3, 4, 5), default=4, help="MQTT version: 4 (or 3) = 3.1.1, 5 = 5.0"
    )
    p.add_argument("--leveret-src", default=None, help="run leveret from another tree's src/")
    p.add_argument("--rabbitmq-schedulers", type=int, default=None, help="Erlang scheduler threads")
    p.add_argument("--output", default=str(HERE / "results" / "mqtt-latest.json"), help="JSON results path")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, report.sigterm)
    raise_nofile_limit()
    s = Settings(**{name: getattr(args, name) for name in OPTIONS}, protocol=5 if args.protocol == 5 else 4)
    cases, brokers = report.split_names(args.cases), report.split_names(args.brokers)
    report.check_names([*cases, *brokers], CASES, BROKERS)
    skipped = {}
    for b in list(brokers):
        why = available(b, s, args)
        if why:
            log(f"NOTE: {b}: {why}")
            skipped[b] = why
            brokers.remove(b)
    version = "MQTT 5.0" if s.protocol == 5 else "MQTT 3.1.1"
    log(
        f"cases: {', '.join(cases)}; {version}; {s.messages} deliveries or {s.seconds:g} s each, "
        f"{s.body_size} B payloads"
    )
    results = report.run_each(brokers, lambda b: run_broker(b, cases, s, args))
    if results is None:
        return 130
    print(
        f"\n{version}, {s.body_size} B payloads; brokers skipped: "
        + ("; ".join(f"{b} ({w})" for b, w in skipped.items()) or "none")
    )
    print_tables(results, cases)
    meta = report.run_meta(settings=asdict(s), cases=cases, skipped=skipped)
    return report.write_results(args.output, meta, results)


if __name__ == "__main__":
    sys.exit(main())
