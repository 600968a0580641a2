"""Consumer timeouts at scale, without sockets (tests/sans_io.py's Harness on its fake
clock): CHANNELS channels on one connection, each with one consumer holding one
delivery, then the clock moved past RabbitMQ's default 30 minutes.

Prints the timers armed (one per channel with a delivery outstanding: a channel is
never scanned on a tick), the process CPU seconds (from /proc, via
``time.process_time``) spent delivering, and spent noticing every timeout and closing
every channel with its 406. Usage::

    PYTHONPATH=src:tests python3 bench/consumer_timeout_probe.py [--channels 2000]
"""

from __future__ import annotations

import argparse
import gc
import logging
import time

from pamqp import commands, frame as pamqp_frame, header as pamqp_header
from sans_io import Harness, method_frame

from leveret.amqp.frames import FRAME_BODY, encode_frame


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--channels", type=int, default=2000)
    count = parser.parse_args().channels
    logging.disable(logging.WARNING)  # one warning per timed-out channel, as RabbitMQ
    h = Harness()
    h.feed(b"AMQP\x00\x00\x09\x01")
    h.feed(
        pamqp_frame.marshal(
            commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest", locale="en_US"), 0
        )
    )
    h.feed(
        pamqp_frame.marshal(
            commands.Connection.TuneOk(channel_max=count + 1, frame_max=131072, heartbeat=0), 0
        )
    )
    h.feed(pamqp_frame.marshal(commands.Connection.Open(virtual_host="/"), 0))
    h.feed(method_frame(1, commands.Channel.Open()))
    for n in range(2, count + 2):  # a queue per channel: what is measured is the timeouts
        h.feed(
            method_frame(n, commands.Channel.Open())
            + method_frame(n, commands.Queue.Declare(queue=f"q{n}"))
            + method_frame(n, commands.Basic.Consume(queue=f"q{n}", consumer_tag=f"c{n}"))
        )
    header = encode_frame(2, 1, pamqp_header.ContentHeader(body_size=1).marshal())
    body = encode_frame(FRAME_BODY, 1, b"x")
    publishes = b"".join(
        method_frame(1, commands.Basic.Publish(exchange="", routing_key=f"q{n}")) + header + body
        for n in range(2, count + 2)
    )
    h.transport.output.clear()
    gc.collect()
    gc.freeze()  # the set-up's objects: a full collection over them is not the timeouts' cost
    cpu = time.process_time()
    h.connection.data_received(publishes, whole=True)
    h.flush()
    delivered = time.process_time() - cpu
    timers = len(h.loop.pending())
    h.transport.output.clear()
    cpu = time.process_time()
    h.loop.advance(31 * 60)
    h.flush()
    fired = time.process_time() - cpu
    closes = sum(1 for _, m in h.frames() if isinstance(m, commands.Channel.Close))
    print(
        f"{count} channels: {timers} timers armed; delivering {delivered:.3f} s CPU; "
        f"31 min later {closes} channels closed with 406 in {fired:.3f} s CPU "
        f"({fired / max(closes, 1) * 1e6:.0f} us each)"
    )


if __name__ == "__main__":
    main()
