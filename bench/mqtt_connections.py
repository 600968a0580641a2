"""Idle MQTT connections: broker memory per connection, leveret beside mosquitto and RabbitMQ.

Usage::

    python bench/mqtt_connections.py                        # 10,000 connections to each broker
    python bench/mqtt_connections.py --connections 1000 --hold 20 --keep-alive 10   # quick

For each broker in turn (a private instance, see brokers.py): wait ``--quiet`` (3) seconds
and read its RSS (the process tree's VmRSS); open ``--connections`` (10,000) MQTT
connections from this process (anonymous, clean session, keep alive ``--keep-alive`` =
60 s, distinct client ids, at most 100 handshakes at a time, at most ``--open-seconds``
(180) for all), wait ``--quiet`` seconds and read the RSS again; then hold them for
``--hold`` seconds (default: keep alive + 10), each connection sending a PINGREQ 0.9 ×
keep alive after its CONNACK and every 0.9 × keep alive after that, as a client must
(MQTT 3.1.1 §3.1.2.10: a broker closes a connection silent for 1.5 × keep alive), and
read the RSS a last time. Reported: connections opened, still open at the end, PINGREQs
sent and PINGRESPs received, RSS before / after opening / at the end of the hold, bytes
per connection ((after − before) ÷ opened), connections opened per second, and broker CPU
seconds while opening and while holding.

File descriptors: this process raises its soft RLIMIT_NOFILE to the hard limit, and the
brokers inherit it (mosquitto runs with ``max_connections -1``). Bounded in time: each
phase has its limit. The JSON goes to ``bench/results/mqtt-connections.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import secrets
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from brokers import Broker, BrokerError, Leveret, Mosquitto, RabbitMQ, raise_nofile_limit  # noqa: E402
from mqtt_bench import BROKERS, Settings, available  # noqa: E402
from mqtt_client import Client, connect, install_uvloop  # noqa: E402
from report import log, print_markdown_table, sigterm  # noqa: E402


async def _open(broker: Broker, n: int, keep_alive: int, version: int, limit_s: float, parallel: int = 100):
    """Open up to ``n`` connections within ``limit_s`` seconds; (clients, connect times, errors)."""
    tag = secrets.token_hex(3)
    gate = asyncio.Semaphore(parallel)
    clients: list[Client] = []
    times: list[float] = []
    errors: dict[str, int] = {}

    async def one(i: int) -> None:
        async with gate:
            try:
                c = await connect(
                    broker.host, broker.mqtt_port, f"idle-{tag}-{i}", version, keep_alive=keep_alive
                )
            except Exception as exc:  # counted and reported
                key = f"{type(exc).__name__}: {exc}"[:120]
                errors[key] = errors.get(key, 0) + 1
                return
            clients.append(c)
            times.append(time.monotonic())

    tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
    _, pending = await asyncio.wait(tasks, timeout=limit_s)
    for t in pending:
        t.cancel()
    if pending:
        errors["not connected within the time limit"] = len(pending)
        await asyncio.gather(*pending, return_exceptions=True)
    return clients, times, errors


async def _hold(clients: list[Client], times: list[float], keep_alive: int, seconds: float) -> int:
    """Keep the connections for ``seconds``, each sending PINGREQ every 0.9 × keep alive
    from its CONNACK; returns the PINGREQs sent."""
    period = 0.9 * keep_alive
    due = [t + period for t in times]
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = time.monotonic()
        for i, c in enumerate(clients):
            if due[i] <= now and not c.closed:
                c.ping()
                sent += 1
                due[i] += period
        await asyncio.sleep(min(0.5, max(0.0, end - time.monotonic())))
    await asyncio.sleep(1.0)  # the last PINGRESPs
    return sent


async def measure(broker: Broker, args: argparse.Namespace) -> dict:
    version = 5 if args.protocol == 5 else 4
    await asyncio.sleep(args.quiet)
    rss0 = broker.rss_bytes()
    cpu0 = broker.cpu_seconds()
    t0 = time.monotonic()
    clients, times, errors = await _open(
        broker, args.connections, args.keep_alive, version, args.open_seconds
    )
    open_s = (max(times) if times else time.monotonic()) - t0
    cpu_open = broker.cpu_seconds() - cpu0
    log(
        f"[{broker.name}] {len(clients)} connected in {open_s:.1f} s"
        + (f"; errors {errors}" if errors else "")
    )
    await asyncio.sleep(args.quiet)
    rss1 = broker.rss_bytes()
    cpu1 = broker.cpu_seconds()
    hold = args.hold if args.hold is not None else args.keep_alive + 10
    log(f"[{broker.name}] holding for {hold:g} s (RSS {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB)")
    pings = await _hold(clients, times, args.keep_alive, hold)
    rss2 = broker.rss_bytes()
    cpu_hold = broker.cpu_seconds() - cpu1
    still_open = sum(not c.closed for c in clients)
    reasons: dict[str, int] = {}
    for c in clients:
        if c.closed:
            reasons[c.close_reason or "?"] = reasons.get(c.close_reason or "?", 0) + 1
    pongs = sum(c.pingresps for c in clients)
    for c in clients:
        if c.transport is not None:
            c.transport.abort()
    opened = len(clients)
    return {
        "requested": args.connections,
        "opened": opened,
        "still_open": still_open,
        "closed_reasons": reasons,
        "errors": errors,
        "pingreqs": pings,
        "pingresps": pongs,
        "keep_alive_s": args.keep_alive,
        "hold_s": hold,
        "open_s": round(open_s, 2),
        "opened_per_s": round(opened / open_s, 1) if open_s > 0 else None,
        "rss_before_mb": round(rss0 / 2**20, 1),
        "rss_open_mb": round(rss1 / 2**20, 1),
        "rss_held_mb": round(rss2 / 2**20, 1),
        "bytes_per_connection": round((rss1 - rss0) / opened) if opened else None,
        "bytes_per_connection_held": round((rss2 - rss0) / opened) if opened else None,
        "broker_cpu_open_s": round(cpu_open, 2),
        "broker_cpu_hold_s": round(cpu_hold, 2),
    }


def make_broker(name: str, args: argparse.Namespace) -> Broker:
    if name == "leveret":
        return Leveret(src=args.leveret_src, mqtt=True)
    if name == "mosquitto":
        return Mosquitto()
    return RabbitMQ(mqtt=True)


def run_broker(name: str, args: argparse.Namespace) -> dict:
    broker = make_broker(name, args)
    log(f"[{name}] starting ...")
    try:
        broker.start()
    except BrokerError as exc:
        log(f"[{name}] failed to start: {exc}")
        return {"error": str(exc)}
    try:
        return asyncio.run(measure(broker, args))
    except Exception as exc:  # reported; the next broker still runs
        log(f"[{name}] FAILED: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        log(f"[{name}] stopping")
        broker.stop()


def print_table(results: dict) -> None:
    head = [
        "broker",
        "opened",
        "still open",
        "PINGREQ/PINGRESP",
        "RSS before MiB",
        "RSS open MiB",
        "RSS held MiB",
        "bytes/conn",
        "bytes/conn held",
        "opened/s",
        "CPU s open",
        "CPU s hold",
    ]
    rows = []
    for name, r in results.items():
        if "error" in r:
            rows.append([name, "error: " + r["error"][:60]] + ["-"] * (len(head) - 2))
            continue
        rows.append(
            [
                name,
                f"{r['opened']:,}/{r['requested']:,}",
                f"{r['still_open']:,}",
                f"{r['pingreqs']:,}/{r['pingresps']:,}",
                f"{r['rss_before_mb']:,.1f}",
                f"{r['rss_open_mb']:,.1f}",
                f"{r['rss_held_mb']:,.1f}",
                f"{r['bytes_per_connection'] or 0:,}",
                f"{r['bytes_per_connection_held'] or 0:,}",
                f"{r['opened_per_s'] or 0:,.0f}",
                f"{r['broker_cpu_open_s']:.2f}",
                f"{r['broker_cpu_hold_s']:.2f}",
            ]
        )
    print_markdown_table(head, rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated: " + ", ".join(BROKERS))
    p.add_argument("--connections", type=int, default=10_000)
    p.add_argument("--keep-alive", type=int, default=60, help="seconds")
    p.add_argument("--hold", type=float, default=None, help="seconds to hold them (default keep alive + 10)")
    p.add_argument("--open-seconds", type=float, default=180.0, help="time limit for opening them")
    p.add_argument("--quiet", type=float, default=3.0, help="seconds of quiet before each RSS reading")
    p.add_argument("--protocol", type=int, choices=(3, 4, 5), default=4, help="4 (or 3) = 3.1.1, 5 = 5.0")
    p.add_argument("--leveret-src", default=None, help="run leveret from another tree's src/")
    p.add_argument("--output", default=str(HERE / "results" / "mqtt-connections.json"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, sigterm)
    nofile = raise_nofile_limit()
    if nofile < args.connections + 100:
        log(f"NOTE: RLIMIT_NOFILE is {nofile}: fewer than {args.connections} connections may open")
    install_uvloop()
    s = Settings(protocol=5 if args.protocol == 5 else 4)
    results: dict = {}
    skipped: dict = {}
    try:
        for name in [b.strip() for b in args.brokers.split(",") if b.strip()]:
            why = available(name, s, args)
            if why:
                log(f"NOTE: {name}: {why}")
                skipped[name] = why
                continue
            results[name] = run_broker(name, args)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    print(
        f"\n{args.connections:,} idle MQTT {'5.0' if s.protocol == 5 else '3.1.1'} connections, keep alive "
        f"{args.keep_alive} s; skipped: " + ("; ".join(f"{b} ({w})" for b, w in skipped.items()) or "none")
    )
    print_table(results)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "meta": {
                    "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                    "host": platform.node(),
                    "cpus": os.cpu_count(),
                    "nofile": nofile,
                    "args": vars(args),
                    "skipped": skipped,
                    "loadavg": os.getloadavg(),
                },
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    log(f"results written to {out}")
    bad = any("error" in r or r["still_open"] < r["requested"] for r in results.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
