"""Exchange federation throughput: leveret -> leveret beside RabbitMQ 3.10 -> RabbitMQ 3.10,
same client, same machine, same run (issue 31).

Usage::

    PYTHONPATH=$PWD/src python bench/federation_bench.py                  # both pairs, 100b and 4kb
    PYTHONPATH=$PWD/src python bench/federation_bench.py --messages 5000  # a quicker run
    ... --pairs leveret:rabbitmq,rabbitmq:leveret   # mixed pairs (upstream:downstream)
    ... --leveret-src /work/main/src                # leveret from another tree (before/after)

A *pair* is two private brokers started here: an upstream U and a downstream D (``--pairs``,
``UP:DOWN`` with ``leveret`` or ``rabbitmq`` on each side; ``leveret`` alone means
``leveret:leveret``). D federates the direct exchange ``bench.fed`` from U: an upstream
parameter ``bench-up`` (``uri`` = U's AMQP port as guest, ``ack-mode: on-confirm`` or ``--ack-mode``,
``prefetch-count: --prefetch``) and a policy ``bench-fed`` (pattern ``^bench\\.fed$``,
exchanges, ``federation-upstream-set: all``), set through leveret's management API or
``rabbitmqctl`` of the private RabbitMQ node (``rabbitmq_federation`` enabled, no
management plugin). The exchange is declared on both sides (durable, direct) and D has
the queue ``bench.fed.q`` bound to it with the key ``k``; the link's own upstream queue
(``federation: bench.fed -> ...``) is made by D's link. The link is up once a probe
message published to U arrives at D's queue (``--link-timeout`` seconds at most).

Cases: ``100b`` and ``4kb`` (message bodies of 100 and 4096 bytes, transient unless
``--persistent``). For each, one load generator connection publishes ``--messages``
(20,000) to U's ``bench.fed`` with publisher confirms (at most ``--confirm-window``
(1000) unconfirmed, and at most ``--window`` (10,000) published but not yet delivered at
D, so no broker builds a backlog) and one consumes ``bench.fed.q`` at D (prefetch 1000,
``basic.ack`` with ``multiple=True`` every 100): the rate is end to end, messages
delivered at D ÷ time from the first publish to the last delivery. Each case stops after
``--seconds`` (60) at most; a case that timed out says so and gives the rate of what
arrived.

CPU, from ``/proc`` (utime + stime of the process tree: leveret's Python process,
RabbitMQ's ``beam.smp``) over the same window: U's and D's µs per delivered message, and
each process's share of a core (the load generator is this process; the machine's figure
is every core's). ``saturated`` names the process at ≥ 85% of a core (the busiest first),
else "machine (all cores)" when every core was ≥ 85% busy, else "neither (windows)".
Then leveret ÷ RabbitMQ per case: the rate, and U's and D's CPU per message (the
issue's target: ≥ 2x the rate, < 1x the CPU per message on each side). The JSON results
go to ``--output``. Every broker started is stopped on any exit (Ctrl-C, SIGTERM).

Options for digging: ``--link shovel`` (D runs a dynamic shovel from a queue on U bound to
``bench.fed`` to D's ``bench.fed``: the same job without federation), ``--ack-mode``,
``--prefetch``, ``--persistent``, ``--py-spy DIR`` (raw stacks of each leveret broker per
case), ``--rabbitmq-no-busy-wait`` (RabbitMQ's schedulers do not spin when idle).
Details: bench/README.md, section "Federation".
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402
from brokers import (  # noqa: E402
    Broker,
    BrokerError,
    Leveret,
    RabbitMQ,
    machine_cpu,
    proc_cpu_seconds,
    rabbitmq_installed,
)
from loadgen import Channel, Connection, wait_any_progress  # noqa: E402
from report import fmt, log, ratio  # noqa: E402

KINDS = ("leveret", "rabbitmq")
CASES = {"100b": 100, "4kb": 4096}
EXCHANGE = "bench.fed"
QUEUE = "bench.fed.q"
KEY = "k"
UPSTREAM = "bench-up"
POLICY = "bench-fed"
SHOVEL = "bench-shovel"
SHOVEL_QUEUE = "bench.fed.shovel"  # --link shovel: the source queue on U, bound to bench.fed with k


@dataclass
class Settings:
    messages: int = 20_000  # per case
    seconds: float = 60.0  # per case at most, publishing and delivery
    prefetch: int = 1000  # the upstream's prefetch-count (the link's)
    confirm_window: int = 1000  # publishes not yet confirmed by U, at most
    window: int = 10_000  # published but not yet delivered at D, at most
    batch: int = 100  # publishes per write
    ack_every: int = 100  # D's consumer acks with multiple=True every this many
    persistent: bool = False
    link_timeout: float = 60.0  # seconds for the link to carry its first message
    ack_mode: str = "on-confirm"  # the link's ack-mode (on-confirm, on-publish, no-ack)
    link: str = "federation"  # or "shovel": a dynamic shovel doing the same job (for comparison)
    py_spy: str = ""  # a folder: py-spy records each leveret broker during each case (raw stacks)


# ------------------------------------------------------------------ the brokers
class FederatedRabbitMQ(RabbitMQ):
    """A private RabbitMQ node with ``rabbitmq_federation`` (and ``rabbitmq_shovel``, for
    ``--link shovel``) and :meth:`ctl`; ``busy_wait=False``: its schedulers do not spin
    when they run out of work (``+sbwt none +sbwtdcpu none +sbwtdio none``), so its CPU
    figures count work, not waiting."""

    def __init__(self, busy_wait: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.busy_wait = busy_wait

    def _env(self) -> dict:
        env = super()._env()
        Path(self.workdir, "enabled_plugins").write_text("[rabbitmq_federation,rabbitmq_shovel].\n")
        if not self.busy_wait:
            env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] += " +sbwt none +sbwtdcpu none +sbwtdio none"
        self.env = env
        return env

    def ctl(self, *args: str) -> str:
        """``rabbitmqctl`` against this node (its cookie: the wrapper may run as the
        rabbitmq user, whose home has another); raises :class:`BrokerError` on failure."""
        cookie = Path(self.workdir, ".erlang.cookie").read_text().strip()
        done = subprocess.run(
            ["rabbitmqctl", "-n", self.extra["nodename"], "--erlang-cookie", cookie, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode:
            raise BrokerError(f"rabbitmqctl {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout


class ManagedLeveret(Leveret):
    """leveret with its management API on a free port (``api``: ``http://host:port/api``)."""

    MANAGEMENT = re.compile(r"leveret management: (http://\S+?)/api/")

    def __init__(self, src: str | None = None) -> None:
        super().__init__(src=src, extra_args=["--http-port", "0"])
        self.api = ""

    def launch(self, timeout: float = 900.0) -> float:
        t0 = super().launch(timeout)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = self.MANAGEMENT.search(Path(self.log_path).read_text(errors="replace"))
            if m:
                self.api = m.group(1) + "/api"
                return t0
            time.sleep(0.02)
        raise BrokerError(f"leveret printed no management address\n{self.log_tail()}")

    def put(self, path: str, body: dict) -> None:
        """PUT ``body`` (JSON) to the management API as guest; raises :class:`BrokerError`
        on an HTTP error (with the broker's reason)."""
        request = urllib.request.Request(
            self.api + path,
            method="PUT",
            data=json.dumps(body).encode(),
            headers={
                "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except urllib.error.HTTPError as error:
            raise BrokerError(f"PUT {path}: {error.code} {error.read().decode(errors='replace')}") from None


def make_broker(kind: str, args: argparse.Namespace) -> Broker:
    if kind == "rabbitmq":
        return FederatedRabbitMQ(
            schedulers=args.rabbitmq_schedulers, busy_wait=not args.rabbitmq_no_busy_wait
        )
    return ManagedLeveret(src=args.leveret_src)


def shovel(down: Broker, up: Broker, s: Settings) -> None:
    """``--link shovel``: a dynamic shovel on ``down`` from U's ``bench.fed.shovel`` (bound to
    ``bench.fed`` with ``k``) to D's ``bench.fed``, ``on-confirm``, the same prefetch: what a
    federation link does, built from a shovel (leveret's main before federation had it)."""
    value = {
        "src-uri": f"amqp://guest:guest@{up.host}:{up.port}",
        "src-queue": SHOVEL_QUEUE,
        "dest-uri": "amqp://",
        "dest-exchange": EXCHANGE,
        "ack-mode": s.ack_mode,
        "src-prefetch-count": s.prefetch,
    }
    if isinstance(down, FederatedRabbitMQ):
        down.ctl("set_parameter", "shovel", SHOVEL, json.dumps(value))
    elif isinstance(down, ManagedLeveret):
        down.put(f"/parameters/shovel/%2F/{SHOVEL}", {"value": value})
    else:
        raise BrokerError(f"cannot configure a shovel on {down.name}")


def federate(down: Broker, up: Broker, s: Settings) -> None:
    """Make ``down`` federate ``bench.fed`` from ``up``: the upstream parameter and the policy
    (``--link shovel``: a shovel instead)."""
    if s.link == "shovel":
        shovel(down, up, s)
        return
    upstream = {
        "uri": f"amqp://guest:guest@{up.host}:{up.port}",
        "ack-mode": s.ack_mode,
        "prefetch-count": s.prefetch,
    }
    policy = {
        "pattern": r"^bench\.fed$",
        "apply-to": "exchanges",
        "priority": 0,
        "definition": {"federation-upstream-set": "all"},
    }
    if isinstance(down, FederatedRabbitMQ):
        down.ctl("set_parameter", "federation-upstream", UPSTREAM, json.dumps(upstream))
        down.ctl(
            "set_policy",
            "--apply-to",
            "exchanges",
            POLICY,
            policy["pattern"],
            json.dumps(policy["definition"]),
        )
    elif isinstance(down, ManagedLeveret):
        down.put(f"/parameters/federation-upstream/%2F/{UPSTREAM}", {"value": upstream})
        down.put(f"/policies/%2F/{POLICY}", policy)
    else:
        raise BrokerError(f"cannot configure federation on {down.name}")


# ------------------------------------------------------------------ measuring
async def _link_up(pconn: Connection, pch: Channel, cconn: Connection, cch: Channel, timeout: float) -> float:
    """Publish a probe to U every 0.25 s until one reaches D; then wait until nothing more
    arrives for 0.5 s. Returns the seconds until the first probe arrived."""
    probe = pch.message(EXCHANGE, KEY, b"probe")
    t0 = time.monotonic()
    deadline = t0 + timeout
    seen = cch.delivered
    while cch.delivered == seen:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the federation link carried nothing in {timeout:g} s")
        pconn.write(probe)
        await pconn.drain()
        await wait_any_progress([cconn], 0.25)
    first = time.monotonic() - t0
    quiet = cch.delivered
    while True:
        await wait_any_progress([cconn], 0.5)
        if cch.delivered == quiet:
            break
        quiet = cch.delivered
    cch.ack_pending()
    return first


def start_py_spy(up: Broker, down: Broker, body_size: int, s: Settings) -> list[subprocess.Popen]:
    """``--py-spy DIR``: ``py-spy record`` (raw collapsed stacks, 200 Hz, not pausing the
    broker) of each leveret side, into ``DIR/<side>-<body size>.txt``; the CPU figures of a
    profiled case include py-spy's reading of the broker's memory."""
    if not s.py_spy:
        return []
    os.makedirs(s.py_spy, exist_ok=True)
    spies = []
    for side, broker in (("up", up), ("down", down)):
        if isinstance(broker, ManagedLeveret):
            out = os.path.join(s.py_spy, f"{side}-{body_size}.txt")
            cmd = [
                "py-spy",
                "record",
                "--pid",
                str(broker.pid),
                "--format",
                "raw",
                "--rate",
                "200",
                "--nonblocking",
                "--output",
                out,
            ]
            spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # attached before the clock starts
    return spies


def stop_py_spy(spies: list[subprocess.Popen]) -> None:
    """SIGINT each recorder (it then writes its file) and wait for it."""
    for spy in spies:
        spy.send_signal(signal.SIGINT)
    for spy in spies:
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            spy.kill()


@dataclass
class Sample:
    t: float
    up: float
    down: float
    gen: float
    machine: float


def sample(up: Broker, down: Broker) -> Sample:
    return Sample(
        time.monotonic(),
        up.cpu_seconds(),
        down.cpu_seconds(),
        proc_cpu_seconds(os.getpid()),
        machine_cpu()[0],
    )


def verdict(shares: dict[str, float], machine_pct: float, cores: int) -> str:
    """The busiest process at ≥ 85% of a core (RabbitMQ's schedulers may use more than
    one: 85% of one counts too), else the machine when every core was ≥ 85% busy, else
    neither (the windows limited the rate)."""
    name, pct = max(shares.items(), key=lambda item: item[1])
    if pct >= 85:
        return name
    if machine_pct >= 85 * cores:
        return "machine (all cores)"
    return "neither (windows)"


async def run_case(up: Broker, down: Broker, body_size: int, s: Settings, state: dict) -> dict:
    """One case on a federated pair: returns its row (figures in the module docstring)."""
    pconn = await Connection.open(up.host, up.port)
    cconn = await Connection.open(down.host, down.port)
    try:
        pch = await pconn.channel()
        cch = await cconn.channel()
        await pch.confirm_select()
        await cch.qos(1000)
        await cch.consume(QUEUE, ack_every=s.ack_every)
        if not state.get("link_up"):
            state["link_up_s"] = round(await _link_up(pconn, pch, cconn, cch, s.link_timeout), 2)
            state["link_up"] = True
        msg = pch.message(EXCHANGE, KEY, b"x" * body_size, persistent=s.persistent)
        spies = start_py_spy(up, down, body_size, s)
        base = cch.delivered
        n = s.messages
        sent = 0
        first = sample(up, down)
        deadline = first.t + s.seconds
        timed_out = False
        while cch.delivered - base < n:
            if time.monotonic() > deadline:
                timed_out = True
                break
            allowed = min(
                s.confirm_window - (sent - pch.confirmed),
                s.window - (sent - (cch.delivered - base)),
                n - sent,
                s.batch,
            )
            if allowed > 0:
                pconn.write(msg * allowed)
                sent += allowed
                await pconn.drain()
            else:
                await wait_any_progress([pconn, cconn], 1.0)
        last = sample(up, down)
        stop_py_spy(spies)
        cch.ack_pending()
        received = cch.delivered - base
    finally:
        for c in (pconn, cconn):
            try:
                await asyncio.wait_for(c.close(), 5)
            except Exception:  # best effort: the figures are taken
                c.abort()
    seconds = max(last.t - first.t, 1e-9)
    up_cpu, down_cpu, gen_cpu = last.up - first.up, last.down - first.down, last.gen - first.gen
    machine = last.machine - first.machine
    row = {
        "body_size": body_size,
        "published": sent,
        "confirmed": pch.confirmed,
        "nacked": pch.nacked,
        "received": received,
        "timed_out": timed_out,
        "seconds": round(seconds, 3),
        "msg_per_s": round(received / seconds, 1),
        "up_cpu_s": round(up_cpu, 3),
        "down_cpu_s": round(down_cpu, 3),
        "up_cpu_us_per_msg": round(up_cpu / received * 1e6, 2) if received else None,
        "down_cpu_us_per_msg": round(down_cpu / received * 1e6, 2) if received else None,
        "up_cpu_pct": round(100 * up_cpu / seconds, 1),
        "down_cpu_pct": round(100 * down_cpu / seconds, 1),
        "loadgen_cpu_pct": round(100 * gen_cpu / seconds, 1),
        "machine_cpu_pct": round(100 * machine / seconds, 1),
    }
    row["saturated"] = verdict(
        {
            "upstream": row["up_cpu_pct"],
            "downstream": row["down_cpu_pct"],
            "load generator": row["loadgen_cpu_pct"],
        },
        row["machine_cpu_pct"],
        os.cpu_count() or 1,
    )
    return row


async def declare(up: Broker, down: Broker, s: Settings) -> None:
    """``bench.fed`` on both sides, D's queue bound to it with ``k`` (``--link shovel``: and
    the shovel's source queue on U, bound the same way)."""
    for broker in (up, down):
        conn = await Connection.open(broker.host, broker.port)
        try:
            ch = await conn.channel()
            await ch.exchange_declare(EXCHANGE, "direct", durable=True)
            if broker is down:
                await ch.queue_declare(QUEUE, durable=True)
                await ch.queue_bind(QUEUE, EXCHANGE, KEY)
            elif s.link == "shovel":
                await ch.queue_declare(SHOVEL_QUEUE, durable=True)
                await ch.queue_bind(SHOVEL_QUEUE, EXCHANGE, KEY)
        finally:
            await conn.close()


def run_pair(pair: str, cases: list[str], s: Settings, args: argparse.Namespace) -> dict:
    """Start U and D, federate, run the cases, stop both (also on an error or a signal)."""
    up_kind, down_kind = pair.split(":")
    out: dict = {"rows": {}, "errors": {}, "info": {}}
    started: list[Broker] = []
    try:
        for side, kind in (("upstream", up_kind), ("downstream", down_kind)):
            broker = make_broker(kind, args)
            log(f"[{pair}] starting the {side} ({kind}) ...")
            try:
                broker.start()
            except BrokerError as exc:
                out["errors"]["start"] = f"{side}: {exc}"
                log(f"[{pair}] the {side} failed to start: {exc}")
                return out
            started.append(broker)
        up, down = started
        out["info"] = {"up_pid": up.pid, "down_pid": down.pid}
        try:
            asyncio.run(declare(up, down, s))
            federate(down, up, s)
        except Exception as exc:
            out["errors"]["federate"] = f"{type(exc).__name__}: {exc}"
            log(f"[{pair}] could not federate: {exc}")
            return out
        state: dict = {}
        for case in cases:
            if not (up.alive() and down.alive()):
                out["errors"][case] = "a broker is not running"
                continue
            try:
                row = asyncio.run(run_case(up, down, CASES[case], s, state))
            except Exception as exc:  # the next case still runs
                out["errors"][case] = f"{type(exc).__name__}: {exc}"
                log(f"[{pair}] {case}: FAILED: {type(exc).__name__}: {exc}")
                if not state.get("link_up"):
                    break
                continue
            out["rows"][case] = row
            log(
                f"[{pair}] {case}: {row['received']:,} in {row['seconds']:.2f} s = "
                f"{row['msg_per_s']:,.0f} msg/s; "
                f"CPU µs/msg up {row['up_cpu_us_per_msg']} down {row['down_cpu_us_per_msg']}; "
                f"up {row['up_cpu_pct']}% down {row['down_cpu_pct']}% loadgen {row['loadgen_cpu_pct']}% "
                f"-> {row['saturated']}" + (" (TIMED OUT)" if row["timed_out"] else "")
            )
            time.sleep(1.0)
        out["info"]["link_up_s"] = state.get("link_up_s")
    finally:
        for broker in reversed(started):
            log(f"[{pair}] stopping {broker.name}")
            broker.stop()
    return out


# ------------------------------------------------------------------ output
def print_tables(results: dict, cases: list[str], s: Settings) -> None:
    head = [
        "pair (up:down)",
        "case",
        "msg/s",
        "up µs/msg",
        "down µs/msg",
        "up %",
        "down %",
        "loadgen %",
        "machine %",
        "saturated",
    ]
    rows = []
    for pair, res in results.items():
        for case in cases:
            r = res["rows"].get(case)
            if r is None:
                continue
            rows.append(
                [
                    pair,
                    case,
                    fmt(r["msg_per_s"]) + ("*" if r["timed_out"] else ""),
                    fmt(r["up_cpu_us_per_msg"], ".1f"),
                    fmt(r["down_cpu_us_per_msg"], ".1f"),
                    fmt(r["up_cpu_pct"]),
                    fmt(r["down_cpu_pct"]),
                    fmt(r["loadgen_cpu_pct"]),
                    fmt(r["machine_cpu_pct"]),
                    r["saturated"],
                ]
            )
    what = "Exchange federation" if s.link == "federation" else "A shovel doing the same job"
    report.print_markdown_table(head, rows, f"{what}, ack-mode {s.ack_mode} (* = timed out)")
    lv = results.get("leveret:leveret", {}).get("rows", {})
    rq = results.get("rabbitmq:rabbitmq", {}).get("rows", {})
    ratios = []
    for case in cases:
        a, b = lv.get(case), rq.get(case)
        if not (a and b):
            continue
        rate = ratio(a["msg_per_s"], b["msg_per_s"])
        up = ratio(a["up_cpu_us_per_msg"], b["up_cpu_us_per_msg"])
        down = ratio(a["down_cpu_us_per_msg"], b["down_cpu_us_per_msg"])
        met = rate is not None and up is not None and down is not None and rate >= 2 and up < 1 and down < 1
        ratios.append([case, fmt(rate, ".2f"), fmt(up, ".2f"), fmt(down, ".2f"), "yes" if met else "no"])
    if ratios:
        report.print_markdown_table(
            ["case", "rate x", "up CPU/msg x", "down CPU/msg x", "target met"],
            ratios,
            "leveret:leveret / rabbitmq:rabbitmq (target: rate >= 2x, CPU/msg < 1x on each side)",
        )
    report.print_errors(results)


def parse_pairs(spec: str) -> list[str]:
    pairs = []
    for name in report.split_names(spec):
        pair = name if ":" in name else f"{name}:{name}"
        if any(k not in KINDS for k in pair.split(":")) or pair.count(":") != 1:
            raise SystemExit(f"unknown pair {name!r}: UP:DOWN with UP, DOWN in {', '.join(KINDS)}")
        pairs.append(pair)
    return pairs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", default="leveret,rabbitmq", help="UP:DOWN pairs (leveret = leveret:leveret)")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    for name, default in asdict(d).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(default, bool):
            p.add_argument(flag, action="store_true", help="persistent messages (delivery mode 2)")
        elif name == "py_spy":
            p.add_argument(
                flag, default="", metavar="DIR", help="record leveret's stacks with py-spy into DIR"
            )
        elif name == "ack_mode":
            p.add_argument(flag, choices=("on-confirm", "on-publish", "no-ack"), default=default)
        elif name == "link":
            p.add_argument(
                flag,
                choices=("federation", "shovel"),
                default=default,
                help="what carries the messages from U to D (shovel: for comparison)",
            )
        else:
            p.add_argument(flag, type=type(default), default=default)
    p.add_argument("--leveret-src", default=None, help="run leveret from another tree's src/")
    p.add_argument("--rabbitmq-schedulers", type=int, default=None, help="Erlang scheduler threads per node")
    p.add_argument(
        "--rabbitmq-no-busy-wait",
        action="store_true",
        help="RabbitMQ's schedulers do not spin when idle (+sbwt none ...): CPU counts work only",
    )
    p.add_argument("--output", default=str(HERE / "results" / "federation-latest.json"), help="JSON results")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, report.sigterm)
    s = Settings(**{name: getattr(args, name) for name in asdict(Settings())})
    cases = report.split_names(args.cases)
    for case in cases:
        if case not in CASES:
            raise SystemExit(f"unknown case {case!r}: {', '.join(CASES)}")
    pairs, skipped = [], {}
    for pair in parse_pairs(args.pairs):
        if "rabbitmq" in pair and not rabbitmq_installed():
            skipped[pair] = "rabbitmq-server is not installed"
            log(f"NOTE: {pair}: skipped, rabbitmq-server is not installed")
        else:
            pairs.append(pair)
    log(
        f"pairs {', '.join(pairs)}; cases {', '.join(cases)}; {s.messages:,} messages or {s.seconds:g} s each"
    )
    results = report.run_each(pairs, lambda pair: run_pair(pair, cases, s, args))
    if results is None:
        return 130
    print(
        f"\n{s.messages:,} messages a case, {'persistent' if s.persistent else 'transient'}, link prefetch "
        f"{s.prefetch}; skipped: " + ("; ".join(f"{p} ({w})" for p, w in skipped.items()) or "none")
    )
    print_tables(results, cases, s)
    meta = report.run_meta(
        settings=asdict(s),
        cases=cases,
        pairs=pairs,
        skipped=skipped,
        rabbitmq_busy_wait=not args.rabbitmq_no_busy_wait,
    )
    return report.write_results(args.output, meta, results)


if __name__ == "__main__":
    sys.exit(main())
