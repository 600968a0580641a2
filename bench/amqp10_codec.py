"""Micro-benchmark of the AMQP 1.0 codec (pure Python, ``leveret.protocol.amqp10``) beside
python-qpid-proton's C codec (``proton.Data``, when installed), to decide where the
issue's "proton.Data where a profile shows it pays" applies: microseconds per call of

- ``transfer-frame``: FrameReader.feed of one transfer frame (a transfer performative
  and a 100-byte message: header, properties, application-properties, data);
- ``transfer-encode``: encode_frame of the same transfer and payload;
- ``sections-decode``: decode_all of the message's sections (the per-message decode a
  broker does to route on properties); proton: Data.decode of the same bytes, and
  get_object of each section;
- ``sections-encode``: the sections from Python values; proton: put_object and encode.

    PYTHONPATH=src python bench/amqp10_codec.py [--repeat 7]

Each figure is the minimum over ``--repeat`` runs of ``timeit`` (load only adds time).
"""

from __future__ import annotations

import argparse
import timeit
from typing import Any

from leveret.protocol.amqp10 import frames as f, performatives as p, types as t

SECTIONS = [
    p.Header(durable=True),
    p.Properties(message_id="id-1", to="/queues/bench", content_type="text/plain", creation_time=1764230400),
    p.ApplicationProperties({"k": "v", "n": 1}),
    p.Data(b"x" * 100),
]
DESCRIBED = [p.to_described(section) for section in SECTIONS]
MESSAGE = b"".join(t.encode(section) for section in DESCRIBED)
TRANSFER = p.Transfer(0, 7, b"\x00\x00\x00\x07", 0, False)
FRAME = f.encode_frame(TRANSFER, 1, MESSAGE)


def per_call_us(func: Any, number: int, repeat: int) -> float:
    """Minimum over ``repeat`` runs of ``number`` calls, in µs per call."""
    return min(timeit.repeat(func, number=number, repeat=repeat)) / number * 1e6


def leveret(repeat: int) -> dict[str, float]:
    reader = f.FrameReader(max_frame_size=65536)
    reader.feed(f.AMQP_HEADER)
    return {
        "transfer-frame": per_call_us(lambda: reader.feed(FRAME), 2000, repeat),
        "transfer-encode": per_call_us(lambda: f.encode_frame(TRANSFER, 1, MESSAGE), 2000, repeat),
        "sections-decode": per_call_us(lambda: t.decode_all(MESSAGE), 2000, repeat),
        "sections-encode": per_call_us(lambda: b"".join(t.encode(s) for s in DESCRIBED), 2000, repeat),
    }


def proton_figures(repeat: int) -> dict[str, float]:
    try:
        import proton
    except ImportError:
        return {}

    def to_proton(value: Any) -> Any:
        if isinstance(value, t.Described):
            return proton.Described(proton.ulong(value.descriptor), to_proton(value.value))
        if isinstance(value, list):
            return [to_proton(item) for item in value]
        if isinstance(value, dict):
            return {to_proton(key): to_proton(item) for key, item in value.items()}
        if isinstance(value, t.Timestamp):
            return proton.timestamp(value)
        if isinstance(value, t.Symbol):
            return proton.symbol(value)
        return value

    objects = [to_proton(section) for section in DESCRIBED]

    def decode() -> list[Any]:
        data = proton.Data()
        data.decode(MESSAGE)
        data.rewind()
        out = []
        while data.next():
            out.append(data.get_object())
        return out

    def encode() -> bytes:
        data = proton.Data()
        for item in objects:
            data.put_object(item)
        return bytes(data.encode())

    return {
        "sections-decode": per_call_us(decode, 2000, repeat),
        "sections-encode": per_call_us(encode, 2000, repeat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    ours, theirs = leveret(args.repeat), proton_figures(args.repeat)
    print(f"message {len(MESSAGE)} B, frame {len(FRAME)} B; µs per call")
    print(f"{'':18} {'leveret':>9} {'proton.Data':>12}")
    for name, value in ours.items():
        other = f"{theirs[name]:12.1f}" if name in theirs else f"{'-':>12}"
        print(f"{name:18} {value:9.1f} {other}")


if __name__ == "__main__":
    main()
