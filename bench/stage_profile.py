"""Where a message's CPU goes in leveret, by stage (issue 15).

Usage::

    PYTHONPATH=$PWD/src:$PWD/bench python bench/stage_profile.py [--messages 300000]

Runs ``leveret server`` (bench/brokers.py) and, for each workload of bench/workloads.py
named by ``--workloads`` (default ``pubsub``: publish → route → deliver → ack, and
``confirm-100b``: the same with the store), samples the broker with py-spy (``record
--format raw``, 250 Hz, idle threads left out) while the workload runs. Each sample is
put in the stage of its innermost leveret frame (:data:`RULES`): socket read, frame
parse, channel (publish/ack bookkeeping), route, enqueue/dispatch, deliver encode,
socket write, store, other core; a sample with no leveret frame is the event loop
itself (uvloop's C code: the system calls of reading and writing, callbacks). Printed:
each stage's share of the samples and its CPU µs per message (the share of the broker's
measured CPU per message, utime+stime from /proc).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from brokers import Leveret  # noqa: E402
from loadgen import new_event_loop  # noqa: E402
from workloads import WORKLOADS, Meter, Settings  # noqa: E402

ENCODERS = frozenset({"encode_deliver", "encode_frame", "encode_content", "encode_method"})
#: (path fragment, function names or None for any, stage): the first rule that matches
#: the innermost leveret frame of a sample names its stage.
RULES: list[tuple[str, frozenset[str] | None, str]] = [
    ("leveret/store/", None, "store"),
    ("leveret/protocol/output.py", frozenset({"flush"}), "socket write"),
    ("leveret/protocol/output.py", None, "deliver encode"),
    ("leveret/server/listener.py", frozenset({"_flush", "write", "writelines"}), "socket write"),
    ("leveret/protocol/amqp/connection.py", frozenset({"_flushing", "send_method"}), "socket write"),
    ("leveret/server/", None, "socket read"),
    ("leveret/amqp/frames.py", ENCODERS, "deliver encode"),
    ("leveret/protocol/amqp/consumer.py", None, "deliver encode"),
    ("leveret/amqp/", None, "frame parse"),
    ("leveret/protocol/amqp/connection.py", None, "frame parse"),
    ("leveret/protocol/amqp/channel.py", None, "channel (publish/ack bookkeeping)"),
    ("leveret/protocol/amqp/message.py", None, "deliver encode"),
    ("leveret/core/exchange.py", None, "route"),
    ("leveret/core/topic.py", None, "route"),
    ("leveret/core/publish.py", None, "route"),
    ("leveret/core/queues/", None, "enqueue/dispatch"),
    ("leveret/core/", None, "core other"),
    ("leveret/", None, "other leveret"),
]
#: frames around the event loop itself, not a stage
OUTER = ("leveret/cli/server.py", "leveret/__main__.py", "leveret/server/broker.py")
LOOP = "event loop (uvloop C: read/write syscalls, callbacks)"


def stage_of(stack: str) -> str:
    """The stage of one collapsed py-spy stack (``frame;frame;...``, outermost first;
    a frame reads ``function (path:line)``)."""
    for frame in reversed(stack.split(";")):
        if "leveret/" not in frame or "bench/" in frame or any(top in frame for top in OUTER):
            continue
        function, _, where = frame.partition(" (")
        for fragment, functions, stage in RULES:
            name = function.strip().rsplit(".", 1)[-1]  # py-spy writes Class.method
            if fragment in where and (functions is None or name in functions):
                return stage
    return LOOP


def profile(
    broker: Leveret, workload: str, settings: Settings, rate: int, keep: str | None = None
) -> tuple[dict[str, int], float]:
    """Samples per stage while ``workload`` runs, and the broker's CPU µs per message."""
    out = Path(tempfile.mkdtemp(prefix="leveret-stages-")) / "raw.txt"
    spy = subprocess.Popen(
        ["py-spy", "record", "--pid", str(broker.pid), "--format", "raw", "--rate", str(rate),
         "--nonblocking", "--output", str(out), "--duration", "600"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)  # py-spy attached
    loop = new_event_loop()
    meter = Meter(broker)
    try:
        rows = loop.run_until_complete(WORKLOADS[workload](broker, settings, meter))
    finally:
        loop.close()
        spy.send_signal(2)  # SIGINT: py-spy writes what it has
        spy.wait(60)
    messages = max(row.messages for row in rows)
    counts: collections.Counter[str] = collections.Counter()
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[stage_of(stack)] += int(count)
    if keep is not None:
        shutil.copy(out, Path(keep) / f"{workload}.raw.txt")
    shutil.rmtree(out.parent, ignore_errors=True)
    return dict(counts), meter.broker_cpu / messages * 1e6 if messages else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--workloads", default="pubsub,confirm-100b")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--keep", default=None, help="a directory to keep py-spy's raw stacks in")
    parser.add_argument("--workers", type=int, default=0,
                        help="run leveret with --workers N (the core process is profiled)")
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    settings = Settings(messages=args.messages, seconds=args.seconds)
    broker = Leveret(extra_args=["--workers", str(args.workers)] if args.workers else None)
    broker.start()
    try:
        for workload in args.workloads.split(","):
            counts, cpu_us = profile(broker, workload, settings, args.rate, args.keep)
            total = sum(counts.values()) or 1
            print(f"\n{workload}: broker {cpu_us:.2f} µs CPU per message, {total} samples")
            for stage, count in sorted(counts.items(), key=lambda item: -item[1]):
                share = count / total
                print(f"  {stage:52} {100 * share:5.1f}%  {share * cpu_us:6.2f} µs/msg")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
