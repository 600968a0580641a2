"""``leveret server --nodes N`` on one machine: a many-queue transient workload, msg/s
and CPU per process (docs/cluster.md, "One machine, several cores").

Modes (``--mode``):

- ``nodes`` (default): ``leveret server --nodes N`` (a private PostgreSQL under a
  temporary data directory), the cluster of issue 32.
- ``ceiling``: N independent brokers (no store, no cluster) sharing the port with
  ``--reuse-port``: what N processes give when no message crosses between them, the
  upper bound of the cluster's gain on this machine.

The workload: ``--queues`` queues; each has one connection with a consumer channel
(manual acks every 100, prefetch 1000) and a publisher channel keeping at most
``--window`` messages in flight (published, not yet delivered), 100-byte transient
messages, default exchange. Its queue is declared on that connection, so in a cluster
it lives on the node the kernel gave the connection (client-local) and no message
crosses nodes: ``--split`` puts the publisher on a connection of its own instead
(the kernel may give it another node: half the messages cross nodes with N=2).

The load generator (``--clients`` processes, leveret's counting client, bench/loadgen.py)
runs on the same cores; the CPU of every process is read from /proc over the measured
window. Usage::

    PYTHONPATH=src python3 bench/nodes_flag_bench.py --nodes 1 --nodes 2 [--mode ceiling]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loadgen

from leveret.cluster.embedded_pg import free_port

TICKS = os.sysconf("SC_CLK_TCK")
SRC = Path(__file__).resolve().parents[1] / "src"


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (its threads included), seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def processes_naming(text: str) -> dict[int, str]:
    """pid -> a short name of every process whose command line contains ``text``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        line = b" ".join(argv).decode(errors="replace")
        try:  # PostgreSQL's backends and helpers: their working directory is the data
            cwd = os.readlink(entry / "cwd")
        except OSError:
            cwd = ""
        if text in line or cwd.startswith(text):
            if "--node" in argv[5:] or b"--node" in argv:
                name = "node " + argv[argv.index(b"--node") + 1].decode()
            elif b"postgres" in argv[0] or cwd.startswith(text):
                name = "postgresql"
            elif b"--nodes" in argv:
                name = "supervisor"
            else:
                name = "broker " + argv[argv.index(b"--data-dir") + 1].decode().rsplit("/", 1)[-1]
            found[int(entry.name)] = name
    return found


def start_brokers(mode: str, nodes: int, workdir: Path, port: int) -> list[subprocess.Popen]:
    env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    common = ["--amqp-port", str(port), "--stomp-port", "-1", "--web-stomp-port", "-1", "--mqtt-port", "-1",
              "--web-mqtt-port", "-1", "--prometheus-port", "-1", "--log-level", "warning"]  # fmt: skip
    if mode == "nodes":
        argv = [[sys.executable, "-m", "leveret", "server", "--nodes", str(nodes),
                 "--data-dir", str(workdir / "data"), *common]]  # fmt: skip
        ready = "leveret nodes:"
    else:
        argv = [[sys.executable, "-m", "leveret", "server", "--reuse-port",
                 "--data-dir", str(workdir / f"b{i}"), *common] for i in range(nodes)]  # fmt: skip
        ready = "leveret ready:"
    procs = []
    for command in argv:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
        )
        procs.append(proc)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(ready):
                break
        else:
            raise RuntimeError(f"{command} exited with {proc.wait()}")
    return procs


async def client_main(port: int, queues: list[str], window: int, split: bool, warmup: float, seconds: float,
                      out) -> None:
    conns = []
    pairs = []
    for q in queues:
        cconn = await loadgen.Connection.open("127.0.0.1", port)
        conns.append(cconn)
        cch = await cconn.channel()
        await cch.queue_declare(q, auto_delete=False)
        await cch.qos(1000)
        await cch.consume(q, ack_every=100)
        pconn = cconn
        if split:
            pconn = await loadgen.Connection.open("127.0.0.1", port)
            conns.append(pconn)
        pch = await pconn.channel()
        pairs.append((pconn, pch.message("", q, b"x" * 100), cch))
    sent = [0] * len(pairs)
    out.put(("ready", 0))
    begin = time.monotonic()
    measuring, deadline = begin + warmup, begin + warmup + seconds
    marks = []
    cpu_start = None
    while time.monotonic() < deadline:
        if cpu_start is None and time.monotonic() >= measuring:
            cpu_start = time.process_time()
        for i, (pconn, msg, cch) in enumerate(pairs):
            allowed = window - (sent[i] - cch.delivered)
            if allowed >= 50:
                pconn.write(msg * allowed)
                sent[i] += allowed
        marks.append((time.monotonic(), sum(cch.delivered for _, _, cch in pairs)))
        await loadgen.wait_any_progress(conns, 0.05)
        for _, _, cch in pairs:
            cch.ack_pending()
    out.put(("marks", marks, time.process_time() - (cpu_start or 0.0)))
    for conn in conns:
        conn.abort()


def client_process(port: int, queues: list[str], window: int, split: bool, warmup: float, seconds: float,
                   out) -> None:
    loop = loadgen.new_event_loop()
    loop.run_until_complete(client_main(port, queues, window, split, warmup, seconds, out))


def run(mode: str, nodes: int, args: argparse.Namespace) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="leveret-nodes-bench-"))
    workdir.chmod(0o711)  # the private PostgreSQL runs as nobody under root
    port = free_port()
    procs = start_brokers(mode, nodes, workdir, port)
    try:
        queues = [f"q{i}" for i in range(args.queues)]
        out: multiprocessing.Queue = multiprocessing.Queue()
        total = args.warmup + args.seconds
        clients = [
            multiprocessing.Process(
                target=client_process,
                args=(port, queues[i :: args.clients], args.window, args.split, args.warmup, args.seconds,
                      out),
            )
            for i in range(args.clients)
        ]
        for client in clients:
            client.start()
        for _ in clients:
            assert out.get(timeout=60)[0] == "ready"
        time.sleep(args.warmup)
        watched = processes_naming(str(workdir))
        before = {pid: cpu_seconds(pid) for pid in watched}
        started = time.monotonic()
        reports = [out.get(timeout=total + 30) for _ in clients]
        marks = [report[1] for report in reports]
        cpu = {name: 0.0 for name in watched.values()}
        for pid, name in watched.items():
            cpu[name] += cpu_seconds(pid) - before[pid]
        for i, report in enumerate(reports):
            cpu[f"client {i}"] = report[2]
        for client in clients:
            client.join()
        delivered = 0.0
        for series in marks:  # delivered in the measured window, per client
            inside = [(t, n) for t, n in series if t >= started]
            if len(inside) >= 2:
                delivered += (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])
        elapsed = time.monotonic() - started
        brokers = sum(value for name, value in cpu.items() if not name.startswith("client"))
        return {
            "mode": mode,
            "nodes": nodes,
            "queues": args.queues,
            "split": args.split,
            "msg_per_s": round(delivered),
            "cpu_percent": {name: round(100 * value / elapsed) for name, value in sorted(cpu.items())},
            "msg_per_broker_cpu_s": round(delivered * elapsed / brokers) if brokers else None,
        }
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(60)
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, action="append", help="node counts to run [1, 2]")
    parser.add_argument("--mode", choices=("nodes", "ceiling"), default="nodes")
    parser.add_argument("--queues", type=int, default=40)
    parser.add_argument("--clients", type=int, default=2, help="load generator processes [2]")
    parser.add_argument("--window", type=int, default=500, help="messages in flight per queue [500]")
    parser.add_argument("--split", action="store_true", help="publishers on connections of their own")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    args = parser.parse_args()
    for nodes in args.nodes or [1, 2]:
        print(json.dumps(run(args.mode, nodes, args)), flush=True)


if __name__ == "__main__":
    main()
