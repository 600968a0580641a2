"""Run the benchmark workloads against leveret and/or a private RabbitMQ.

Usage::

    python bench/run.py                              # both brokers, all workloads
    python bench/run.py --only rabbitmq --messages 50000 --seconds 5
    python bench/run.py --workloads publish,pubsub   # or letters: a,c
    python bench/run.py --workers 1,2                # also leveret --workers 1 and 2, in the same run
    python bench/run.py --baseline-src ../old/src    # also leveret from an older tree: before/after
    python bench/run.py --workloads l1               # LavinMQ's L1: l1-16b, l1-1k
    python bench/run.py --workloads latency --latency-rates 10k,50k
    python bench/run.py --workloads memory --idle-queues 10000 --idle-connections 1000

Prints a side-by-side table (msg/s, ratio leveret/rabbitmq, broker µs CPU
per message, RSS, pubsub latency), tables of the workloads with figures of their own
(L1, fixed-rate latency, idle memory, backlog, ...) and writes ``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import resource
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from brokers import Broker, Leveret, RabbitMQ, rabbitmq_installed  # noqa: E402
from loadgen import Connection, loop_name, new_event_loop  # noqa: E402
from report import start  # noqa: E402
from workloads import (  # noqa: E402
    ALIASES,
    BACKLOG_SECTION,
    EXTRA_WORKLOADS,
    L1_SECTION,
    MEMORY_SECTION,
    REDELIVERY_SECTION,
    TIME_LIMITS,
    WORKLOADS,
    Meter,
    Row,
    Settings,
    parse_rates,
)

BROKERS = ("leveret", "rabbitmq")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("leveret", "rabbitmq", "both"), default="both",
                   help="which broker(s) to benchmark (default: both)")
    p.add_argument("--messages", type=int, default=d.messages,
                   help=f"max messages per workload (default {d.messages})")
    p.add_argument("--seconds", type=float, default=d.seconds,
                   help=f"max seconds of timed phase per workload (default {d.seconds:g})")
    p.add_argument("--workloads", default="all",
                   help="comma-separated: " + ",".join(w for w in WORKLOADS if w not in EXTRA_WORKLOADS)
                   + " (or a,b,c,d,e,f; default all); opt-in: " + ",".join(EXTRA_WORKLOADS))
    p.add_argument("--body-size", type=int, default=d.body_size,
                   help="body bytes for workloads a-d (default 100)")
    p.add_argument("--prefetch", type=int, default=d.prefetch, help="consumer prefetch (default 1000)")
    p.add_argument("--ack-every", type=int, default=d.ack_every,
                   help="consumers ack (multiple=True) every N deliveries (default 100)")
    p.add_argument("--batch", type=int, default=d.batch,
                   help="messages per socket write when flooding (default 500)")
    p.add_argument("--latency-window", type=int, default=d.latency_window,
                   help="pubsub: max messages in flight (default 1000)")
    p.add_argument("--latency-rate", type=int, default=d.latency_rate,
                   help="latency workload: fixed publish rate in msg/s (default 5000)")
    p.add_argument("--latency-rates", type=parse_rates, default=None, metavar="R[,R...]",
                   help="latency workload: one row per fixed rate, msg/s (e.g. 10000,50000 or 10k,50k; "
                        "overrides --latency-rate)")
    p.add_argument("--l1-publishers", type=int, default=d.l1_publishers,
                   help=f"l1-16b, l1-1k: publisher processes (default {d.l1_publishers}, as lavinmqperf -x1)")
    p.add_argument("--idle-queues", type=int, default=d.idle_queues,
                   help=f"idle-queues: queues declared (default {d.idle_queues})")
    p.add_argument("--idle-connections", type=int, default=d.idle_connections,
                   help=f"idle-connections: AMQP connections opened (default {d.idle_connections})")
    p.add_argument("--confirm-window", type=int, default=d.confirm_window,
                   help="confirm workloads: max unconfirmed publishes (default 1000)")
    p.add_argument("--backlog-messages", type=int, default=d.backlog_messages,
                   help="backlog/recovery: persistent messages in the backlog "
                   f"(default {d.backlog_messages})")
    p.add_argument("--backlog-body-size", type=int, default=d.backlog_body_size,
                   help=f"backlog/recovery: body bytes (default {d.backlog_body_size})")
    p.add_argument("--nack-messages", type=int, default=d.nack_messages,
                   help=f"nack-heavy: messages, each nacked {d.nack_rejects}x then acked "
                   f"(default {d.nack_messages}; capped by --messages)")
    p.add_argument("--delayed-messages", type=int, default=d.delayed_messages,
                   help=f"delayed-redeliveries: messages (default {d.delayed_messages}; "
                   "capped by --messages)")
    p.add_argument("--redelivery-delay", type=int, default=d.redelivery_delay,
                   help=f"delayed-redeliveries: delay in ms (default {d.redelivery_delay})")
    p.add_argument("--rabbitmq-schedulers", type=int, default=None,
                   help="Erlang scheduler threads for RabbitMQ (default: one per core)")
    p.add_argument("--workers", default="", metavar="N[,N...]",
                   help="also run leveret with --workers N (connection worker processes) for each N, "
                        "between the single-process leveret and RabbitMQ, and print a table of them")
    p.add_argument("--python", default=sys.executable, help="interpreter used to start leveret")
    p.add_argument("--leveret-src", default=None,
                   help="run the broker from another source tree's src/ (e.g. a worktree of an "
                        "older commit), to compare before and after with the same bench")
    p.add_argument("--baseline-src", default=None, metavar="DIR",
                   help="also run leveret from this source tree's src/ (e.g. a worktree of the commit "
                        "before a change), in the same run, and print a before/after table")
    p.add_argument("--output", default=str(HERE / "results" / "latest.json"), help="JSON results path")
    p.add_argument("--pause", type=float, default=1.0, help="seconds to idle between workloads (default 1)")
    p.add_argument("--scrape-metrics", type=float, default=0.0, metavar="SECONDS",
                   help="leveret: scrape its Prometheus /metrics and /metrics/per-object every SECONDS "
                        "during the workloads (the cost of being watched; default 0: never)")
    return p.parse_args(argv)


def resolve_workloads(spec: str) -> list[str]:
    names: list[str] = []
    for part in (x.strip().lower() for x in spec.split(",") if x.strip()):
        expanded = ALIASES.get(part) or ([part] if part in WORKLOADS else None)
        if expanded is None:
            raise SystemExit(f"unknown workload {part!r}; choose from {', '.join(WORKLOADS)} or a-f")
        names.extend(n for n in expanded if n not in names)
    return names


#: The name in the results of leveret run with ``--workers N`` is this followed by N.
WORKERS = "leveret-workers-"
#: The name in the results of leveret run from ``--baseline-src``.
BASELINE = "leveret-baseline"


def make_broker(name: str, args: argparse.Namespace) -> Broker:
    if name == "leveret":
        return Leveret(python=args.python, src=args.leveret_src)
    if name == BASELINE:
        return Leveret(python=args.python, src=args.baseline_src)
    if name.startswith(WORKERS):
        return Leveret(python=args.python, src=args.leveret_src,
                       extra_args=["--workers", name.removeprefix(WORKERS)])
    return RabbitMQ(schedulers=args.rabbitmq_schedulers)


def row_result(row: Row, meter: Meter) -> dict:
    """Flatten a Row plus the meter's CPU/RSS figures (units in the key names)."""
    out = {
        "messages": row.messages,
        "seconds": round(row.seconds, 4),
        "msg_per_s": round(row.rate, 1),
        "broker_cpu_s": round(meter.broker_cpu, 4),
        "broker_cpu_us_per_msg": round(meter.broker_cpu / row.messages * 1e6, 2) if row.messages else None,
        "broker_cpu_pct": round(100 * meter.broker_cpu / meter.seconds, 1) if meter.seconds else None,
        "loadgen_cpu_pct": round(100 * meter.gen_cpu / meter.seconds, 1) if meter.seconds else None,
        "broker_rss_mb": round(meter.rss_bytes / 2**20, 1),
    }
    out.update(row.extra)
    if "phase_broker_cpu_s" in row.extra:  # priority: each row has its own window
        extra = out
        cpu, seconds = extra.pop("phase_broker_cpu_s"), extra.pop("phase_seconds")
        gen, rss = extra.pop("phase_loadgen_cpu_s"), extra.pop("phase_rss_bytes")
        out.update(broker_cpu_s=round(cpu, 4),
                   broker_cpu_us_per_msg=round(cpu / row.messages * 1e6, 2) if row.messages else None,
                   broker_cpu_pct=round(100 * cpu / seconds, 1) if seconds else None,
                   loadgen_cpu_pct=round(100 * gen / seconds, 1) if seconds else None,
                   broker_rss_mb=round(rss / 2**20, 1))
    elif "cpu_at_count_s" in row.extra:  # recovery: CPU of the new process from its start
        cpu = row.extra["cpu_at_count_s"]
        out.update(broker_cpu_s=cpu,
                   broker_cpu_us_per_msg=round(cpu / row.messages * 1e6, 2) if row.messages else None,
                   broker_cpu_pct=round(100 * cpu / row.seconds, 1) if row.seconds else None,
                   loadgen_cpu_pct=None, broker_rss_mb=row.extra["rss_after_first_mb"])
    elif "rss_settled_mb" in row.extra:  # backlog: RSS 5 s after the last confirm
        out["broker_rss_mb"] = row.extra["rss_settled_mb"]
    elif "rss_held_mb" in row.extra:  # delayed redeliveries: RSS when all were rejected
        out["broker_rss_mb"] = row.extra["rss_held_mb"]
    return out


async def _server_info(broker: Broker) -> dict:
    conn = await Connection.open(broker.host, broker.port)
    props = conn.server_properties
    await conn.close()
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in props.items()
            if k in ("product", "version", "platform")}


def run_broker(name: str, workloads: list[str], settings: Settings, args: argparse.Namespace) -> dict:
    """Start one broker, run the workloads in order, stop it.  Returns {"info", "rows", "errors"}."""
    out: dict = {"info": {}, "rows": {}, "errors": {}}
    broker = make_broker(name, args)
    t = start(name, broker, out)
    if t is None:
        return out
    loop = new_event_loop()
    stack = contextlib.ExitStack()
    try:
        log(f"[{name}] ready on {broker.host}:{broker.port} (pid {broker.pid}) "
            f"in {time.monotonic() - t:.1f}s")
        try:
            out["info"] = loop.run_until_complete(_server_info(broker))
        except Exception as e:
            out["info"] = {"error": repr(e)}
        out["info"]["pid"] = broker.pid
        out["info"]["idle_rss_mb"] = round(broker.rss_bytes() / 2**20, 1)
        scraper = start_scraper(broker, args.scrape_metrics)
        if scraper is not None:
            out["info"]["scrape_metrics_s"] = args.scrape_metrics
            stack.callback(lambda: out["info"].update(scrapes=scraper.stop()))
        for wl_name in workloads:
            if not broker.alive():
                out["errors"][wl_name] = "broker is not running"
                log(f"[{name}] {wl_name}: skipped, broker died\n{broker.log_tail()}")
                continue
            meter = Meter(broker)
            limit = 2 * settings.seconds + 2 * settings.grace + 60
            if wl_name in TIME_LIMITS:
                limit = TIME_LIMITS[wl_name](settings)
            try:
                rows = loop.run_until_complete(
                    asyncio.wait_for(WORKLOADS[wl_name](broker, settings, meter), limit))
            except Exception as e:  # keep going with the next workload
                out["errors"][wl_name] = f"{type(e).__name__}: {e}"
                log(f"[{name}] {wl_name}: FAILED: {type(e).__name__}: {e}")
                continue
            for row in rows:
                r = row_result(row, meter)
                out["rows"][row.name] = r
                lat = f"  p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms" if "p50_ms" in r else ""
                if "consumer_cpu_pct" in r:
                    lat += f"  consumer {r['consumer_cpu_pct']:.0f}% publishers {r['publisher_cpu_pct']}% CPU"
                if r.get("rss_bytes_per_item") is not None:
                    lat += f"  {r['rss_bytes_per_item']:,.0f} B each"
                log(f"[{name}] {row.name:15s} {r['messages']:>8d} msgs in {r['seconds']:6.2f}s = "
                    f"{r['msg_per_s']:>10,.0f} msg/s  {r['broker_cpu_us_per_msg'] or 0:7.2f} µs CPU/msg  "
                    f"broker {r['broker_cpu_pct'] or 0:5.1f}% CPU  "
                    f"loadgen {r['loadgen_cpu_pct'] or 0:5.1f}% CPU  "
                    f"RSS {r['broker_rss_mb']:.0f} MB{lat}")
            time.sleep(args.pause)
    finally:
        stack.close()
        loop.close()
        log(f"[{name}] stopping")
        broker.stop()
    return out


class Scraper(threading.Thread):
    """Scrapes a broker's Prometheus endpoints every ``interval`` seconds, as a
    Prometheus server would, until :meth:`stop` (which returns how many scrapes)."""

    def __init__(self, url: str, interval: float) -> None:
        super().__init__(name="scraper", daemon=True)
        self.url, self.interval = url, interval
        self.done = threading.Event()
        self.count = 0
        self.errors = 0

    def run(self) -> None:
        while not self.done.wait(self.interval):
            for path in ("/metrics", "/metrics/per-object"):
                try:
                    with urllib.request.urlopen(self.url + path, timeout=10) as reply:
                        reply.read()
                    self.count += 1
                except OSError:
                    self.errors += 1

    def stop(self) -> int:
        self.done.set()
        self.join(15)
        if self.errors:
            log(f"[scraper] {self.errors} scrape(s) failed")
        return self.count


def start_scraper(broker: Broker, interval: float) -> Scraper | None:
    """A running :class:`Scraper` of ``broker`` (leveret with metrics), or None."""
    url = getattr(broker, "prometheus_url", lambda: None)() if interval > 0 else None
    if url is None:
        if interval > 0:
            log(f"[{broker.name}] has no Prometheus endpoint: not scraped")
        return None
    scraper = Scraper(url, interval)
    scraper.start()
    return scraper


# ------------------------------------------------------------------ output
def _fmt(v, spec: str = ",.0f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def table_rows(results: dict) -> list[list[str]]:
    lev = results.get("leveret", {}).get("rows", {})
    rmq = results.get("rabbitmq", {}).get("rows", {})
    names = [n for n in dict.fromkeys([*lev, *rmq])
             if (lev.get(n) or rmq.get(n)).get("section") not in (BACKLOG_SECTION, REDELIVERY_SECTION,
                                                                   MEMORY_SECTION)]
    rows = []
    for n in names:
        a, b = lev.get(n, {}), rmq.get(n, {})
        ra, rb = a.get("msg_per_s"), b.get("msg_per_s")
        ratio = ra / rb if ra is not None and rb else None

        def lat(r: dict) -> str:
            return f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f}" if "p50_ms" in r else "-"

        rows.append([
            n, _fmt(ra), _fmt(rb), _fmt(ratio, ".2f"),
            _fmt(a.get("broker_cpu_us_per_msg"), ".1f"), _fmt(b.get("broker_cpu_us_per_msg"), ".1f"),
            _fmt(a.get("broker_rss_mb"), ".0f"), _fmt(b.get("broker_rss_mb"), ".0f"),
            lat(a), lat(b),
        ])
    return rows


HEADERS = ["workload", "leveret msg/s", "rabbitmq msg/s", "ratio lev/rmq",
           "leveret µs CPU/msg", "rabbitmq µs CPU/msg", "leveret RSS MB", "rabbitmq RSS MB",
           "leveret p50/p99 ms", "rabbitmq p50/p99 ms"]
TABLE_WIDTH = 190  # used when stdout is not a terminal (rich would default to 80)


def backlog_rows(results: dict) -> list[list[str]]:
    """One line per figure of the backlog/recovery workloads: leveret, rabbitmq, ratio."""
    lev = results.get("leveret", {}).get("rows", {})
    rmq = results.get("rabbitmq", {}).get("rows", {})
    names = [n for n in dict.fromkeys([*lev, *rmq])
             if (lev.get(n) or rmq.get(n)).get("section") == BACKLOG_SECTION]
    backlog_fields = [
        ("publish msg/s", "msg_per_s", ",.0f"),
        ("µs CPU/msg", "broker_cpu_us_per_msg", ".1f"),
        ("idle RSS MB (before)", "idle_rss_mb", ",.0f"),
        ("RSS MB (5 s after)", "rss_settled_mb", ",.0f"),
        ("peak RSS MB", "peak_rss_mb", ",.0f"),
        ("RSS B/queued msg", "rss_bytes_per_msg", ",.0f"),
        ("RSS growth B/msg", "rss_growth_bytes_per_msg", ",.0f"),
        ("disk MB", "disk_mb", ",.0f"),
        ("disk B/msg", "disk_bytes_per_msg", ",.0f"),
        ("drain msg/s", "drain_msg_per_s", ",.0f"),
        ("drain µs CPU/msg", "drain_cpu_us_per_msg", ".1f"),
        ("drain peak RSS MB", "drain_peak_rss_mb", ",.0f"),
    ]
    recovery_fields = [
        ("stop s", "stop_s", ".2f"),
        ("port up s", "ready_s", ".2f"),
        ("count = N s", "count_s", ".2f"),
        ("first message s", "first_message_s", ".2f"),
        ("CPU s until count", "cpu_at_count_s", ".1f"),
        ("RSS MB after", "rss_after_first_mb", ",.0f"),
    ]
    out = []
    for n in names:
        a, b = lev.get(n, {}), rmq.get(n, {})
        for label, key, spec in (recovery_fields if "count_s" in (a or b) else backlog_fields):
            va, vb = a.get(key), b.get(key)
            ratio = va / vb if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and vb else None
            out.append([f"{n} ({(a or b).get('messages', 0):,}): {label}", _fmt(va, spec), _fmt(vb, spec),
                        _fmt(ratio, ".2f")])
    return out


def redelivery_rows(results: dict) -> list[list[str]]:
    """One line per figure of the delayed-redeliveries workloads: leveret, rabbitmq, ratio."""
    lev = results.get("leveret", {}).get("rows", {})
    rmq = results.get("rabbitmq", {}).get("rows", {})
    names = [n for n in dict.fromkeys([*lev, *rmq])
             if (lev.get(n) or rmq.get(n)).get("section") == REDELIVERY_SECTION]
    fields = [
        ("mode", "mode", "s"),
        ("time to reject all s", "reject_s", ".2f"),
        ("rejects/s", "reject_msg_per_s", ",.0f"),
        ("µs CPU/msg while rejecting", "reject_cpu_us_per_msg", ".1f"),
        ("broker / loadgen CPU % while rejecting", "reject_broker_cpu_pct", ".0f"),
        ("held when all rejected (peak)", "held_at_reject_end", ",d"),
        ("RSS MB: queue full → all rejected", "rss_held_mb", ",.0f"),
        ("RSS MB peak", "peak_rss_mb", ",.0f"),
        ("time until all acked s", "total_s", ".2f"),
        ("  of which after the last reject s", "after_reject_s", ".2f"),
        ("acked msg/s (whole run)", "msg_per_s", ",.0f"),
        ("µs CPU/acked msg (whole run)", "broker_cpu_us_per_msg", ".1f"),
    ]
    out = []
    for n in names:
        a, b = lev.get(n, {}), rmq.get(n, {})
        for label, key, spec in fields:
            va, vb = a.get(key), b.get(key)
            ratio = va / vb if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and vb else None
            if key == "held_at_reject_end":
                sa = f"{va:,} ({a['held_peak']:,})" if va is not None else "-"
                sb = f"{vb:,} ({b['held_peak']:,})" if vb is not None else "-"
            elif key == "reject_broker_cpu_pct":
                sa = f"{va:.0f} / {a['reject_loadgen_cpu_pct']:.0f}" if va is not None else "-"
                sb = f"{vb:.0f} / {b['reject_loadgen_cpu_pct']:.0f}" if vb is not None else "-"
                ratio = None
            elif key == "rss_held_mb":
                sa = f"{a['rss_full_mb']:,.0f} → {va:,.0f}" if va is not None else "-"
                sb = f"{b['rss_full_mb']:,.0f} → {vb:,.0f}" if vb is not None else "-"
            else:
                sa, sb = _fmt(va, spec), _fmt(vb, spec)
            out.append([f"{n} ({(a or b).get('messages', 0):,}): {label}", sa, sb,
                        "" if key == "mode" else _fmt(ratio, ".2f")])
    return out


def saturation_rows(results: dict) -> list[list[str]]:
    out = []
    for broker, res in results.items():
        for n, r in res.get("rows", {}).items():
            if "cpu_at_count_s" in r:
                continue  # recovery: no load-generator window
            out.append([broker, n, _fmt(r.get("broker_cpu_pct"), ".0f"),
                        _fmt(r.get("loadgen_cpu_pct"), ".0f")])
    return out


def priority_rows(results: dict) -> list[list[str]]:
    """The priority workload: µs CPU/msg on the classic and the priority queue, and
    their ratio (the target: priority within 1.2× classic), per broker and phase."""
    out = []
    for broker, res in results.items():
        got = res.get("rows", {})
        for phase in ("publish", "consume"):
            classic, prio = got.get(f"{phase} classic"), got.get(f"{phase} priority")
            if not classic or not prio:
                continue
            a, b = classic.get("broker_cpu_us_per_msg"), prio.get("broker_cpu_us_per_msg")
            out.append([broker, phase, _fmt(classic.get("msg_per_s")), _fmt(prio.get("msg_per_s")),
                        _fmt(a, ".1f"), _fmt(b, ".1f"), _fmt(b / a if a and b else None, ".2f")])
        windows = [got.get(f"{phase} {kind}") for kind in ("classic", "priority")
                   for phase in ("publish", "consume")]
        if all(w and w.get("broker_cpu_s") is not None and w.get("messages") for w in windows):
            a, b = ((windows[i]["broker_cpu_s"] + windows[i + 1]["broker_cpu_s"])
                    / windows[i]["messages"] * 1e6 for i in (0, 2))
            out.append([broker, "publish + consume", "-", "-", _fmt(a, ".1f"), _fmt(b, ".1f"),
                        _fmt(b / a, ".2f")])
    return out


PRIORITY_HEADERS = ["broker", "phase", "classic msg/s", "priority msg/s", "classic µs CPU/msg",
                    "priority µs CPU/msg", "ratio priority/classic"]


def workers_rows(results: dict) -> list[list[str]]:
    """The throughput workloads for each leveret --workers N beside the single process
    and RabbitMQ: msg/s, ratios, broker µs CPU/msg (all of its processes) and CPU %."""
    one = results.get("leveret", {}).get("rows", {})
    rmq = results.get("rabbitmq", {}).get("rows", {})
    rows = []
    for broker, res in results.items():
        if not broker.startswith(WORKERS):
            continue
        for n, w in res.get("rows", {}).items():
            if w.get("section") in (BACKLOG_SECTION, REDELIVERY_SECTION, MEMORY_SECTION):
                continue
            a, b = one.get(n, {}), rmq.get(n, {})
            rw, ra, rb = w.get("msg_per_s"), a.get("msg_per_s"), b.get("msg_per_s")
            rows.append([
                n, broker.removeprefix(WORKERS), _fmt(ra), _fmt(rw), _fmt(rb),
                _fmt(rw / rb if rw is not None and rb else None, ".2f"),
                _fmt(rw / ra if rw is not None and ra else None, ".2f"),
                _fmt(a.get("broker_cpu_us_per_msg"), ".1f"), _fmt(w.get("broker_cpu_us_per_msg"), ".1f"),
                _fmt(b.get("broker_cpu_us_per_msg"), ".1f"),
                _fmt(w.get("broker_cpu_pct"), ".0f"),
            ])
    return sorted(rows, key=lambda row: row[1])


WORKERS_HEADERS = ["workload", "workers", "leveret msg/s", "workers msg/s", "rabbitmq msg/s", "workers/rmq",
                   "workers/single", "leveret µs CPU/msg", "workers µs CPU/msg", "rabbitmq µs CPU/msg",
                   "workers CPU %"]


def baseline_rows(results: dict) -> list[list[str]]:
    """Each workload's figures for leveret and for the baseline tree, with the ratios
    (CPU per message after/before: below 1 is cheaper now)."""
    now = results.get("leveret", {}).get("rows", {})
    before = results.get(BASELINE, {}).get("rows", {})
    rows = []
    for n, b in before.items():
        a = now.get(n, {})
        ra, rb = a.get("msg_per_s"), b.get("msg_per_s")
        ca, cb = a.get("broker_cpu_us_per_msg"), b.get("broker_cpu_us_per_msg")
        rate = ra / rb if ra is not None and rb else None
        cpu = ca / cb if ca is not None and cb else None
        rows.append([n, _fmt(rb), _fmt(ra), _fmt(rate, ".2f"),
                     _fmt(cb, ".1f"), _fmt(ca, ".1f"), _fmt(cpu, ".3f")])
    return rows


BASELINE_HEADERS = ["workload", "before msg/s", "after msg/s", "after/before", "before µs CPU/msg",
                    "after µs CPU/msg", "CPU after/before"]


def _pair(results: dict, section: str) -> tuple[dict, dict, list[str]]:
    """leveret's and RabbitMQ's rows, and the names of the rows of ``section``."""
    lev = results.get("leveret", {}).get("rows", {})
    rmq = results.get("rabbitmq", {}).get("rows", {})
    names = [n for n in dict.fromkeys([*lev, *rmq]) if (lev.get(n) or rmq.get(n)).get("section") == section]
    return lev, rmq, names


def l1_rows(results: dict) -> list[list[str]]:
    """The L1 workloads per broker: published and consumed msg/s over the same window,
    broker µs CPU per consumed message, and the CPU % of the broker, the consumer
    process and each publisher process (which one saturates)."""
    out = []
    for broker, res in results.items():
        for n, r in res.get("rows", {}).items():
            if r.get("section") != L1_SECTION or not n.endswith(" consume"):
                continue
            pub = res["rows"].get(n.removesuffix(" consume") + " publish", {})
            out.append([n.removesuffix(" consume"), broker, _fmt(r.get("published_msg_per_s")),
                        _fmt(r.get("consumed_msg_per_s")), _fmt(pub.get("broker_cpu_us_per_msg"), ".2f"),
                        _fmt(r.get("broker_cpu_us_per_msg"), ".2f"), _fmt(r.get("broker_cpu_pct"), ".0f"),
                        _fmt(r.get("consumer_cpu_pct"), ".0f"),
                        " + ".join(f"{p:.0f}" for p in r.get("publisher_cpu_pct", [])) or "-",
                        _fmt(r.get("backlog_at_end"), ",d")])
    return out


L1_HEADERS = ["workload", "broker", "published msg/s", "consumed msg/s", "µs CPU/published",
              "µs CPU/consumed", "broker CPU %", "consumer CPU %", "publisher(s) CPU %", "left in queue"]


def latency_rows(results: dict) -> list[list[str]]:
    """Each fixed-rate latency row per broker: target and achieved rate, p50, p99, max."""
    out = []
    for broker, res in results.items():
        for n, r in res.get("rows", {}).items():
            if "target_rate" not in r:
                continue
            out.append([n, broker, _fmt(r.get("achieved_rate")), _fmt(r.get("msg_per_s")),
                        _fmt(r.get("write_gap_max_ms"), ".1f"), _fmt(r.get("p50_ms"), ".3f"),
                        _fmt(r.get("p99_ms"), ".3f"), _fmt(r.get("max_ms"), ".2f"),
                        _fmt(r.get("broker_cpu_us_per_msg"), ".1f")])
    return out


LATENCY_HEADERS = ["workload", "broker", "achieved publish msg/s", "delivered msg/s", "longest write gap ms",
                   "p50 ms", "p99 ms", "max ms", "µs CPU/msg"]


def memory_rows(results: dict) -> list[list[str]]:
    """idle-queues / idle-connections: RSS before and after, bytes per item, leveret beside RabbitMQ."""
    lev, rmq, names = _pair(results, MEMORY_SECTION)
    out = []
    for n in names:
        a, b = lev.get(n, {}), rmq.get(n, {})
        count = (a or b).get("messages", 0)
        for label, key, spec in (("RSS MB before", "rss_before_mb", ",.0f"),
                                 ("RSS MB after", "rss_after_mb", ",.0f"),
                                 ("bytes each", "rss_bytes_per_item", ",.0f"),
                                 ("created per s", "msg_per_s", ",.0f")):
            va, vb = a.get(key), b.get(key)
            ratio = va / vb if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and vb else None
            out.append([f"{n} ({count:,}): {label}", _fmt(va, spec), _fmt(vb, spec), _fmt(ratio, ".2f")])
    return out


MEMORY_HEADERS = ["idle resources", "leveret", "rabbitmq", "ratio lev/rmq"]


def _show(console, title: str, headers: list[str], rows: list[list[str]], left: int = 1) -> None:
    """A table with rich (``console``) or plain text (``console`` None); the first ``left``
    columns are left-aligned."""
    if not rows:
        return
    if console is None:
        print(f"\n{title}:")
        _plain(headers, rows)
        return
    from rich.table import Table

    table = Table(title=title)
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i < left else "right")
    for r in rows:
        table.add_row(*r)
    console.print(table)


def print_extra_tables(results: dict, console) -> None:
    """The tables of the L1, fixed-rate latency and idle-memory workloads."""
    _show(console, "LavinMQ's L1 (lavinmqperf throughput -x1 -y1): transient, no confirms, no-ack consumer",
          L1_HEADERS, l1_rows(results), 2)
    _show(console, "Latency at fixed publish rates (publish → deliver, one process, monotonic clock)",
          LATENCY_HEADERS, latency_rows(results), 2)
    _show(console, "Memory of idle queues and connections (broker RSS after − before, ÷ count)",
          MEMORY_HEADERS, memory_rows(results))


def print_tables(results: dict) -> None:
    baseline = baseline_rows(results)
    if baseline:
        print("leveret (this tree) against --baseline-src, in the same run:")
        _plain(BASELINE_HEADERS, baseline)
        print()
    workers = workers_rows(results)
    if workers:
        print("leveret --workers N (all of its processes' CPU) beside the single process and RabbitMQ:")
        _plain(WORKERS_HEADERS, workers)
        print()
    prio = priority_rows(results)
    if prio:
        print("Priority queue (x-max-priority 10, random priorities 0-9) against classic queue:")
        _plain(PRIORITY_HEADERS, prio)
        print()
    rows = table_rows(results)
    sat = saturation_rows(results)
    sat_headers = ["broker", "workload", "broker CPU %", "loadgen CPU %"]
    blog = backlog_rows(results)
    blog_headers = ["backlog / recovery", "leveret", "rabbitmq", "ratio lev/rmq"]
    redel = redelivery_rows(results)
    redel_headers = ["delayed redeliveries", "leveret", "rabbitmq", "ratio lev/rmq"]
    redel_title = "Delayed redeliveries: reject once, redelivered after the delay, then acked"
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        if rows:
            _plain(HEADERS, rows)
        if blog:
            print("\nBacklog and recovery (persistent messages, durable queue, no consumer):")
            _plain(blog_headers, blog)
        if redel:
            print(f"\n{redel_title}:")
            _plain(redel_headers, redel)
        print_extra_tables(results, None)
        print("\nSaturation (100% = one core busy):")
        _plain(sat_headers, sat)
    else:
        console = Console() if sys.stdout.isatty() else Console(width=TABLE_WIDTH)
        if rows:
            t = Table(title="leveret vs RabbitMQ (ratio > 1: leveret faster)")
            for i, h in enumerate(HEADERS):
                t.add_column(h, justify="left" if i == 0 else "right")
            for r in rows:
                t.add_row(*r)
            console.print(t)
        if blog:
            b = Table(title="Backlog and recovery: persistent messages in a durable queue, no consumer")
            for i, h in enumerate(blog_headers):
                b.add_column(h, justify="left" if i == 0 else "right")
            for r in blog:
                b.add_row(*r)
            console.print(b)
        if redel:
            d = Table(title=redel_title)
            for i, h in enumerate(redel_headers):
                d.add_column(h, justify="left" if i == 0 else "right")
            for r in redel:
                d.add_row(*r)
            console.print(d)
        print_extra_tables(results, console)
        s = Table(title="Saturation check (100% = one core busy)")
        for i, h in enumerate(sat_headers):
            s.add_column(h, justify="left" if i < 2 else "right")
        for r in sat:
            s.add_row(*r)
        console.print(s)
    for broker, res in results.items():
        for wl, err in res.get("errors", {}).items():
            print(f"{broker} {wl}: ERROR {err}")


def _plain(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def raise_fd_limit() -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit (the brokers it
    starts inherit it: idle-connections opens 10,000 sockets on each side); returns
    the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log(f"NOTE: could not raise the open-file limit from {soft}: {e}")
    return soft


def _sigterm(signum, frame) -> None:
    raise KeyboardInterrupt  # unwinds through run_broker's finally: brokers get stopped


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    settings = Settings(messages=args.messages, seconds=args.seconds, body_size=args.body_size,
                        prefetch=args.prefetch, ack_every=args.ack_every, batch=args.batch,
                        latency_window=args.latency_window,
                        latency_rate=args.latency_rate, confirm_window=args.confirm_window,
                        backlog_messages=args.backlog_messages, backlog_body_size=args.backlog_body_size,
                        nack_messages=args.nack_messages, delayed_messages=args.delayed_messages,
                        redelivery_delay=args.redelivery_delay, l1_publishers=args.l1_publishers,
                        latency_rates=args.latency_rates or (), idle_queues=args.idle_queues,
                        idle_connections=args.idle_connections)
    raise_fd_limit()
    workloads = resolve_workloads(args.workloads)
    # recovery right after backlog reuses its queue instead of filling a second one
    if "backlog" in workloads and "recovery" in workloads:
        workloads.remove("recovery")
        workloads.insert(workloads.index("backlog") + 1, "recovery")
        settings.keep_backlog = True
    brokers = list(BROKERS) if args.only == "both" else [args.only]
    if args.workers and "leveret" in brokers:
        at = brokers.index("leveret") + 1
        brokers[at:at] = [WORKERS + n.strip() for n in args.workers.split(",") if n.strip()]
    if args.baseline_src and "leveret" in brokers:
        brokers.insert(brokers.index("leveret"), BASELINE)
    if "rabbitmq" in brokers and not rabbitmq_installed():
        log("NOTE: rabbitmq-server is not installed, so only leveret is benchmarked.\n"
            "      Install it with: apt-get install -y rabbitmq-server")
        brokers.remove("rabbitmq")
    if not brokers:
        return 1
    log(f"workloads: {', '.join(workloads)}; bounds: {settings.messages} messages or "
        f"{settings.seconds:g} s each; load generator on {loop_name()}")
    results: dict = {}
    for b in brokers:
        results[b] = run_broker(b, workloads, settings, args)
    print_tables(results)
    doc = {
        "meta": {
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "loadgen_loop": loop_name(), "settings": vars(settings), "workloads": workloads,
            "pythonpath": os.environ.get("PYTHONPATH", ""),
        },
        "results": results,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    log(f"results written to {out}")
    failed = any(r.get("errors") for r in results.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
