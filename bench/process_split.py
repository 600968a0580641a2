"""CPU per message of each process of ``leveret server --workers N``: the core and each
connection worker, from /proc (utime + stime), for bench/workloads.py workloads.

Usage::

    PYTHONPATH=$PWD/src:$PWD/bench python bench/process_split.py --workers 1 --rounds 3

Each round runs the single process (``--workers 0``) and then ``--workers N`` on the
same workloads, so the machine's drift between minutes hits both alike; printed per run:
msg/s and µs CPU per message of the core and of each worker (the largest row count of a
workload is its message count: fanout counts deliveries).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from brokers import Leveret  # noqa: E402
from loadgen import new_event_loop  # noqa: E402
from workloads import WORKLOADS, Meter, Settings  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (fields 14 and 15 of /proc/PID/stat), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (a broker's connection workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return sorted(found)


def run(workers: int, workloads: list[str], settings: Settings) -> None:
    broker = Leveret(extra_args=["--workers", str(workers)] if workers else None)
    broker.start()
    try:
        processes = [broker.pid, *children(broker.pid)]
        for workload in workloads:
            before = [cpu_seconds(pid) for pid in processes]
            loop = new_event_loop()
            try:
                rows = loop.run_until_complete(WORKLOADS[workload](broker, settings, Meter(broker)))
            finally:
                loop.close()
            after = [cpu_seconds(pid) for pid in processes]
            messages = max(row.messages for row in rows)
            rate = max(row.rate for row in rows)
            per = [(a - b) / messages * 1e6 for a, b in zip(after, before)]
            workers_text = " ".join(f"{us:5.1f}" for us in per[1:]) or "-"
            print(
                f"workers={workers} {workload:8} {rate:9,.0f} msg/s  core {per[0]:5.1f} µs/msg  "
                f"workers {workers_text} µs/msg",
                flush=True,
            )
            time.sleep(1)
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workloads", default="publish,pubsub,fanout")
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args()
    settings = Settings(messages=args.messages, seconds=10)
    workloads = args.workloads.split(",")
    for _ in range(args.rounds):
        run(0, workloads, settings)
        run(args.workers, workloads, settings)


if __name__ == "__main__":
    main()
