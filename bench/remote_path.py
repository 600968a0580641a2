"""The core's CPU per message with and without connection workers, in one process and
without sockets: what ``--workers`` takes off the core, free of scheduling noise.

Usage::

    PYTHONPATH=$PWD/src:$PWD/bench:$PWD/tests python bench/remote_path.py

A real BrokerCore (tests/sans_io.py's Harness) with one consumer (prefetch 2000) gets
1000 publishes of 100 B, then 10 acks (multiple, every 100), 100 times over: once as
bytes into a :class:`~leveret.protocol.amqp.Connection` (the single process: parse,
route, deliver, encode), once as a worker hands them to a
:class:`~leveret.protocol.amqp.remote.RemoteConnection` (marshalled frames and parsed
publishes in, deliveries marshalled out). Prints µs of CPU per message for each, three
times alternately.
"""

from __future__ import annotations

import marshal
import time

from pamqp import commands
from sans_io import Harness, method_frame

from leveret.amqp.frames import FrameReader, encode_publish
from leveret.amqp.handoff import parse_publishes
from leveret.protocol.amqp.remote import RemoteConnection

BATCH = 1000  # publishes per read
ROUNDS = 100


def harness(remote: bool) -> Harness:
    h = Harness()
    if remote:
        h.connection = RemoteConnection(h.core, h.transport, h.loop, h.pending.add, "worker:1", True)
        h.transport.set_frame_max = lambda frame_max: None

        def write_items(items: list) -> None:  # the link's cost: the batch is marshalled
            marshal.dumps(items)
            h.transport.output += b"".join(item for item in items if type(item) is bytes)

        h.transport.write_items = write_items
    h.handshake()
    h.feed(method_frame(1, commands.Queue.Declare(queue="bench")))
    h.feed(method_frame(1, commands.Basic.Qos(prefetch_count=2 * BATCH)))
    h.feed(method_frame(1, commands.Basic.Consume(queue="bench", consumer_tag="c")))
    return h


def measure(remote: bool) -> float:
    """µs of CPU per message (publish, deliver, ack)."""
    h = harness(remote)
    publishes = encode_publish(1, "", "bench", b"x" * 100, {}, 4096) * BATCH
    acks = [
        method_frame(1, commands.Basic.Ack(delivery_tag=tag, multiple=True)) for tag in range(100, 10**6, 100)
    ]
    handed = marshal.dumps(parse_publishes(FrameReader(1 << 20).feed(publishes)))
    handed_acks = [marshal.dumps(FrameReader(1 << 20).feed(ack)) for ack in acks[: ROUNDS * BATCH // 100]]
    connection, ack = h.connection, 0
    started = time.process_time()
    for _ in range(ROUNDS):
        if remote:
            connection._run_frames(marshal.loads(handed), True)
        else:
            connection.data_received(publishes, whole=True)
        for pending in list(h.pending):
            pending.flush()
        h.pending.clear()
        h.transport.output.clear()
        for _ in range(BATCH // 100):
            if remote:
                connection._run_frames(marshal.loads(handed_acks[ack]), True)
            else:
                connection.data_received(acks[ack], whole=True)
            ack += 1
    elapsed = time.process_time() - started
    assert h.core.vhosts["/"].queues["bench"].message_count == 0
    return elapsed / (ROUNDS * BATCH) * 1e6


def main() -> None:
    for _ in range(3):
        single, remote = measure(False), measure(True)
        ratio = remote / single
        print(f"single process {single:5.2f} µs/msg, core with workers {remote:5.2f} µs/msg ({ratio:.2f}×)")


if __name__ == "__main__":
    main()
