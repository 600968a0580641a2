"""The cost of the message path between two cluster nodes (not a test).

Two brokers in subprocesses, wired by hand as nodes "a" and "b" of a cluster (as
tests/cluster_pair.py does in process): "b" owns queue ``q``, "a" holds a RemoteQueue of
it with a link to "b". One publisher (confirms, window 1000) and one consumer (prefetch
1000, acks every 100) with leveret's asyncio client run in this process:

- ``direct``: both on b, the queue's owner;
- ``via-a``: both on a: every message is forwarded a → b and relayed b → a.

Reported: msg/s (published and consumed, wall clock) and each broker process's CPU
(user + system, /proc/PID/stat) per message, in µs. Usage::

    PYTHONPATH=src python3 bench/cluster_path_probe.py [--count 20000] [--size 100] [--persistent]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

SECRET = "bench-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def serve(name: str, ports: dict[str, int], data_dir: str, durable: bool) -> None:
    """Run node ``name`` until stdin closes."""
    from leveret.cluster.confirms import ClusterConfirms
    from leveret.cluster.owner import accept_peers
    from leveret.cluster.peers import FlowGate, Peers
    from leveret.core.queues.remote import RemoteQueue
    from leveret.server.broker import Broker

    broker = Broker(amqp_port=ports[name], data_dir=data_dir)
    await broker.start()
    core = broker.core
    peers = Peers(SECRET, lambda node: ("127.0.0.1", ports[node]) if node in ports else None)
    core.cluster = peers
    accept_peers(core, SECRET)
    gate = FlowGate(core.flow.set)
    if broker.store is not None:
        broker.store.on_flow = gate.store
    peers.on_flow = gate.links
    vhost = core.vhosts["/"]
    vhost.store = ClusterConfirms(vhost.store, peers.vhost_links("/"))
    if name == "b":
        vhost.declare_queue("q", None, durable=durable)
    else:
        vhost.queues["q"] = RemoteQueue(vhost, "q", durable, False, {}, "b", peers.link("b", "/"))
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    await peers.close()
    await broker.stop()


async def run_load(port: int, count: int, size: int, persistent: bool) -> float:
    """Publish ``count`` messages and consume them on the broker at ``port``; seconds."""
    from leveret.amqp.client import Connection

    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    publisher = await Connection.connect(url)
    consumer_connection = await Connection.connect(url)
    body = b"x" * size
    received = 0
    done = asyncio.get_running_loop().create_future()
    channel = await consumer_connection.channel()
    await channel.qos(1000)

    def on_delivery(delivery) -> None:
        nonlocal received
        received += 1
        if received % 100 == 0 or received == count:
            channel.ack(delivery.delivery_tag, multiple=True)
        if received == count and not done.done():
            done.set_result(None)

    started = time.perf_counter()
    await channel.consume("q", callback=on_delivery)
    out = await publisher.channel()
    await out.confirm_select()
    properties = {"delivery_mode": 2} if persistent else {}
    sent = 0
    while sent < count:
        batch = min(100, count - sent)
        out.publish_many("", "q", [body] * batch, properties)
        sent += batch
        await out.wait_confirms(below=1000)
    await out.wait_confirms()
    await asyncio.wait_for(done, 60)
    elapsed = time.perf_counter() - started
    await publisher.close()
    await consumer_connection.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve")
    parser.add_argument("--ports")
    parser.add_argument("--data-dir")
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--persistent", action="store_true")
    args = parser.parse_args()
    if args.serve:
        a, b = (int(p) for p in args.ports.split(","))
        profile = os.environ.get("CLUSTER_PROBE_PROFILE") == args.serve  # cProfile one node
        if profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.enable()
        asyncio.run(serve(args.serve, {"a": a, "b": b}, args.data_dir, args.persistent))
        if profile:
            profiler.disable()
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
        return
    import tempfile

    ports = {"a": free_port(), "b": free_port()}
    tmp = tempfile.mkdtemp(prefix="cluster-path-")
    nodes = {}
    for name in ("b", "a"):
        command = [
            sys.executable,
            __file__,
            "--serve",
            name,
            "--ports",
            f"{ports['a']},{ports['b']}",
            "--data-dir",
            f"{tmp}/{name}",
        ] + (["--persistent"] if args.persistent else [])
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        nodes[name] = proc
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    kind = "persistent" if args.persistent else "transient"
    print(f"{args.count} x {args.size} B {kind}, one publisher (confirms) and one consumer")
    try:
        for label, node in (("direct on b", "b"), ("via a (a -> b -> a)", "a")):
            asyncio.run(run_load(ports[node], 2000, args.size, args.persistent))  # warm up
            before = {name: cpu_seconds(proc.pid) for name, proc in nodes.items()}
            elapsed = asyncio.run(run_load(ports[node], args.count, args.size, args.persistent))
            used = {name: cpu_seconds(proc.pid) - before[name] for name, proc in nodes.items()}
            per = {name: used[name] / args.count * 1e6 for name in used}
            print(
                f"{label:22} {args.count / elapsed:8.0f} msg/s   CPU µs/msg: a {per['a']:6.1f}  "
                f"b {per['b']:6.1f}  total {per['a'] + per['b']:6.1f}"
            )
    finally:
        for proc in nodes.values():
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in nodes.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
