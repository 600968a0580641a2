"""The cost of handing messages from one process to another, in batches (issue 15).

Usage::

    python bench/handoff_bench.py [--messages 200000] [--body 100]

A sender process hands ``--messages`` messages (``--body`` bytes each, plus a 16-byte
header: queue id and seq, as a worker would pass a routed publish to a queue's owner)
to a receiver process that parses every message back out, in batches of 1, 10, 100 and
1000, through each candidate:

- ``socketpair``: a Unix stream socket, length-prefixed messages, one ``sendall`` a
  batch (what asyncio would do with a ``loop.create_unix_connection`` pair);
- ``shm-ring``: a single-producer single-consumer ring in
  ``multiprocessing.shared_memory``, head and tail counters in the segment, and one
  byte on a pipe a batch to wake the receiver (an event loop cannot spin);
- ``mp-pipe``: ``multiprocessing.Pipe``, a pickled list a batch.

Printed: messages per second, and CPU µs per message of the sender and of the receiver
(utime + stime from ``resource``/``/proc``), the figures a design can multiply.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import socket
import struct
import time
from collections.abc import Callable
from multiprocessing import shared_memory

HEADER = struct.Struct(">IQI")  # length of what follows, queue id, seq... (16 bytes with length)
LENGTH = struct.Struct(">I")
RING = 8 * 1024 * 1024  # bytes of the shared ring
COUNTERS = 16  # head (8 bytes) and tail (8 bytes) at the start of the segment


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def frames(count: int, body: bytes) -> list[bytes]:
    return [HEADER.pack(12 + len(body), 7, seq) + body for seq in range(count)]


def take(buffer: bytes) -> tuple[int, bytes]:
    """Read every whole message out of ``buffer`` (its queue id, seq and body, as an
    owner would): how many, and the incomplete rest."""
    offset, seen, size = 0, 0, len(buffer)
    unpack = HEADER.unpack_from
    while size - offset >= 4:
        length = LENGTH.unpack_from(buffer, offset)[0]
        if size - offset - 4 < length:
            break
        unpack(buffer, offset)  # queue id and seq
        _ = buffer[offset + 16 : offset + 4 + length]  # the body
        offset += 4 + length
        seen += 1
    return seen, buffer[offset:]


# -- socketpair ------------------------------------------------------------------------------
def socket_send(sock: socket.socket, messages: list[bytes], batch: int) -> None:
    for start in range(0, len(messages), batch):
        sock.sendall(b"".join(messages[start : start + batch]))
    sock.shutdown(socket.SHUT_WR)


def socket_receive(sock: socket.socket, expected: int) -> int:
    buffer = b""
    seen = 0
    while data := sock.recv(1 << 20):
        count, buffer = take(buffer + data)
        seen += count
    assert seen == expected, (seen, expected)
    return seen


# -- shared-memory ring ----------------------------------------------------------------------
def ring_send(name: str, wake: int, messages: list[bytes], batch: int) -> None:
    segment = shared_memory.SharedMemory(name=name)
    view = segment.buf
    counters = struct.Struct("<QQ")
    head = 0
    for start in range(0, len(messages), batch):
        chunk = b"".join(messages[start : start + batch])
        while True:  # wait for room (the receiver's tail)
            tail = counters.unpack_from(view, 0)[1]
            if RING - (head - tail) >= len(chunk):
                break
            time.sleep(0)
        position = head % RING
        first = min(len(chunk), RING - position)
        view[COUNTERS + position : COUNTERS + position + first] = chunk[:first]
        if first < len(chunk):
            view[COUNTERS : COUNTERS + len(chunk) - first] = chunk[first:]
        head += len(chunk)
        struct.pack_into("<Q", view, 0, head)
        os.write(wake, b"x")
    os.close(wake)
    del view
    segment.close()


def ring_receive(name: str, wake: int, expected: int) -> int:
    segment = shared_memory.SharedMemory(name=name)
    view = segment.buf
    counters = struct.Struct("<QQ")
    tail = 0
    seen = 0
    pending = b""
    while seen < expected:
        os.read(wake, 65536)  # woken per batch (several wake-ups may merge)
        head = counters.unpack_from(view, 0)[0]
        while tail < head:
            position = tail % RING
            available = min(head - tail, RING - position)
            pending += bytes(view[COUNTERS + position : COUNTERS + position + available])
            tail += available
        struct.pack_into("<Q", view, 8, tail)
        count, pending = take(pending)
        seen += count
    del view
    segment.close()
    return seen


# -- multiprocessing.Pipe --------------------------------------------------------------------
def pipe_send(conn, messages: list[bytes], batch: int) -> None:
    for start in range(0, len(messages), batch):
        conn.send(messages[start : start + batch])
    conn.send(None)


def pipe_receive(conn, expected: int) -> int:
    seen = 0
    unpack = HEADER.unpack_from
    while (batch := conn.recv()) is not None:
        for message in batch:
            unpack(message, 0)
            seen += 1
    assert seen == expected
    return seen


# -- harness ---------------------------------------------------------------------------------
def timed(target: Callable[..., object], args: tuple, out) -> None:
    """Run ``target(*args)`` and send back (CPU seconds, end time)."""
    start = cpu()
    target(*args)
    out.send((cpu() - start, time.perf_counter()))


def run(kind: str, count: int, body: bytes, batch: int) -> tuple[float, float, float]:
    """(messages/s, sender µs/msg, receiver µs/msg)."""
    messages = frames(count, body)
    ctx = mp.get_context("fork")
    sender_out, sender_in = ctx.Pipe(duplex=False)
    receiver_out, receiver_in = ctx.Pipe(duplex=False)
    cleanup: list[Callable[[], None]] = []
    if kind == "socketpair":
        a, b = socket.socketpair()
        send_args: tuple = (a, messages, batch)
        receive_args: tuple = (b, count)
        sender, receiver = socket_send, socket_receive
        cleanup += [a.close, b.close]
    elif kind == "shm-ring":
        segment = shared_memory.SharedMemory(create=True, size=COUNTERS + RING)
        segment.buf[:COUNTERS] = bytes(COUNTERS)
        read_end, write_end = os.pipe()
        send_args = (segment.name, write_end, messages, batch)
        receive_args = (segment.name, read_end, count)
        sender, receiver = ring_send, ring_receive
        cleanup += [segment.close, segment.unlink, lambda: os.close(read_end)]
    else:
        left, right = ctx.Pipe()
        send_args = (left, messages, batch)
        receive_args = (right, count)
        sender, receiver = pipe_send, pipe_receive
    receiving = ctx.Process(target=timed, args=(receiver, receive_args, receiver_in))
    receiving.start()
    started = time.perf_counter()
    sending = ctx.Process(target=timed, args=(sender, send_args, sender_in))
    sending.start()
    if kind == "shm-ring":
        os.close(send_args[1])  # the sender's copy keeps the pipe open
    send_cpu, _ = sender_out.recv()
    receive_cpu, ended = receiver_out.recv()
    sending.join()
    receiving.join()
    for step in cleanup:
        step()
    seconds = ended - started
    return count / seconds, send_cpu / count * 1e6, receive_cpu / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--body", type=int, default=100)
    parser.add_argument("--kinds", default="socketpair,shm-ring,mp-pipe")
    args = parser.parse_args()
    body = b"x" * args.body
    print(f"{args.messages} messages of {args.body} B (+16 B header); CPU per message of each side")
    print(f"{'mechanism':12} {'batch':>6} {'msg/s':>11} {'sender µs':>10} {'receiver µs':>12} "
          f"{'total µs':>9}")  # fmt: skip
    for kind in args.kinds.split(","):
        for batch in (1, 10, 100, 1000):
            count = args.messages if batch > 1 else args.messages // 4
            rate, send_us, receive_us = run(kind, count, body, batch)
            total = send_us + receive_us
            line = f"{kind:12} {batch:6} {rate:11,.0f} {send_us:10.2f} {receive_us:12.2f} {total:9.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
