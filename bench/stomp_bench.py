"""STOMP throughput: leveret beside ActiveMQ and RabbitMQ's STOMP plugin, same client, same run.

Usage::

    python bench/stomp_bench.py                                  # every installed broker, all cases
    python bench/stomp_bench.py --messages 50000 --seconds 5     # a quicker run
    python bench/stomp_bench.py --brokers leveret --profile /tmp/prof   # py-spy of leveret per case

Cases (destination ``/queue/bench-<case>``, a 100-byte body, STOMP 1.2, guest/guest):

* ``send-transient``: ``persistent:false`` SENDs, pipelined; the last frame asks for a
  receipt and the time runs until that RECEIPT.
* ``send-persistent``: ``persistent:true`` SENDs, every ``--receipt-every`` (100)th frame
  asks for a receipt, at most ``--window`` (5000) messages unreceipted; the time runs until
  the last RECEIPT (so it covers the disk).
* ``receive``: the queue is pre-filled (untimed) with persistent messages, then a
  subscription with ``ack:client-individual`` and a prefetch of ``--prefetch`` (1000) reads
  them; each MESSAGE gets its own ACK (``id`` = its ``ack`` header), written ``--ack-batch``
  (100) at a time. The time runs until all were received.
* ``receive-transient`` (opt-in): the same with non-persistent messages.

Each case stops at ``--messages`` or ``--seconds``, whichever comes first. After a send
case the queue is drained (untimed), which also checks that every message arrived.

The load generator is this file's raw-socket client, in ``--clients`` worker processes
(one connection each): frames are encoded once and written in batches, MESSAGE frames are
scanned with ``bytes.find`` for their ``ack`` and ``content-length`` headers only. The
table shows msg/s and broker CPU µs per message for each broker, the ratios, and the
broker's and the client's CPU share, which tells which one saturated. Details and results:
bench/README.md, section "STOMP".
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402
from brokers import (  # noqa: E402
    CLK_TCK,
    ActiveMQ,
    Broker,
    Leveret,
    RabbitMQ,
    activemq_installed,
    machine_cpu,
    process_tree,
    rabbitmq_installed,
)
from report import fmt, log, ratio  # noqa: E402

BROKERS = ("leveret", "activemq", "rabbitmq")
CASES = ("send-transient", "send-persistent", "receive", "receive-transient")
DEFAULT_CASES = ("send-transient", "send-persistent", "receive")


# ------------------------------------------------------------------ the client (worker processes)
class ClientError(RuntimeError):
    pass


@dataclass
class Job:
    """What one worker process does (picklable: it crosses into the worker)."""

    kind: str  # "send" or "receive"
    host: str
    port: int
    destination: str
    count: int  # send: messages this worker sends; receive: messages all workers receive together
    seconds: float  # the deadline, from the common start
    body_size: int = 100
    persistent: bool = False
    receipt_every: int = 100  # persistent sends: a receipt every N frames
    batch: int = 100  # transient sends: frames per write
    window: int = 5000  # persistent sends: unreceipted messages at most (0: no bound)
    prefetch: int = 1000
    ack_batch: int = 100
    ack_mode: str = "client-individual"
    final_timeout: float = 60.0  # seconds to wait for the last receipt after the deadline
    vhost: str = "/"


def _connect(job: Job) -> tuple[socket.socket, bytes, str]:
    """A connected STOMP 1.2 socket, the bytes read past CONNECTED, and the server header."""
    sock = socket.create_connection((job.host, job.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(f"CONNECT\naccept-version:1.2\nhost:{job.vhost}\nlogin:guest\npasscode:guest\n"
                 "heart-beat:0,0\n\n\0".encode())
    data = b""
    while b"\0" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ClientError(f"the broker closed the connection after CONNECT: {data[:300]!r}")
        data += chunk
    frame, _, rest = data.partition(b"\0")
    head = frame.lstrip(b"\r\n").split(b"\n\n", 1)[0].decode(errors="replace")
    command, *lines = head.split("\n")
    headers = dict(line.split(":", 1) for line in lines if ":" in line)
    if command != "CONNECTED":
        raise ClientError(f"CONNECT answered with {command}: {headers.get('message', head[:300])}")
    sock.settimeout(None)
    return sock, rest, headers.get("server", "?")


def scan(data: bytes, acks: list[bytes] | None, receipts: list[bytes]) -> tuple[int, int]:
    """Read the complete frames at the start of ``data``: the ``ack`` header of each MESSAGE
    goes to ``acks`` (when given), each RECEIPT's ``receipt-id`` to ``receipts``; an ERROR
    raises. Returns (bytes consumed, MESSAGE frames). Only the frame head is searched;
    the body is skipped by ``content-length`` (or up to its NUL when there is none)."""
    find = data.find
    size = len(data)
    pos = messages = 0
    while pos < size:
        if data[pos] in (10, 13):  # an end of line between frames (heart-beat)
            pos += 1
            continue
        head_end = find(b"\n\n", pos)
        if head_end < 0:
            break
        length_at = find(b"\ncontent-length:", pos, head_end)
        if length_at >= 0:
            end = head_end + 2 + int(data[length_at + 16:find(b"\n", length_at + 16, head_end + 1)])
            if end >= size:
                break
        else:
            end = find(b"\0", head_end + 2)
            if end < 0:
                break
        command = data[pos:find(b"\n", pos)]
        if command == b"MESSAGE":
            messages += 1
            if acks is not None:
                at = find(b"\nack:", pos, head_end)
                if at < 0:
                    raise ClientError(f"a MESSAGE without an ack header: {data[pos:head_end][:300]!r}")
                acks.append(data[at + 5:find(b"\n", at + 5, head_end + 1)])
        elif command == b"RECEIPT":
            at = find(b"\nreceipt-id:", pos, head_end)
            receipts.append(data[at + 12:find(b"\n", at + 12, head_end + 1)])
        elif command == b"ERROR":
            raise ClientError(f"ERROR frame: {data[pos:end][:500].decode(errors='replace')}")
        pos = end + 1
    return pos, messages


def _send(job: Job, sock: socket.socket, pending: bytes, deadline: float) -> dict:
    """Pipelined SENDs; returns {"messages", "t_end"} once the last receipt is in."""
    body = os.urandom(job.body_size // 2 + 1).hex()[:job.body_size].encode()
    # transient: no persistent header (the default everywhere). RabbitMQ's plugin declares a
    # missing /queue/ queue as the SEND says: persistent:false makes it exclusive and auto-delete
    persistent = "persistent:true\n" if job.persistent else ""
    head = f"SEND\ndestination:{job.destination}\n{persistent}content-length:{len(body)}\n".encode()
    plain = head + b"\n" + body + b"\0"

    def with_receipt(upto: int) -> bytes:
        return head + b"receipt:r%d\n\n" % upto + body + b"\0"

    per_write = job.receipt_every if job.persistent else job.batch
    sent = confirmed = 0
    buf = pending
    receipts: list[bytes] = []

    def take(data: bytes) -> None:
        nonlocal buf, confirmed
        buf += data
        used, _ = scan(buf, None, receipts)
        buf = buf[used:]
        if receipts:
            confirmed = max(confirmed, *(int(r[1:]) for r in receipts))
            receipts.clear()

    poller = select.poll()
    poller.register(sock, select.POLLIN)

    def read(block: bool) -> None:
        # the socket is blocking (no timeout: with one, Python polls before every call)
        if block and not poller.poll(job.final_timeout * 1000):
            raise ClientError(f"no receipt for {job.final_timeout:g} s ({confirmed} of {sent} confirmed)")
        try:
            data = sock.recv(65536, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            raise ClientError("the broker closed the connection")
        take(data)

    while sent < job.count and time.monotonic() < deadline:
        n = min(per_write, job.count - sent)
        while job.persistent and job.window and sent + n - confirmed > job.window:
            read(True)
        last = sent + n
        # persistent: a receipt every per_write frames; transient: only on the very last frame
        receipted = job.persistent or last == job.count
        sock.sendall(plain * (n - 1) + with_receipt(last) if receipted else plain * n)
        sent = last
        read(False)
    if not job.persistent and sent < job.count:  # stopped by the deadline: one more, with a receipt
        sent += 1
        sock.sendall(with_receipt(sent))
    while confirmed < sent:
        read(True)
    t_end = time.monotonic()
    return {"messages": sent, "t_end": t_end}


def _receive(job: Job, sock: socket.socket, pending: bytes, deadline: float, counter) -> dict:
    """Subscribe and ACK every MESSAGE until ``count`` arrived (across all workers when
    ``counter`` is shared) or the deadline; returns {"messages", "t_end", "t_acked"}."""
    prefetch = job.prefetch
    sock.sendall(f"SUBSCRIBE\nid:0\ndestination:{job.destination}\nack:{job.ack_mode}\n"
                 f"activemq.prefetchSize:{prefetch}\nprefetch-count:{prefetch}\n\n\0".encode())
    auto = job.ack_mode == "auto"
    acks: list[bytes] = []
    receipts: list[bytes] = []
    buf = pending
    got = 0
    t_last = time.monotonic()
    sock.settimeout(0.2 if counter is not None else 1.0)
    total = 0
    while True:
        try:
            data = sock.recv(262144)
        except TimeoutError:
            data = None
        now = time.monotonic()
        if data is not None:
            if not data:
                raise ClientError("the broker closed the connection")
            buf += data
            used, n = scan(buf, None if auto else acks, receipts)
            buf = buf[used:]
            if n:
                got += n
                t_last = now
            if len(acks) >= job.ack_batch:
                sock.sendall(b"".join(b"ACK\nid:" + a + b"\n\n\0" for a in acks))
                acks.clear()
            if counter is None:
                total = got
            elif n:
                with counter.get_lock():
                    counter.value += n
                    total = counter.value
        if counter is not None:
            total = counter.value
        if total >= job.count or now >= deadline:
            break
    # the last ACKs, then UNSUBSCRIBE with a receipt: t_acked is when the broker had handled
    # every ACK (what was delivered after the count was reached is not acked: it goes back)
    sock.sendall(b"".join([*(b"ACK\nid:" + a + b"\n\n\0" for a in acks),
                           b"UNSUBSCRIBE\nid:0\nreceipt:acked\n\n\0"]))
    sock.settimeout(job.final_timeout)
    late = 0  # deliveries after the count was reached (other workers' share, or in flight)
    while b"acked" not in receipts:
        data = sock.recv(262144)
        if not data:
            raise ClientError("the broker closed the connection")
        buf += data
        used, n = scan(buf, None, receipts)
        buf = buf[used:]
        late += n
    return {"messages": got, "t_end": t_last, "t_acked": time.monotonic(), "late": late}


def worker(job: Job, index: int, ready, start, t0_shared, results, counter) -> None:
    """One client process: connect, say ready, wait for the start, run, report."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler (fork)
    try:
        sock, pending, server = _connect(job)
        ready.put(("ready", index, server))
        if not start.wait(120):
            raise ClientError("no start signal")
        cpu0 = time.process_time()
        deadline = t0_shared.value + job.seconds
        if job.kind == "send":
            out = _send(job, sock, pending, deadline)
        else:
            out = _receive(job, sock, pending, deadline, counter)
        out["cpu_s"] = time.process_time() - cpu0
        results.put(("done", index, out))
        try:
            sock.settimeout(2)
            sock.sendall(b"DISCONNECT\n\n\0")
            sock.close()
        except OSError:
            pass
    except Exception as exc:  # reported to the parent, which fails the case
        msg = f"{type(exc).__name__}: {exc}"
        try:
            ready.put(("error", index, msg))
        finally:
            results.put(("error", index, msg))


# ------------------------------------------------------------------ measuring the broker
def thread_cpu(broker: Broker) -> dict[tuple[int, int], tuple[str, float]]:
    """CPU seconds of each thread of the broker's process tree: (pid, tid) -> (name, s)."""
    out = {}
    for pid in process_tree(broker.pid):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            name = raw[raw.index("(") + 1:raw.rindex(")")]
            fields = raw[raw.rindex(")") + 2:].split()
            out[(pid, int(tid))] = (name, (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return out


def busiest_thread(before: dict, after: dict) -> tuple[str, float]:
    best = ("-", 0.0)
    for key, (name, cpu) in after.items():
        used = cpu - before.get(key, (name, 0.0))[1]
        if used > best[1]:
            best = (name, used)
    return best


@dataclass
class Phase:
    """The figures of one timed phase."""

    messages: int = 0
    seconds: float = 0.0
    broker_cpu_s: float = 0.0
    window_s: float = 0.0  # from the start to the last worker's report (what broker CPU covers)
    client_cpu_s: list[float] = field(default_factory=list)
    busiest_thread: str = "-"
    busiest_thread_cpu_s: float = 0.0
    machine_cpu_s: float = 0.0  # every process on the machine (broker, clients, anything else)
    iowait_s: float = 0.0
    late: int = 0
    acked_s: float | None = None
    server: str = ""
    profile: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0


PROFILE_RATE = 200  # py-spy samples per second


def profile_summary(path: str, window_s: float, gil: bool) -> dict:
    """Busy share of each thread in a py-spy ``--threads --format raw`` file: samples ÷
    (window × rate), in % of the wall time. py-spy leaves idle threads out (and with
    ``--gil`` keeps only the thread holding the GIL), so the second before the start,
    when the broker is idle, adds nothing. Threads are named by their outermost leveret
    function (the event loop runs ``leveret/__main__.py``)."""
    threads: dict[str, int] = {}
    names: dict[str, str] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0]
        threads[thread] = threads.get(thread, 0) + int(count)
        if thread not in names:
            ours = [f for f in frames[1:] if "leveret/" in f]
            names[thread] = ("event loop" if any("leveret/__main__.py" in f for f in ours)
                             else ours[0].split(" (")[0] if ours else frames[-1].split(" (")[0])
    possible = max(window_s, 1e-9) * PROFILE_RATE
    out = {f"{names[t]} ({t.split(' ')[-1].strip('()')})": round(100 * n / possible, 1)
           for t, n in sorted(threads.items(), key=lambda item: -item[1])}
    summary: dict = {"threads_busy_pct" if not gil else "threads_holding_gil_pct": out}
    if gil:
        summary["gil_held_pct"] = round(100 * sum(threads.values()) / possible, 1)
    return summary


def run_phase(broker: Broker, job: Job, clients: int, profile: str | None = None,
              profile_gil: bool = False) -> Phase:
    """Run ``job`` in ``clients`` worker processes at once and measure the broker.

    Send jobs split ``job.count`` between the workers; receive jobs share one counter.
    ``profile``: record the broker with py-spy into that file (``profile_gil``: only
    the samples of the thread holding the GIL)."""
    ctx = mp.get_context("fork")
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    t0_shared = ctx.Value("d", 0.0)
    counter = ctx.Value("q", 0) if job.kind == "receive" and clients > 1 else None
    jobs = []
    for i in range(clients):
        if job.kind == "send":
            share = job.count // clients + (i < job.count % clients)
            jobs.append(Job(**{**asdict(job), "count": share}))
        else:
            jobs.append(job)
    procs = [ctx.Process(target=worker, args=(j, i, ready, start, t0_shared, results, counter), daemon=True)
             for i, j in enumerate(jobs) if j.count > 0]
    spy = None
    try:
        for p in procs:
            p.start()
        server = ""
        for _ in procs:
            what, index, detail = ready.get(timeout=60)
            if what == "error":
                raise ClientError(f"client {index}: {detail}")
            server = detail
        if profile:
            spy = subprocess.Popen(["py-spy", "record", "--pid", str(broker.pid), "--format", "raw",
                                    "--threads", "--rate", str(PROFILE_RATE), "-o", profile,
                                    *(["--gil"] if profile_gil else [])],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attaches
        threads0 = thread_cpu(broker)
        machine0 = machine_cpu()
        cpu0 = broker.cpu_seconds()
        t0 = time.monotonic()
        t0_shared.value = t0
        start.set()
        outs = []
        limit = t0 + job.seconds + job.final_timeout + 30
        while len(outs) < len(procs):
            what, index, detail = results.get(timeout=max(1.0, limit - time.monotonic()))
            if what == "error":
                raise ClientError(f"client {index}: {detail}")
            outs.append(detail)
        t1 = time.monotonic()
        cpu1 = broker.cpu_seconds()
        machine1 = machine_cpu()
        name, busiest = busiest_thread(threads0, thread_cpu(broker))
    finally:
        start.set()
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output and exits
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait(5)
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
    phase = Phase(server=server)
    phase.messages = sum(o["messages"] for o in outs)
    phase.seconds = max(o["t_end"] for o in outs) - t0
    phase.window_s = t1 - t0
    phase.broker_cpu_s = cpu1 - cpu0
    phase.client_cpu_s = [o["cpu_s"] for o in outs]
    phase.busiest_thread, phase.busiest_thread_cpu_s = name, busiest
    phase.machine_cpu_s = machine1[0] - machine0[0]
    phase.iowait_s = machine1[1] - machine0[1]
    phase.late = sum(o.get("late", 0) for o in outs)
    if job.kind == "receive":
        phase.acked_s = max(o["t_acked"] for o in outs) - t0
    if profile:
        phase.profile = profile_summary(profile, phase.window_s, profile_gil)
    return phase


# ------------------------------------------------------------------ cases
@dataclass
class Settings:
    messages: int = 100_000
    seconds: float = 10.0
    body_size: int = 100
    clients: int = 2
    receipt_every: int = 100
    window: int = 5000
    batch: int = 100
    prefetch: int = 1000
    ack_batch: int = 100
    fill_seconds: float = 120.0
    drain_seconds: float = 60.0
    warmup: int = 50_000
    pause: float = 1.0
    profile_gil: bool = False


#: Brokers whose Python code runs one thread at a time (the GIL): leveret's event loop and
#: its store writer thread together can use one core, whatever the machine has.
GIL_BOUND = frozenset({"leveret"})


def verdict(row: dict, cores: int, gil_bound: bool = False) -> str:
    """Which process limited the rate: a client process or a broker thread at ≥ 85% of a
    core (a busy event loop still waits a little for its reads); a GIL-bound broker
    process at ≥ 85% of one core (its threads take turns); or the machine (≥ 85% of
    every core busy: by the broker, or with a share of other processes of 25% or more);
    else neither: the rate is bound by waits (the disk, receipts, the prefetch window,
    hand-offs between the broker's threads)."""
    if row["client_max_cpu_pct"] >= 85:
        return "client"
    if row["busiest_thread_pct"] >= 85:
        return "broker (one thread)"
    if gil_bound and row["broker_cpu_pct"] >= 85:
        return "broker (one core: GIL)"
    if row["machine_cpu_pct"] >= 85 * cores:
        if row["other_cpu_pct"] >= 25:
            return f"all cores busy (other processes {row['other_cpu_pct']:.0f}%)"
        return "broker (all cores)"
    return "neither (waits)"


def _per_msg(cpu_s: float, messages: int) -> float | None:
    return round(cpu_s / messages * 1e6, 2) if messages else None


def row_from(case: str, phase: Phase, gil_bound: bool = False) -> dict:
    window = phase.window_s or 1e-9
    client_max = max(phase.client_cpu_s, default=0.0)
    row = {
        "case": case,
        "messages": phase.messages,
        "seconds": round(phase.seconds, 4),
        "msg_per_s": round(phase.rate, 1),
        "broker_cpu_s": round(phase.broker_cpu_s, 3),
        "broker_cpu_us_per_msg": _per_msg(phase.broker_cpu_s, phase.messages),
        "broker_cpu_pct": round(100 * phase.broker_cpu_s / window, 1),
        "busiest_thread": phase.busiest_thread,
        "busiest_thread_pct": round(100 * phase.busiest_thread_cpu_s / window, 1),
        "client_processes": len(phase.client_cpu_s),
        "client_cpu_pct": round(100 * sum(phase.client_cpu_s) / window, 1),
        "client_max_cpu_pct": round(100 * client_max / window, 1),
        "client_cpu_us_per_msg": _per_msg(sum(phase.client_cpu_s), phase.messages),
        "machine_cpu_pct": round(100 * phase.machine_cpu_s / window, 1),
        "other_cpu_pct": round(100 * max(0.0, phase.machine_cpu_s - phase.broker_cpu_s
                                         - sum(phase.client_cpu_s)) / window, 1),
        "iowait_pct": round(100 * phase.iowait_s / window, 1),
        "window_s": round(phase.window_s, 4),
    }
    if phase.acked_s is not None:
        row["acked_s"] = round(phase.acked_s, 4)
    if phase.late:
        row["late_deliveries"] = phase.late
    row["saturated"] = verdict(row, os.cpu_count() or 1, gil_bound)
    return row


def _job(broker: Broker, kind: str, destination: str, count: int, seconds: float, s: Settings,
         persistent: bool = False, ack_mode: str = "client-individual") -> Job:
    return Job(kind=kind, host=broker.host, port=broker.stomp_port, destination=destination, count=count,
               seconds=seconds, body_size=s.body_size, persistent=persistent, receipt_every=s.receipt_every,
               batch=s.batch, window=s.window, prefetch=s.prefetch, ack_batch=s.ack_batch, ack_mode=ack_mode)


def drain(broker: Broker, destination: str, expected: int, s: Settings) -> int:
    """Receive (untimed, ack auto) what a case left in its queue; returns how many came."""
    if expected <= 0:
        return 0
    phase = run_phase(broker, _job(broker, "receive", destination, expected, s.drain_seconds, s,
                                   ack_mode="auto"), 1)
    return phase.messages + phase.late


def run_case(broker: Broker, case: str, s: Settings, profile_dir: str | None) -> dict:
    destination = f"/queue/bench-{case}"
    profile = os.path.join(profile_dir, f"{broker.name}-{case}.txt") if profile_dir else None
    if case.startswith("send-"):
        persistent = case == "send-persistent"
        phase = run_phase(broker, _job(broker, "send", destination, s.messages, s.seconds, s, persistent),
                          s.clients, profile, s.profile_gil)
        row = row_from(case, phase, broker.name in GIL_BOUND)
        time.sleep(s.pause)
        got = drain(broker, destination, phase.messages, s)
        row["drained"] = got
        if got != phase.messages:
            log(f"[{broker.name}] {case}: WARNING: drained {got} of {phase.messages} messages")
    else:
        persistent = case == "receive"
        fill = run_phase(broker, _job(broker, "send", destination, s.messages, s.fill_seconds, s, persistent),
                         1)
        kind = "persistent" if persistent else "transient"
        log(f"[{broker.name}] {case}: pre-filled {fill.messages} {kind} messages in {fill.seconds:.2f} s "
            f"({fill.rate:,.0f} msg/s)")
        time.sleep(s.pause)
        phase = run_phase(broker, _job(broker, "receive", destination, fill.messages, s.seconds, s),
                          s.clients, profile, s.profile_gil)
        row = row_from(case, phase, broker.name in GIL_BOUND)
        row["filled"] = fill.messages
        left = fill.messages - phase.messages
        if left > 0:
            time.sleep(s.pause)
            row["drained"] = drain(broker, destination, left, s)
    row["server"] = phase.server
    if profile:
        row["profile"] = profile
        row.update(phase.profile)
        log(f"[{broker.name}] {case}: py-spy, % of the wall time: "
            + ", ".join(f"{k}: {v}" for k, v in phase.profile.items()))
    return row


def make_broker(name: str, args: argparse.Namespace) -> Broker:
    if name == "leveret":
        return Leveret(python=args.python, src=args.leveret_src)
    if name == "activemq":
        return ActiveMQ()
    return RabbitMQ(schedulers=args.rabbitmq_schedulers, stomp=True)


def run_broker(name: str, cases: list[str], s: Settings, args: argparse.Namespace) -> dict:
    """Start one broker, warm it up, run the cases, stop it (also on error or a signal)."""

    def body(broker: Broker, out: dict) -> None:
        if s.warmup:  # every case once with fewer messages (ActiveMQ's JIT compiles the paths)
            warm = dataclasses.replace(s, messages=s.warmup, pause=0.2)
            for case in cases:
                try:
                    row = run_case(broker, case, warm, None)
                    out["info"]["server"] = row["server"]
                except Exception as exc:  # (reported; the timed run goes on)
                    log(f"[{name}] warm-up {case} failed: {type(exc).__name__}: {exc}")
            log(f"[{name}] warmed up: every case with {s.warmup} messages ({out['info'].get('server')})")
            time.sleep(s.pause)
        report.run_cases(name, broker, cases, lambda case: run_case(broker, case, s, args.profile), describe,
                         out, s.pause)

    return report.run_broker(name, make_broker(name, args), "STOMP", body)


def describe(case: str, row: dict) -> str:
    """A case's log line."""
    return (f"{case:17s} {row['messages']:>7d} msgs in {row['seconds']:6.2f} s = "
            f"{row['msg_per_s']:>9,.0f} msg/s  {row['broker_cpu_us_per_msg'] or 0:7.1f} µs CPU/msg  "
            f"broker {row['broker_cpu_pct']:5.1f}% (busiest thread {row['busiest_thread_pct']:.0f}% "
            f"{row['busiest_thread']})  client {row['client_cpu_pct']:5.1f}%  "
            f"others {row['other_cpu_pct']:.0f}%  -> {row['saturated']}")


# ------------------------------------------------------------------ output
def tables(results: dict, cases: list[str]) -> list[tuple[str, list[str], list[list[str]]]]:
    names = [b for b in BROKERS if b in results]
    head = ["case"] + [f"{b} msg/s" for b in names] + [f"{b} µs CPU/msg" for b in names]
    lev = results.get("leveret", {}).get("rows", {})
    amq = results.get("activemq", {}).get("rows", {})
    rmq = results.get("rabbitmq", {}).get("rows", {})
    if lev and amq:
        head.append("ratio lev/amq")
    if lev and rmq:
        head += ["ratio lev/rmq", "CPU/msg lev/rmq"]
    if lev and amq and rmq:
        head.append("target")
    main = []
    for case in cases:
        rows = {b: results[b].get("rows", {}).get(case, {}) for b in names}
        line = [case] + [fmt(rows[b].get("msg_per_s")) for b in names]
        line += [fmt(rows[b].get("broker_cpu_us_per_msg"), ".1f") for b in names]
        ra = ratio(lev.get(case, {}).get("msg_per_s"), amq.get(case, {}).get("msg_per_s"))
        rr = ratio(lev.get(case, {}).get("msg_per_s"), rmq.get(case, {}).get("msg_per_s"))
        rc = ratio(lev.get(case, {}).get("broker_cpu_us_per_msg"),
                    rmq.get(case, {}).get("broker_cpu_us_per_msg"))
        if lev and amq:
            line.append(fmt(ra, ".2f"))
        if lev and rmq:
            line += [fmt(rr, ".2f"), fmt(rc, ".2f")]
        if lev and amq and rmq:
            line.append("-" if ra is None or rc is None else
                        ("met" if ra >= 2 and rc < 1 else
                         "missed: " + ", ".join(w for w, bad in (("< 2× ActiveMQ", ra < 2),
                                                                ("CPU ≥ RabbitMQ", rc >= 1)) if bad)))
        main.append(line)
    sat_head = ["broker", "case", "broker CPU %", "busiest broker thread %", "client CPU %",
                "client µs CPU/msg", "other processes CPU %", "iowait %", "saturated"]
    sat = []
    for b in names:
        for case in cases:
            r = results[b].get("rows", {}).get(case)
            if r:
                client = f"{r['client_cpu_pct']:.0f}"
                if r["client_processes"] > 1:
                    client += f" ({r['client_processes']} procs, max {r['client_max_cpu_pct']:.0f})"
                sat.append([b, case, f"{r['broker_cpu_pct']:.0f}",
                            f"{r['busiest_thread_pct']:.0f} ({r['busiest_thread']})", client,
                            fmt(r["client_cpu_us_per_msg"], ".1f"), f"{r['other_cpu_pct']:.0f}",
                            f"{r['iowait_pct']:.0f}", r["saturated"]])
    return [("STOMP throughput (msg/s) and broker CPU per message", head, main),
            ("Saturation (100% = one core busy)", sat_head, sat)]


def print_tables(results: dict, cases: list[str]) -> None:
    for title, head, rows in tables(results, cases):
        report.print_table(title, head, rows)
    report.print_errors(results)


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated (default: all installed)")
    p.add_argument("--cases", default=",".join(DEFAULT_CASES),
                   help=f"comma-separated from {', '.join(CASES)} (default: {', '.join(DEFAULT_CASES)})")
    p.add_argument("--messages", type=int, default=d.messages,
                   help=f"per case, at most (default {d.messages})")
    p.add_argument("--seconds", type=float, default=d.seconds,
                   help=f"timed phase of a case, at most (default {d.seconds:g})")
    p.add_argument("--body-size", type=int, default=d.body_size, help=f"bytes (default {d.body_size})")
    p.add_argument("--clients", type=int, default=d.clients,
                   help=f"client processes (one connection each) per timed phase (default {d.clients})")
    p.add_argument("--receipt-every", type=int, default=d.receipt_every,
                   help=f"persistent sends: a receipt every N frames (default {d.receipt_every})")
    p.add_argument("--window", type=int, default=d.window,
                   help=f"persistent sends: unreceipted messages per client at most, 0 = no bound "
                        f"(default {d.window})")
    p.add_argument("--batch", type=int, default=d.batch,
                   help=f"transient sends: frames per socket write (default {d.batch})")
    p.add_argument("--prefetch", type=int, default=d.prefetch,
                   help=f"receive: activemq.prefetchSize and prefetch-count (default {d.prefetch})")
    p.add_argument("--ack-batch", type=int, default=d.ack_batch,
                   help=f"receive: ACK frames per socket write (default {d.ack_batch})")
    p.add_argument("--warmup", type=int, default=d.warmup,
                   help=f"each case is run once with this many messages first, untimed (default {d.warmup})")
    p.add_argument("--fill-seconds", type=float, default=d.fill_seconds,
                   help=f"receive: pre-filling stops after this (default {d.fill_seconds:g})")
    p.add_argument("--drain-seconds", type=float, default=d.drain_seconds,
                   help=f"draining a queue after a case stops after this (default {d.drain_seconds:g})")
    p.add_argument("--pause", type=float, default=d.pause,
                   help=f"idle seconds between phases (default {d.pause:g})")
    p.add_argument("--rabbitmq-schedulers", type=int, default=None,
                   help="Erlang scheduler threads for RabbitMQ (default: one per core)")
    p.add_argument("--python", default=sys.executable, help="interpreter used to start leveret")
    p.add_argument("--leveret-src", default=None, help="run the leveret broker from another tree's src/")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="record leveret with py-spy during each timed phase into DIR/leveret-<case>.txt "
                        "(collapsed stacks with thread ids; slows the broker, so do not compare "
                        "these figures)")
    p.add_argument("--profile-gil", action="store_true",
                   help="with --profile: only samples that hold the GIL (py-spy --gil); the log then "
                        "shows how much of the time the GIL was held")
    p.add_argument("--output", default=str(HERE / "results" / "stomp-latest.json"), help="JSON results path")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, report.sigterm)
    s = Settings(messages=args.messages, seconds=args.seconds, body_size=args.body_size, clients=args.clients,
                 receipt_every=args.receipt_every, window=args.window, batch=args.batch,
                 prefetch=args.prefetch, ack_batch=args.ack_batch,
                 fill_seconds=args.fill_seconds, drain_seconds=args.drain_seconds,
                 warmup=args.warmup, pause=args.pause, profile_gil=args.profile_gil)
    cases, brokers = report.split_names(args.cases), report.split_names(args.brokers)
    report.check_names([*cases, *brokers], CASES, BROKERS)
    if "rabbitmq" in brokers and not rabbitmq_installed():
        log("NOTE: rabbitmq-server is not installed, skipped (apt-get install -y rabbitmq-server)")
        brokers.remove("rabbitmq")
    if "activemq" in brokers and not activemq_installed():
        log("NOTE: ActiveMQ is not installed, skipped (apt-get install -y activemq)")
        brokers.remove("activemq")
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    log(f"cases: {', '.join(cases)}; {s.messages} messages or {s.seconds:g} s each, {s.body_size} B bodies, "
        f"{s.clients} client process(es)")
    results = report.run_each(brokers, lambda b: run_broker(
        b, cases, s, args if b == "leveret" else argparse.Namespace(**{**vars(args), "profile": None})))
    if results is None:
        return 130
    print_tables(results, cases)
    meta = report.run_meta(settings=asdict(s), cases=cases)
    return report.write_results(args.output, meta, results)


if __name__ == "__main__":
    sys.exit(main())
