"""AMQP 1.0 throughput and broker CPU per message: leveret beside RabbitMQ 3.10's
``rabbitmq_amqp1_0`` plugin, and beside leveret's own AMQP 0-9-1, in the same run.

Usage::

    PYTHONPATH=src python bench/amqp10_bench.py                  # every cell, both brokers
    PYTHONPATH=src python bench/amqp10_bench.py --quick          # 4 cells, 20,000 messages
    PYTHONPATH=src python bench/amqp10_bench.py --brokers leveret --cells 100B-unsettled-c2000-transient
    PYTHONPATH=src python bench/amqp10_bench.py --profile /tmp/prof  # py-spy of leveret per phase

Cells: body size (100 B, 4 KB) × settlement (``settled``: pre-settled deliveries, at most
once; ``unsettled``: every delivery waits for its ``accepted`` outcome) × credit (200,
2000) × durability (``durable``: durable queue and ``header.durable``; ``transient``).
Each cell has two timed phases on a fresh queue:

* ``publish``: one proton sender sends ``--messages`` messages (or for ``--seconds``) to
  the queue. Unsettled: at most ``credit`` deliveries await their outcome (the broker's
  link credit bounds it too); the phase ends with the last ``accepted``. Settled: every
  delivery is sent settled except the last, whose ``accepted`` ends the phase (one link:
  the broker handled the earlier ones first).
* ``consume``: one proton receiver drains what ``publish`` left in the queue, granting
  ``credit`` (topped up when half is used). Settled: the receiver asks for pre-settled
  deliveries (``snd-settle-mode settled``); unsettled: it accepts and settles each
  delivery (``rcv-settle-mode first``).

Addresses: leveret ``/queues/NAME`` (RabbitMQ 4's address v2), RabbitMQ 3.10 ``/queue/NAME``
(its plugin's v1 address). Queues are declared (and deleted) over AMQP 0-9-1 on both.

The same cells run over AMQP 0-9-1 on leveret with the existing load generator
(bench/loadgen.py, bench/workloads.py's helpers): publish settled = no confirms (ends when
a passive ``queue.declare`` counts every message), unsettled = publisher confirms with a
window of ``credit``; consume settled = ``no_ack``, unsettled = ``basic.ack`` with
``multiple`` every ``--ack-every`` (50) deliveries, prefetch ``credit``; durable = durable
queue and ``delivery_mode 2``. (proton's engine settles by ranges: the deliveries read in
one turn are accepted by one disposition, ~50 a range here, and leveret answers a sender
by ranges too; ``PN_TRACE_FRM=1`` shows the frames.) ``--protocols amqp10`` leaves the
0-9-1 cells out.

The AMQP 1.0 client (``--driver engine``, the default) drives proton's C engine
(``pn_connection``/``pn_transport``/``pn_collector``, through the cffi module
python-qpid-proton ships) over a plain socket: 3-9 µs of client CPU per message.
``--driver reactor`` uses ``proton.reactor.Container`` with a bare handler (no
MessagingHandler layers); its Python event dispatch costs 45-55 µs per message, so it,
not the broker, saturates a core.

Processes: each phase's client runs in its own forked process, this process only starts
it and samples ``/proc``: CPU (utime +
stime) of the broker's process tree, of the client process and of the machine, from the
start signal to the client's report. Printed per phase: msg/s, broker µs CPU per
message, the ratios leveret/RabbitMQ (msg/s, CPU) and leveret AMQP 1.0 / leveret AMQP
0-9-1 (CPU: the target is ≤ 1.3), client µs CPU per message and which process saturated.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing as mp
import os
import queue
import resource
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402
from brokers import (  # noqa: E402
    Broker,
    Leveret,
    RabbitMQ,
    machine_cpu,
    proc_cpu_seconds,
    rabbitmq_installed,
)
from report import fmt, log, ratio  # noqa: E402

BROKERS = ("leveret", "rabbitmq")
PHASES = ("publish", "consume")
SIZES = {"100B": 100, "4KB": 4096}
SETTLE = ("settled", "unsettled")
CREDITS = (200, 2000)
DURABILITY = ("transient", "durable")
#: the cells of ``--quick``
QUICK_CELLS = (
    "100B-unsettled-c2000-transient",
    "100B-settled-c2000-transient",
    "4KB-unsettled-c2000-transient",
    "100B-unsettled-c200-durable",
)
PROFILE_RATE = 250  # py-spy samples per second


# ------------------------------------------------------------------ cells and settings
@dataclass(frozen=True)
class Cell:
    """One combination: ``size`` body bytes, ``settled``, link ``credit``, ``durable``."""

    size_label: str
    settled: bool
    credit: int
    durable: bool

    @property
    def size(self) -> int:
        return SIZES[self.size_label]

    @property
    def name(self) -> str:
        return (
            f"{self.size_label}-{'settled' if self.settled else 'unsettled'}-c{self.credit}-"
            f"{'durable' if self.durable else 'transient'}"
        )

    @staticmethod
    def parse(name: str) -> Cell:
        """``100B-unsettled-c200-durable`` → Cell; ValueError on anything else."""
        parts = name.split("-")
        if (
            len(parts) != 4
            or parts[0] not in SIZES
            or parts[1] not in SETTLE
            or not parts[2].startswith("c")
            or not parts[2][1:].isdigit()
            or parts[3] not in DURABILITY
        ):
            raise ValueError(f"not a cell: {name!r} (e.g. 100B-unsettled-c200-durable)")
        return Cell(parts[0], parts[1] == "settled", int(parts[2][1:]), parts[3] == "durable")


def all_cells() -> list[Cell]:
    return [
        Cell(z, s == "settled", c, d == "durable")
        for z in SIZES
        for s in SETTLE
        for c in CREDITS
        for d in DURABILITY
    ]


@dataclass
class Settings:
    messages: int = 100_000  # per publish phase at most
    seconds: float = 5.0  # publishing time per phase at most
    grace: float = 60.0  # extra seconds for the last outcomes / deliveries
    ack_every: int = 50  # AMQP 0-9-1 unsettled consume: ack (multiple) every N deliveries
    driver: str = "engine"  # AMQP 1.0 client: "engine" (proton's C engine, no reactor) or "reactor"
    pause: float = 0.5  # idle seconds between phases


@dataclass
class Job:
    """What one client process does (picklable)."""

    protocol: str  # "amqp10" or "amqp091"
    phase: str  # "publish" or "consume"
    host: str
    port: int
    address: str  # AMQP 1.0 address; the queue name for 0-9-1
    queue: str
    cell: Cell
    messages: int  # publish: at most; consume: exactly (what is in the queue)
    seconds: float
    grace: float
    ack_every: int = 1
    driver: str = "engine"  # AMQP 1.0 client: "engine" (proton's C engine) or "reactor"


# ------------------------------------------------------------------ AMQP 1.0 client (proton)
def _own_cpu() -> float:
    """This process's CPU seconds (user + system): a client reports its own, since it may
    be gone before the parent reads its /proc."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _proton_worker(job: Job, ready, start, results) -> None:
    """Run one proton reactor (``proton.reactor.Container``) with a bare handler: no
    MessagingHandler layers (they decode every message); the body is encoded once."""
    from proton import Delivery, Handler, Link, Message, Terminus
    from proton.reactor import Container

    cell = job.cell
    payload = Message(body=b"x" * cell.size, durable=cell.durable).encode()
    batch = 500  # deliveries handed to proton per turn at most (settled: bounds its buffer)

    class Client(Handler):
        def __init__(self) -> None:
            super().__init__()
            self.link = None
            self.started = False
            self.sent = self.settled_count = self.received = 0
            self.rejected = 0
            self.cpu0 = 0.0
            self.deadline = 0.0
            self.limit = job.messages
            self.last = None
            self.timer = False
            self.done = False
            self.t_end = 0.0

        def on_reactor_init(self, event) -> None:
            url = f"amqp://guest:guest@{job.host}:{job.port}"
            conn = event.container.connect(url, handler=self, reconnect=False, heartbeat=None)
            session = conn.session()
            session.open()
            name = f"bench-{job.phase}-{secrets.token_hex(3)}"
            if job.phase == "publish":
                link = session.sender(name)
                link.target.address = job.address
                link.snd_settle_mode = Link.SND_MIXED
            else:
                link = session.receiver(name)
                link.source.address = job.address
                link.snd_settle_mode = Link.SND_SETTLED if cell.settled else Link.SND_UNSETTLED
                link.rcv_settle_mode = Link.RCV_FIRST
            if cell.durable and job.address.startswith("/queue/"):
                # RabbitMQ 3.10's /queue/NAME declares the queue, durable only when the
                # terminus is (else precondition-failed against the durable one declared)
                terminus = link.target if job.phase == "publish" else link.source
                terminus.durability = Terminus.DELIVERIES
            link.open()
            self.link = link
            self.container = event.container

        def on_link_remote_open(self, event) -> None:
            if self.started:
                return
            if event.link.remote_condition:
                return self.fail(f"attach refused: {event.link.remote_condition}")
            ready.put(("ready", os.getpid(), ""))
            start.wait(120)
            self.cpu0 = _own_cpu()
            self.started = True
            self.deadline = time.monotonic() + job.seconds
            if job.phase == "consume":
                if self.limit == 0:
                    return self.finish()
                self.link.flow(min(cell.credit, self.limit))
            else:
                self.pump()

        # ---- sender
        def pump(self) -> None:
            link = self.link
            if not self.started or self.done or link is None:
                return
            n = 0
            while (
                link.credit > 0
                and self.sent < self.limit
                and n < batch
                and link.queued < batch
                and (cell.settled or self.sent - self.settled_count < cell.credit)
            ):
                if time.monotonic() > self.deadline:  # out of time: this one is the last
                    self.limit = self.sent + 1
                dlv = link.delivery(str(self.sent))
                link.stream(payload)
                link.advance()
                self.sent += 1
                n += 1
                if cell.settled:
                    if self.sent < self.limit:
                        dlv.settle()
                    else:
                        self.last = dlv.tag
            if self.sent < self.limit and not self.timer:
                self.timer = True  # come back when proton has written what it holds
                self.container.schedule(0.001, self)

        def on_timer_task(self, event) -> None:
            self.timer = False
            if job.phase == "publish":
                self.pump()
            elif self.started and not self.done and time.monotonic() > self.deadline + job.grace:
                self.fail(f"only {self.received} of {self.limit} deliveries in time")
            elif not self.done:
                self.container.schedule(1.0, self)

        def on_link_flow(self, event) -> None:
            if job.phase == "publish":
                self.pump()

        def on_delivery(self, event) -> None:
            dlv = event.delivery
            if job.phase == "publish":
                state = dlv.remote_state
                if state is None or not dlv.remote_state:
                    return
                if state != Delivery.ACCEPTED:
                    self.rejected += 1
                dlv.settle()
                self.settled_count += 1
                if cell.settled:
                    if dlv.tag == self.last:
                        self.finish()
                elif self.settled_count >= self.limit:
                    self.finish()
                else:
                    self.pump()
                return
            if dlv.partial:
                return
            link = dlv.link
            link.recv(dlv.pending)
            link.advance()
            if not cell.settled:
                dlv.update(Delivery.ACCEPTED)
            dlv.settle()
            self.received += 1
            left = self.limit - self.received
            if left <= 0:
                return self.finish()
            credit = link.credit
            if credit < cell.credit // 2 and credit < left:
                link.flow(min(cell.credit, left) - credit)

        def finish(self) -> None:
            if self.done:
                return
            self.done = True
            self.t_end = time.monotonic()
            count = self.received if job.phase == "consume" else self.sent
            results.put(
                (
                    "done",
                    os.getpid(),
                    {
                        "messages": count,
                        "t_end": self.t_end,
                        "rejected": self.rejected,
                        "cpu_s": _own_cpu() - self.cpu0,
                    },
                )
            )
            self.link.connection.close()

        def fail(self, msg: str) -> None:
            if not self.done:
                self.done = True
                ready.put(("error", os.getpid(), msg))
                results.put(("error", os.getpid(), msg))
            self.container.stop()

        def on_link_remote_close(self, event) -> None:
            if not self.done:
                self.fail(f"link detached: {event.link.remote_condition}")

        def on_session_remote_close(self, event) -> None:
            if not self.done:
                self.fail(f"session ended: {event.session.remote_condition}")

        def on_connection_remote_close(self, event) -> None:
            if not self.done:
                self.fail(f"connection closed: {event.connection.remote_condition}")
            event.connection.close()

        def on_transport_error(self, event) -> None:
            if not self.done:
                self.fail(f"transport error: {event.transport.condition}")

        def on_transport_closed(self, event) -> None:
            if not self.done:
                self.fail("connection lost")
            self.container.stop()

    client = Client()
    container = Container(client)
    if job.phase == "consume":
        container.schedule(1.0, client)
    container.run()


def _engine_worker(job: Job, ready, start, results) -> None:
    """Drive proton's C engine (``pn_connection``/``pn_transport``/``pn_collector`` through
    its cffi module) over a plain socket, without the reactor and without proton's Python
    wrapper objects: a message costs a handful of C calls (``pn_delivery``,
    ``pn_link_send``, ``pn_link_advance``, ``pn_delivery_settle``; receiving:
    ``pn_link_current``, ``pn_link_recv``, ``pn_delivery_update``). The body is encoded once
    with ``proton.Message``. Same cells, same outcomes as the reactor client."""
    import select
    import socket

    from cproton_ffi import ffi, lib
    from proton import Message

    cell = job.cell
    payload = bytes(Message(body=b"x" * cell.size, durable=cell.durable).encode())
    payload_ptr = ffi.from_buffer(payload)
    tag_bytes = [i.to_bytes(2, "big") for i in range(65536)]
    tags = [(2, ffi.from_buffer(b)) for b in tag_bytes]
    rbuf = bytearray(1 << 20)
    rbuf_ptr = ffi.from_buffer(rbuf)
    batch = 500
    out_max = 256 * 1024  # bytes encoded by proton but not yet written to the socket, at most
    read_max = 256 * 1024  # bytes read from the socket per turn, at most

    sock = socket.create_connection((job.host, job.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    conn = lib.pn_connection()
    coll = lib.pn_collector()
    lib.pn_connection_collect(conn, coll)
    lib.pn_connection_set_container(conn, f"bench-{secrets.token_hex(3)}".encode())
    lib.pn_connection_set_hostname(conn, job.host.encode())
    lib.pn_connection_set_user(conn, b"guest")
    lib.pn_connection_set_password(conn, b"guest")
    transport = lib.pn_transport()
    sasl = lib.pn_sasl(transport)
    lib.pn_sasl_allowed_mechs(sasl, b"PLAIN")
    lib.pn_sasl_set_allow_insecure_mechs(sasl, True)
    lib.pn_transport_bind(transport, conn)
    lib.pn_connection_open(conn)
    ssn = lib.pn_session(conn)
    lib.pn_session_open(ssn)
    name = f"bench-{job.phase}-{secrets.token_hex(3)}".encode()
    sender = job.phase == "publish"
    if sender:
        link = lib.pn_sender(ssn, name)
        terminus = lib.pn_link_target(link)
        lib.pn_link_set_snd_settle_mode(link, lib.PN_SND_MIXED)
    else:
        link = lib.pn_receiver(ssn, name)
        terminus = lib.pn_link_source(link)
        lib.pn_link_set_snd_settle_mode(link, lib.PN_SND_SETTLED if cell.settled else lib.PN_SND_UNSETTLED)
    lib.pn_link_set_rcv_settle_mode(link, lib.PN_RCV_FIRST)
    lib.pn_terminus_set_address(terminus, job.address.encode())
    if cell.durable and job.address.startswith("/queue/"):  # see the reactor client
        lib.pn_terminus_set_durability(terminus, lib.PN_DELIVERIES)
    lib.pn_link_open(link)

    def condition(cond) -> str:
        if cond == ffi.NULL or not lib.pn_condition_is_set(cond):
            return "no condition"
        name = lib.pn_condition_get_name(cond)
        desc = lib.pn_condition_get_description(cond)
        return " ".join(ffi.string(x).decode() for x in (name, desc) if x != ffi.NULL)

    class Failed(Exception):
        pass

    state = {"tail_closed": False}

    def io(timeout: float) -> None:
        """Write what proton has, read what the socket has (waiting ``timeout`` at most)."""
        pending = lib.pn_transport_pending(transport)
        if pending < 0 and state["tail_closed"]:
            raise Failed(f"connection closed: {condition(lib.pn_transport_condition(transport))}")
        want_w = [sock] if pending > 0 else []
        r, w, _ = select.select([sock], want_w, [], timeout)
        if w:
            _, data = _peek(pending)
            try:
                sent = sock.send(data)
            except BlockingIOError:
                sent = 0
            if sent:
                lib.pn_transport_pop(transport, sent)
        # everything the socket holds (up to ``read_max``), so that the deliveries of one
        # turn are accepted by one disposition range, as a reactor reading 64 KB would
        got = 0
        while r and got < read_max:
            cap = lib.pn_transport_capacity(transport)
            if cap <= 0:
                break
            try:
                data = sock.recv(min(cap, read_max - got))
            except BlockingIOError:
                break
            if not data:
                lib.pn_transport_close_tail(transport)
                state["tail_closed"] = True
                raise Failed(f"connection lost: {condition(lib.pn_transport_condition(transport))}")
            lib.pn_transport_push(transport, data, len(data))
            got += len(data)

    def _peek(pending: int):
        buf = bytearray(pending)
        n = lib.pn_transport_peek(transport, ffi.from_buffer(buf), pending)
        return n, memoryview(buf)[: max(n, 0)]

    remote_open = False
    counted = 0  # publish: outcomes; consume: deliveries
    rejected = 0
    last_tag = None

    def events() -> None:
        nonlocal remote_open, counted, rejected, last_tag
        while True:
            e = lib.pn_collector_peek(coll)
            if e == ffi.NULL:
                return
            t = lib.pn_event_type(e)
            if t == lib.PN_DELIVERY and sender:
                d = lib.pn_event_delivery(e)
                st = lib.pn_delivery_remote_state(d)
                if st:  # an outcome (the broker settles it too: rcv-settle-mode first)
                    if st != lib.PN_ACCEPTED:
                        rejected += 1
                    if last_tag is not None:
                        tb = lib.pn_delivery_tag(d)
                        if ffi.buffer(tb.start, tb.size)[:] == last_tag:
                            counted = -1  # the last one: done
                    elif counted >= 0:
                        counted += 1
                    lib.pn_delivery_settle(d)
            elif t == lib.PN_LINK_REMOTE_OPEN:
                remote_open = True
            elif t in (lib.PN_LINK_REMOTE_CLOSE, lib.PN_LINK_REMOTE_DETACH):
                raise Failed(f"link detached: {condition(lib.pn_link_remote_condition(link))}")
            elif t == lib.PN_SESSION_REMOTE_CLOSE:
                raise Failed(f"session ended: {condition(lib.pn_session_remote_condition(ssn))}")
            elif t == lib.PN_CONNECTION_REMOTE_CLOSE:
                raise Failed(f"connection closed: {condition(lib.pn_connection_remote_condition(conn))}")
            elif t == lib.PN_TRANSPORT_ERROR:
                raise Failed(f"transport error: {condition(lib.pn_transport_condition(transport))}")
            lib.pn_collector_pop(coll)

    try:
        t_open = time.monotonic() + 30
        while not remote_open:
            io(0.05)
            events()
            if time.monotonic() > t_open:
                raise Failed("no attach in 30 s")
        ready.put(("ready", os.getpid(), ""))
        start.wait(120)
        cpu0 = _own_cpu()
        deadline = time.monotonic() + job.seconds
        hard = deadline + job.grace
        limit = job.messages
        if sender:
            sent = 0
            while True:
                n = 0
                # proton encodes whatever the link holds into the transport's buffer, which
                # grows without bound: settled, nothing else holds the sender back
                room = lib.pn_transport_pending(transport) < out_max
                while (
                    room
                    and sent < limit
                    and n < batch
                    and lib.pn_link_credit(link) > 0
                    and lib.pn_link_queued(link) < batch
                    and (cell.settled or sent - counted < cell.credit)
                ):
                    if n == 0 and time.monotonic() > deadline:
                        limit = sent + 1  # out of time: the next one is the last
                    d = lib.pn_delivery(link, tags[sent & 0xFFFF])
                    lib.pn_link_send(link, payload_ptr, len(payload))
                    lib.pn_link_advance(link)
                    sent += 1
                    n += 1
                    if cell.settled:
                        if sent < limit:
                            lib.pn_delivery_settle(d)
                        else:
                            last_tag = tag_bytes[(sent - 1) & 0xFFFF]
                io(0 if n else 0.005)
                events()
                if counted < 0 or (not cell.settled and counted >= limit):
                    break
                if time.monotonic() > hard:
                    raise Failed(f"only {counted} of {sent} outcomes in time")
            messages = sent
        else:
            left = limit
            got = 0
            if left:
                lib.pn_link_flow(link, min(cell.credit, left))
            accepted = lib.PN_ACCEPTED
            while got < limit:
                io(0.005)
                while True:
                    d = lib.pn_link_current(link)
                    if d == ffi.NULL or lib.pn_delivery_partial(d) or not lib.pn_delivery_readable(d):
                        break
                    pend = lib.pn_delivery_pending(d)
                    while pend > 0:
                        pend -= max(lib.pn_link_recv(link, rbuf_ptr, min(pend, len(rbuf))), 0) or pend
                    lib.pn_link_advance(link)
                    if not cell.settled:
                        lib.pn_delivery_update(d, accepted)
                    lib.pn_delivery_settle(d)
                    got += 1
                left = limit - got
                credit = lib.pn_link_credit(link)
                if credit < cell.credit // 2 and credit < left:
                    lib.pn_link_flow(link, min(cell.credit, left) - credit)
                events()
                if time.monotonic() > hard:
                    raise Failed(f"only {got} of {limit} deliveries in time")
            messages = got
        t_end = time.monotonic()
        results.put(
            (
                "done",
                os.getpid(),
                {"messages": messages, "t_end": t_end, "rejected": rejected, "cpu_s": _own_cpu() - cpu0},
            )
        )
        lib.pn_connection_close(conn)
        try:
            for _ in range(20):
                io(0.01)
        except Failed:
            pass
    except Failed as exc:
        ready.put(("error", os.getpid(), str(exc)))
        results.put(("error", os.getpid(), str(exc)))
    finally:
        sock.close()


# ------------------------------------------------------------------ AMQP 0-9-1 client (loadgen)
async def _amqp091_client(job: Job, ready, start, results) -> None:
    from workloads import _close, _flood, _open, _publish_confirmed, _sync_depth, _wait_until

    broker = Broker(name="leveret", host=job.host, port=job.port)
    cell = job.cell
    conn, ch = await _open(broker)
    try:
        if job.phase == "publish":
            if not cell.settled:
                await ch.confirm_select()
            msg = ch.message("", job.queue, b"x" * cell.size, persistent=cell.durable)
            ready.put(("ready", os.getpid(), ""))
            start.wait(120)
            cpu0 = _own_cpu()
            deadline = time.monotonic() + job.seconds
            if cell.settled:
                sent = await _flood(conn, msg, job.messages, deadline, 500)
                got = await _sync_depth(ch, job.queue, sent, time.monotonic() + job.grace)
            else:
                sent = await _publish_confirmed(conn, ch, msg, job.messages, cell.credit, deadline)
                await _wait_until(lambda: ch.confirmed >= sent, [conn], time.monotonic() + job.grace)
                got = ch.confirmed
            t_end = time.monotonic()
        else:
            await ch.qos(cell.credit)
            ready.put(("ready", os.getpid(), ""))
            start.wait(120)
            cpu0 = _own_cpu()
            tag = await ch.consume(job.queue, ack_every=0 if cell.settled else job.ack_every)
            await _wait_until(
                lambda: ch.delivered >= job.messages, [conn], time.monotonic() + job.seconds + job.grace
            )
            t_end = time.monotonic()
            got = ch.delivered
            ch.ack_pending()
            await ch.cancel(tag)
        results.put(
            (
                "done",
                os.getpid(),
                {"messages": got, "t_end": t_end, "rejected": 0, "cpu_s": _own_cpu() - cpu0},
            )
        )
    finally:
        await _close(conn)


def _worker(job: Job, ready, start, results) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    try:
        if job.protocol == "amqp10" and job.driver == "reactor":
            _proton_worker(job, ready, start, results)
        elif job.protocol == "amqp10":
            _engine_worker(job, ready, start, results)
        else:
            from loadgen import new_event_loop

            loop = new_event_loop()
            loop.run_until_complete(_amqp091_client(job, ready, start, results))
    except Exception as exc:  # reported to the parent, which fails the phase
        msg = f"{type(exc).__name__}: {exc}"
        ready.put(("error", os.getpid(), msg))
        results.put(("error", os.getpid(), msg))


# ------------------------------------------------------------------ queues over AMQP 0-9-1
def _queue_op(broker: Broker, op: str, name: str, durable: bool = False) -> int:
    """``declare`` / ``delete`` / ``depth`` of queue ``name`` over AMQP 0-9-1."""
    from workloads import _close, _open

    async def run() -> int:
        conn, ch = await _open(broker)
        try:
            if op == "declare":
                await ch.queue_declare(name, durable=durable)
                return 0
            if op == "delete":
                return await ch.queue_delete(name)
            return (await ch.queue_declare(name, passive=True)).message_count
        finally:
            await _close(conn)

    from loadgen import new_event_loop

    loop = new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(run(), 60))
    finally:
        loop.close()


# ------------------------------------------------------------------ one timed phase
class ClientError(RuntimeError):
    pass


@dataclass
class Phase:
    messages: int = 0
    seconds: float = 0.0  # start → the client's last outcome / delivery
    window_s: float = 0.0  # start → the client's report (what the CPU figures cover)
    broker_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    machine_cpu_s: float = 0.0
    rejected: int = 0
    profile: list = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


def run_phase(broker: Broker, job: Job, profile: str | None = None) -> Phase:
    """Fork the client, wait until it is attached, then start it and sample /proc."""
    ctx = mp.get_context("fork")
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_worker, args=(job, ready, start, results), daemon=True)
    spy = None
    try:
        proc.start()
        what, _, detail = ready.get(timeout=60)
        if what == "error":
            raise ClientError(detail)
        if profile:
            spy = subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "--pid",
                    str(broker.pid),
                    "--format",
                    "raw",
                    "--rate",
                    str(PROFILE_RATE),
                    "-o",
                    profile,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # py-spy attaches
        c0, m0, b0 = proc_cpu_seconds(proc.pid or 0), machine_cpu()[0], broker.cpu_seconds()
        t0 = time.monotonic()
        start.set()
        limit = t0 + job.seconds + job.grace + 30
        while True:
            try:
                what, _, detail = results.get(timeout=max(0.5, limit - time.monotonic()))
                break
            except queue.Empty:
                if not proc.is_alive() or time.monotonic() > limit:
                    raise ClientError("the client did not finish in time") from None
        t1 = time.monotonic()
        b1, m1, c1 = broker.cpu_seconds(), machine_cpu()[0], proc_cpu_seconds(proc.pid or 0)
        if what == "error":
            raise ClientError(detail)
    finally:
        start.set()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait(5)
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    ph = Phase(
        messages=detail["messages"],
        seconds=detail["t_end"] - t0,
        window_s=t1 - t0,
        broker_cpu_s=b1 - b0,
        client_cpu_s=detail.get("cpu_s", c1 - c0),
        machine_cpu_s=m1 - m0,
        rejected=detail["rejected"],
    )
    if profile:
        ph.profile = top_functions(profile)
    return ph


def verdict(broker_pct: float, client_pct: float, machine_pct: float, cores: int) -> str:
    """Which process limited the rate: the client at ≥ 85% of a core first, then the broker
    (leveret's event loop is one core; RabbitMQ's schedulers may use more, it counts at 85%
    of one core too), else the machine (≥ 85% of every core), else neither (the windows:
    credit, outcomes, the disk)."""
    if client_pct >= 85:
        return "client"
    if broker_pct >= 85:
        return "broker"
    if machine_pct >= 85 * cores:
        return "machine (all cores)"
    return "neither"


def phase_row(ph: Phase) -> dict:
    w = max(ph.window_s, 1e-9)
    cores = os.cpu_count() or 1
    n = max(ph.messages, 1)
    broker_pct, client_pct = 100 * ph.broker_cpu_s / w, 100 * ph.client_cpu_s / w
    machine_pct = 100 * ph.machine_cpu_s / w
    return {
        "messages": ph.messages,
        "seconds": round(ph.seconds, 3),
        "msg_per_s": round(ph.rate, 1),
        "broker_us_per_msg": round(1e6 * ph.broker_cpu_s / n, 2),
        "client_us_per_msg": round(1e6 * ph.client_cpu_s / n, 2),
        "broker_cpu_pct": round(broker_pct, 1),
        "client_cpu_pct": round(client_pct, 1),
        "machine_cpu_pct": round(machine_pct, 1),
        "saturated": verdict(broker_pct, client_pct, machine_pct, cores),
        "rejected": ph.rejected,
        **({"profile_top": ph.profile} if ph.profile else {}),
    }


# ------------------------------------------------------------------ profiles
#: innermost frames of a thread that waits (the store writer, executors): not broker work
IDLE = ("wait (threading.py", "Condition.wait (threading.py", "_worker (concurrent/futures/thread.py")


def top_functions(path: str, n: int = 20) -> list:
    """The ``n`` functions with the most samples in a py-spy ``--format raw`` file, by
    inclusive share (anywhere in the stack), in % of the busy samples (a thread waiting in
    :data:`IDLE` is left out): ``[(function, own %, inclusive %)]``, the event loop's
    outermost frames (the CLI, runpy) left out. ``own`` is the innermost frame's share;
    ``server (leveret/cli/server.py)``'s own share is uvloop's C code (reads, writes,
    callbacks)."""
    own: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    total = 0
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_short(f) for f in stack.split(";")]
        if not frames or frames[-1].startswith(IDLE):
            continue
        k = int(count)
        total += k
        own[frames[-1]] += k
        for f in set(frames):
            incl[f] += k
    if not total:
        return []
    skip = ("<module>", "_run_code", "_run_module_as_main", "Command.", "Group.", "Context.", "main (")
    ranked = [f for f, _ in incl.most_common() if not f.startswith(skip)]
    return [(f, round(100 * own[f] / total, 1), round(100 * incl[f] / total, 1)) for f in ranked[:n]]


def _short(frame: str) -> str:
    """``func (path/to/file.py:123)`` → ``func (file.py)``: one name per function."""
    name, _, where = frame.partition(" (")
    file = where.rstrip(")").rsplit(":", 1)[0]
    if "site-packages/" in file:
        file = file.split("site-packages/", 1)[1]
    elif "/lib/python" in file:
        file = file.split("/lib/python", 1)[1].split("/", 1)[-1]
    elif "src/leveret/" in file:
        file = file.split("src/", 1)[1]
    return f"{name} ({file})"


# ------------------------------------------------------------------ running a broker
def address_of(broker: str, q: str) -> str:
    return f"/queues/{q}" if broker == "leveret" else f"/queue/{q}"


def run_cell(
    broker: Broker, bname: str, protocol: str, cell: Cell, s: Settings, profile_dir: str | None
) -> dict:
    """Both phases of ``cell`` on a fresh queue; returns ``{phase: row}``."""
    q = f"bench-{protocol}-{cell.name}-{secrets.token_hex(3)}"
    _queue_op(broker, "declare", q, cell.durable)
    rows: dict = {}
    try:
        address = address_of(bname, q) if protocol == "amqp10" else q
        for phase in PHASES:
            if phase == "consume":
                depth = _queue_op(broker, "depth", q)
                count = depth
            else:
                count = s.messages
            job = Job(
                protocol,
                phase,
                broker.host,
                broker.port,
                address,
                q,
                cell,
                count,
                s.seconds,
                s.grace,
                s.ack_every,
                s.driver,
            )
            prof = None
            if profile_dir and bname == "leveret":
                prof = os.path.join(profile_dir, f"{protocol}-{cell.name}-{phase}.txt")
            ph = run_phase(broker, job, prof)
            rows[phase] = phase_row(ph)
            r = rows[phase]
            log(
                f"[{bname} {protocol}] {cell.name} {phase}: {r['messages']} in {r['seconds']:.2f} s, "
                f"{r['msg_per_s']:,.0f} msg/s, broker {r['broker_us_per_msg']:.1f} µs/msg "
                f"({r['broker_cpu_pct']:.0f}%), client {r['client_us_per_msg']:.1f} µs/msg "
                f"({r['client_cpu_pct']:.0f}%), saturated: {r['saturated']}"
            )
            time.sleep(s.pause)
    finally:
        try:
            _queue_op(broker, "delete", q)
        except Exception:  # best effort: the broker may be gone
            pass
    return rows


def amqp10_refusal(broker: Broker) -> str | None:
    """None when ``broker`` opens an AMQP 1.0 connection (proton's BlockingConnection, SASL
    PLAIN guest/guest) on its AMQP port; else why not."""
    from proton.utils import BlockingConnection

    try:
        c = BlockingConnection(f"amqp://guest:guest@{broker.host}:{broker.port}", timeout=5)
        c.close()
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def run_broker(
    bname: str, cells: list[Cell], s: Settings, protocols: list[str], src: str | None, profile_dir: str | None
) -> dict:
    broker: Broker = Leveret(src=src) if bname == "leveret" else RabbitMQ(amqp10=True)

    def body(b: Broker, out: dict) -> None:
        wanted = [p for p in protocols if p == "amqp10" or bname == "leveret"]
        if "amqp10" in wanted:
            why = amqp10_refusal(b)
            if why:
                log(f"[{bname}] AMQP 1.0 refused, its AMQP 1.0 cells skip: {why}")
                out["errors"]["amqp10"] = f"AMQP 1.0 refused: {why}"
                wanted.remove("amqp10")
        for cell in cells:
            for protocol in wanted:
                key = f"{protocol} {cell.name}"
                if not b.alive():
                    out["errors"][key] = "broker is not running"
                    continue
                try:
                    out["rows"][key] = run_cell(b, bname, protocol, cell, s, profile_dir)
                except Exception as exc:  # keep going with the next cell
                    out["errors"][key] = f"{type(exc).__name__}: {exc}"
                    log(f"[{bname} {protocol}] {cell.name}: FAILED: {type(exc).__name__}: {exc}")

    out: dict = {"rows": {}, "errors": {}, "info": {}}
    t = report.start(bname, broker, out)
    if t is None:
        return out
    try:
        log(
            f"[{bname}] ready, AMQP on {broker.host}:{broker.port} (pid {broker.pid}) "
            f"in {time.monotonic() - t:.1f} s"
        )
        out["info"] = {"pid": broker.pid, "idle_rss_mb": round(broker.rss_bytes() / 2**20, 1)}
        body(broker, out)
    finally:
        log(f"[{bname}] stopping")
        broker.stop()
    return out


# ------------------------------------------------------------------ output
def _get(results: dict, broker: str, protocol: str, cell: Cell, phase: str) -> dict | None:
    return results.get(broker, {}).get("rows", {}).get(f"{protocol} {cell.name}", {}).get(phase)


def print_tables(results: dict, cells: list[Cell]) -> None:
    head = [
        "cell",
        "phase",
        "leveret msg/s",
        "RabbitMQ msg/s",
        "lev/RMQ msg/s",
        "leveret µs/msg",
        "RabbitMQ µs/msg",
        "lev/RMQ CPU",
        "lev 0-9-1 µs/msg",
        "1.0/0-9-1 CPU",
        "client µs/msg lev/RMQ",
        "saturated lev / RMQ / 0-9-1",
    ]
    rows = []
    for cell in cells:
        for phase in PHASES:
            lev = _get(results, "leveret", "amqp10", cell, phase)
            rmq = _get(results, "rabbitmq", "amqp10", cell, phase)
            o91 = _get(results, "leveret", "amqp091", cell, phase)

            def v(r, k):
                return r[k] if r else None

            rows.append(
                [
                    cell.name,
                    phase,
                    fmt(v(lev, "msg_per_s"), ",.0f"),
                    fmt(v(rmq, "msg_per_s"), ",.0f"),
                    fmt(ratio(v(lev, "msg_per_s"), v(rmq, "msg_per_s")), ".2f"),
                    fmt(v(lev, "broker_us_per_msg"), ".1f"),
                    fmt(v(rmq, "broker_us_per_msg"), ".1f"),
                    fmt(ratio(v(lev, "broker_us_per_msg"), v(rmq, "broker_us_per_msg")), ".2f"),
                    fmt(v(o91, "broker_us_per_msg"), ".1f"),
                    fmt(ratio(v(lev, "broker_us_per_msg"), v(o91, "broker_us_per_msg")), ".2f"),
                    f"{fmt(v(lev, 'client_us_per_msg'), '.1f')} / {fmt(v(rmq, 'client_us_per_msg'), '.1f')}",
                    " / ".join(str(v(r, "saturated") or "-") for r in (lev, rmq, o91)),
                ]
            )
    report.print_table(
        "AMQP 1.0: leveret vs RabbitMQ 3.10 (rabbitmq_amqp1_0), and leveret's AMQP 0-9-1", head, rows
    )
    print(
        "\nmsg/s ratio above 1: leveret faster (target ≥ 2); CPU ratios below 1: leveret cheaper;"
        " 1.0/0-9-1 CPU: target ≤ 1.3"
    )
    report.print_errors(results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--brokers", default=",".join(BROKERS), help="comma-separated: leveret, rabbitmq")
    ap.add_argument("--cells", default="", help="comma-separated cell names (default: all 16)")
    ap.add_argument(
        "--quick", action="store_true", help=f"cells {', '.join(QUICK_CELLS)}; 20,000 messages, 2 s per phase"
    )
    ap.add_argument("--messages", type=int, default=None, help="per publish phase at most (100,000)")
    ap.add_argument("--seconds", type=float, default=None, help="publish time per phase at most (5)")
    ap.add_argument(
        "--ack-every",
        type=int,
        default=50,
        help="AMQP 0-9-1 unsettled consume: ack (multiple) every N deliveries (50: proton settles by ranges)",
    )
    ap.add_argument(
        "--driver",
        choices=("engine", "reactor"),
        default="engine",
        help="AMQP 1.0 client: proton's C engine driven directly (engine), or proton.reactor.Container",
    )
    ap.add_argument(
        "--protocols",
        default="amqp10,amqp091",
        help="comma-separated: amqp10 (both brokers), amqp091 (leveret's own, the CPU target's reference)",
    )
    ap.add_argument("--src", default=None, help="another leveret src/ for the broker (before/after)")
    ap.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="record leveret with py-spy per phase into DIR; print the top functions",
    )
    ap.add_argument("--json", default="bench/results/amqp10.json", help="results file")
    args = ap.parse_args(argv)
    s = Settings(ack_every=args.ack_every, driver=args.driver)
    if args.quick:
        s.messages, s.seconds = 20_000, 2.0
    if args.messages is not None:
        s.messages = args.messages
    if args.seconds is not None:
        s.seconds = args.seconds
    names = report.split_names(args.cells) or (list(QUICK_CELLS) if args.quick else [])
    try:
        cells = [Cell.parse(n) for n in names] if names else all_cells()
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    brokers = report.split_names(args.brokers)
    for b in brokers:
        if b not in BROKERS:
            raise SystemExit(f"unknown broker {b!r}: {', '.join(BROKERS)}")
    if "rabbitmq" in brokers and not rabbitmq_installed():
        log("RabbitMQ is not installed: its cells skip")
        brokers.remove("rabbitmq")
    protocols = report.split_names(args.protocols)
    if not protocols or any(p not in ("amqp10", "amqp091") for p in protocols):
        raise SystemExit("--protocols: amqp10, amqp091")
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    signal.signal(signal.SIGTERM, report.sigterm)
    results = report.run_each(brokers, lambda b: run_broker(b, cells, s, protocols, args.src, args.profile))
    if results is None:
        return 130
    print_tables(results, cells)
    if args.profile:
        for key, rows in results.get("leveret", {}).get("rows", {}).items():
            for phase, r in rows.items():
                if r.get("profile_top"):
                    print(f"\nleveret {key} {phase}: top functions (inclusive %, own %) of the busy samples")
                    for f, own, inc in r["profile_top"]:
                        print(f"  {inc:5.1f} {own:5.1f}  {f}")
    meta = report.run_meta(settings=asdict(s), cells=[c.name for c in cells])
    return report.write_results(args.json, meta, results)


if __name__ == "__main__":
    sys.exit(main())
