"""Micro-benchmark of the STOMP frame codec, the pure twin (``frames.py``) beside the
compiled one (``_cframes.pyx``, when built): microseconds per ``FrameParser.feed`` of a
read of 500 SEND frames (100-byte bodies, the headers stomp.py sends; the head cache
warm) and of 500 ACK frames (ids differ: every head is new), and per ``message_head``
(a MESSAGE to a client-individual subscriber of a queue: the per-delivery encoding).

    PYTHONPATH=src python bench/stomp_codec.py [--repeat 7]

Each figure is the minimum over ``--repeat`` runs of ``timeit`` (the machine's load only
ever adds time).
"""

from __future__ import annotations

import argparse
import importlib
import timeit
from typing import Any

from leveret.protocol.stomp import frames

BODY = b"x" * 100
SEND = (
    b"SEND\ndestination:/queue/bench\ncontent-type:text/plain\ncontent-length:100\n"
    b"persistent:false\n\n" + BODY + b"\x00"
)
ACKS = b"".join(b"ACK\nid:%d\n\n\x00" % (1000 + i) for i in range(500))
START = "MESSAGE\ndestination:/queue/bench\nsubscription:1\n"
BLOCK = (
    b"message-id:ID\\cleveret-1\\c1\\c12345\npriority:4\nexpires:0\ntimestamp:1764230400000\n"
    b"content-type:text/plain\n"
)


def per_call_us(func: Any, number: int, repeat: int) -> float:
    """Minimum over ``repeat`` runs of ``number`` calls, in µs per call."""
    return min(timeit.repeat(func, number=number, repeat=repeat)) / number * 1e6


def measure(codec: Any, repeat: int) -> dict[str, float]:
    sends = SEND * 500
    parser = codec.FrameParser()
    parser.feed(SEND)  # the head cache warm, as on a producer's connection
    assert len(parser.feed(sends)) == 500
    acks = codec.FrameParser()
    assert len(acks.feed(ACKS)) == 500
    head = codec.message_head
    return {
        "feed(500 SEND frames)": per_call_us(lambda: parser.feed(sends), 20, repeat),
        "feed(500 ACK frames)": per_call_us(lambda: acks.feed(ACKS), 20, repeat),
        "message_head(MESSAGE, 1 delivery)": per_call_us(
            lambda: head(START, 12345, False, (), 100, BLOCK), 20000, repeat
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs per figure; the minimum is shown")
    args = parser.parse_args()
    pure = argparse.Namespace(FrameParser=frames.PyFrameParser, message_head=frames.py_message_head)
    results = {"pure": measure(pure, args.repeat)}
    try:
        results["compiled"] = measure(importlib.import_module("leveret.protocol.stomp._cframes"), args.repeat)
    except ImportError as exc:
        print(f"compiled twin not built ({exc}): pure figures only")
    print(f"{'µs per call (min of ' + str(args.repeat) + ')':40} {'pure':>10} {'compiled':>10} {'ratio':>7}")
    for name, pure_us in results["pure"].items():
        compiled_us = results.get("compiled", {}).get(name)
        if compiled_us is None:
            print(f"{name:40} {pure_us:10.2f}")
        else:
            print(f"{name:40} {pure_us:10.2f} {compiled_us:10.2f} {pure_us / compiled_us:6.1f}x")


if __name__ == "__main__":
    main()
