"""Micro-benchmark of the AMQP 1.0 message format (``protocol/amqp10/message.py``):
microseconds per call, for 100-byte and 4 KB bodies, of

- ``decode_transfer``: a proton sender's payload (header, properties, one data
  section) to a core message, as the broker does for every transfer it receives;
- ``encode_transfer``: that message to a receiver's payload (header rewritten,
  message-annotations added, the rest as received);
- ``encode_transfer(0-9-1)``: an AMQP 0-9-1 message to an AMQP 1.0 receiver
  (sections built once, then cached on the message);
- beside them, for scale: ``proton.Message.decode`` / ``encode`` of the same payload
  (python-qpid-proton's C codec and Python layer), and AMQP 0-9-1's own per-message
  work in leveret (``from_publish`` of a content header, ``content_header``).

    PYTHONPATH=src python bench/amqp10_message.py [--repeat 7]

Each figure is the minimum over ``--repeat`` runs of ``timeit`` (load only adds time).
"""

from __future__ import annotations

import argparse
import timeit
from typing import Any

from leveret.amqp import properties as wire
from leveret.protocol.amqp.message import content_header, from_publish
from leveret.protocol.amqp10.message import decode_transfer, encode_transfer


def per_call_us(func: Any, number: int, repeat: int) -> float:
    """Minimum over ``repeat`` runs of ``number`` calls, in µs per call."""
    return min(timeit.repeat(func, number=number, repeat=repeat)) / number * 1e6


def cases(size: int) -> dict[str, Any]:
    """The calls to time for a body of ``size`` bytes."""
    try:
        from proton import Message as ProtonMessage
    except ImportError:  # pragma: no cover - proton is a test dependency
        ProtonMessage = None
    body = b"x" * size
    if ProtonMessage is not None:
        sent = ProtonMessage(body=body, inferred=True, durable=True, address="/queues/bench")
        payload = sent.encode()
    else:  # the same sections, hand-made
        payload = b"\x00Sp\xc0\x02\x01A\x00Ss\xc0\x10\x03@@\xa1\r/queues/bench\x00Su\xb0" + (
            size.to_bytes(4, "big") + body
        )
    message = decode_transfer(payload, "", "bench")
    assert message.body == body
    header = wire.encode(wire.Properties(delivery_mode=2), size)
    amqp = from_publish("", "bench", header, body)
    converted = from_publish("", "bench", header, body)
    encode_transfer(converted, 0, True, None)  # renders once, cached
    out: dict[str, Any] = {
        "decode_transfer": lambda: decode_transfer(payload, "", "bench"),
        "encode_transfer": lambda: encode_transfer(message, 0, True, None),
        "encode_transfer (0-9-1 message)": lambda: encode_transfer(converted, 0, True, None),
        "0-9-1 from_publish": lambda: from_publish("", "bench", header, body),
        "0-9-1 content_header": lambda: content_header(amqp),
    }
    if ProtonMessage is not None:
        received = ProtonMessage()
        out["proton Message.decode"] = lambda: received.decode(payload)
        out["proton Message.encode"] = lambda: sent.encode()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=20_000)
    args = parser.parse_args()
    print(f"{'operation':34} {'100 B':>9} {'4 KB':>9}  (µs per call)")
    rows: dict[str, list[float]] = {}
    for size in (100, 4096):
        for name, func in cases(size).items():
            rows.setdefault(name, []).append(per_call_us(func, args.number, args.repeat))
    for name, figures in rows.items():
        print(f"{name:34} {figures[0]:9.2f} {figures[1]:9.2f}")


if __name__ == "__main__":
    main()
