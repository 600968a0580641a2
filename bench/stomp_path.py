"""The STOMP publish → deliver → ACK path in one process without sockets (tests/sans_io.py's
fake loop and transport), per message: a producer's SENDs of 100 B (one read of
``--batch`` frames, stomp.py's headers), MESSAGE frames to a ``client-individual``
subscriber of the same queue (prefetch 2 × batch), and one ACK per MESSAGE in one read.

    PYTHONPATH=src python bench/stomp_path.py                  # µs of CPU per message
    PYTHONPATH=src python bench/stomp_path.py --instructions   # callgrind instructions per message
    LEVERET_PURE_PYTHON=1 PYTHONPATH=src python bench/stomp_path.py ...   # the pure codec

CPU time is the minimum over ``--repeat`` runs (the machine's load only adds to it);
instructions are counted by valgrind's callgrind at two round counts and the difference
divided by the messages between them, so start-up and imports cancel out (the same count
whatever else the machine does).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROUNDS = (2, 7)  # the two round counts whose difference --instructions measures


class StompPath:
    """A producer and a consumer StompConnection on one core, both connected."""

    def __init__(self, batch: int) -> None:
        sys.path.insert(0, str(HERE.parent / "tests"))
        from sans_io import FakeLoop, FakeTransport

        from leveret.core.broker import BrokerCore
        from leveret.protocol.stomp import StompConnection

        self.loop = FakeLoop()
        self.core = BrokerCore(self.loop)
        self.batch = batch

        def connect(name: str) -> tuple[StompConnection, FakeTransport]:
            transport = FakeTransport()
            connection = StompConnection(self.core, transport, self.core.clock, lambda c: None, name)
            connection.data_received(b"CONNECT\naccept-version:1.2\nlogin:guest\npasscode:guest\n\n\x00")
            connection.flush()
            assert transport.output.startswith(b"CONNECTED\n")
            transport.output.clear()
            return connection, transport

        self.producer, self.producer_out = connect("127.0.0.1:5001")
        self.consumer, self.consumer_out = connect("127.0.0.1:5002")
        self.consumer.data_received(
            b"SUBSCRIBE\ndestination:/queue/bench\nid:1\nack:client-individual\n"
            b"activemq.prefetchSize:%d\n\n\x00" % (2 * batch)
        )
        self.turn()
        send = (
            b"SEND\ncontent-length:100\ncontent-type:text/plain\ndestination:/queue/bench\n\n"
            + b"x" * 100
            + b"\x00"
        )
        self.sends = send * batch

    def turn(self) -> None:
        self.loop.advance(0)
        self.producer.flush()
        self.consumer.flush()

    def round(self) -> None:
        """``batch`` messages through: SENDs, MESSAGEs, ACKs."""
        self.producer.data_received(self.sends)
        self.turn()
        ids = re.findall(rb"\nack:(\d+)\n", self.consumer_out.output)
        assert len(ids) == self.batch, len(ids)
        self.consumer_out.output.clear()
        self.consumer.data_received(b"".join(b"ACK\nid:%s\n\n\x00" % number for number in ids))
        self.turn()
        self.producer_out.output.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1000, help="messages per round (default 1000)")
    parser.add_argument("--rounds", type=int, default=20, help="rounds per run (default 20)")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the minimum is shown (default 5)")
    parser.add_argument("--instructions", action="store_true", help="count instructions with callgrind")
    parser.add_argument("--run", type=int, help=argparse.SUPPRESS)  # one run of N rounds (under callgrind)
    args = parser.parse_args()
    from leveret import compiled

    if args.run is not None:
        path = StompPath(args.batch)
        for _ in range(args.run):
            path.round()
        return
    path = StompPath(args.batch)
    path.round()  # warm: the caches, the queue's first allocations
    codec = "compiled" if compiled.status().get("leveret.protocol.stomp._cframes") else "pure"
    if not args.instructions:
        best = float("inf")
        for _ in range(args.repeat):
            started = time.process_time()
            for _ in range(args.rounds):
                path.round()
            best = min(best, time.process_time() - started)
        print(
            f"{codec} codec: {best / (args.rounds * args.batch) * 1e6:.2f} µs CPU per message "
            f"(min of {args.repeat} runs of {args.rounds} × {args.batch})"
        )
        return
    counts = []
    for rounds in ROUNDS:
        out = f"/tmp/stomp_path.callgrind.{os.getpid()}"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--batch",
                str(args.batch),
                "--run",
                str(rounds),
            ],
            check=True,
            capture_output=True,
            env=os.environ,
        )
        with open(out) as summary:
            counts.append(int(re.search(r"^summary: (\d+)", summary.read(), re.M).group(1)))
        os.unlink(out)
    per_message = (counts[1] - counts[0]) / ((ROUNDS[1] - ROUNDS[0]) * args.batch)
    print(f"{codec} codec: {per_message:,.0f} instructions per message (callgrind, rounds {ROUNDS})")


if __name__ == "__main__":
    main()
