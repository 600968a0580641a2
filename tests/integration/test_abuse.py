"""Abuse, bounded in count and time, on 127.0.0.1 only: a million fuzzed frames over
many connections, and ten thousand connections held open, against ``leveret server``.
The broker must not crash or log an internal error, and a well-behaved client beside
them must keep getting its confirms in good time."""

from __future__ import annotations

import asyncio
import random
import struct
import threading
import time
from pathlib import Path

import pika
import pytest
from pamqp import commands
from sans_io import method_frame
from servers import ServerProcess

from leveret.amqp.frames import PROTOCOL_HEADER

HANDSHAKE = (method_frame(0, commands.Connection.StartOk(mechanism="PLAIN", response="\x00guest\x00guest",
                                                          locale="en_US"))
             + method_frame(0, commands.Connection.TuneOk(channel_max=0, frame_max=0, heartbeat=0))
             + method_frame(0, commands.Connection.Open(virtual_host="/")))
VALID = [method_frame(1, commands.Channel.Open()), method_frame(1, commands.Queue.Declare(queue="fuzz")),
         method_frame(1, commands.Basic.Publish(exchange="", routing_key="fuzz")),
         method_frame(1, commands.Basic.Ack(delivery_tag=7)),
         method_frame(2, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))]


def fuzzed_frames(rng: random.Random, count: int) -> bytes:
    """``count`` frames: well-formed ones with random type, channel and payload, valid
    methods, truncated and corrupted copies of those, and plain noise."""
    out = []
    for _ in range(count):
        kind = rng.randrange(5)
        if kind == 0:
            payload = rng.randbytes(rng.randint(0, 40))
            out.append(struct.pack(">BHI", rng.choice((1, 2, 3, 8, rng.randint(0, 255))), rng.randint(0, 4),
                                   len(payload)) + payload + b"\xce")
        elif kind == 1:
            out.append(rng.choice(VALID))
        elif kind == 2:
            frame = bytearray(rng.choice(VALID))
            frame[rng.randrange(len(frame))] = rng.randrange(256)
            out.append(bytes(frame))
        elif kind == 3:
            frame = rng.choice(VALID)
            out.append(frame[: rng.randrange(1, len(frame))])
        else:
            out.append(rng.randbytes(rng.randint(1, 30)))
    return b"".join(out)


class Bystander(threading.Thread):
    """A well-behaved publisher with confirms; ``worst`` is its slowest confirm (s)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.worst, self.confirmed = url, 0.0, 0
        self.stop, self.error = threading.Event(), None

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self.url))
            channel = connection.channel()
            channel.queue_declare("steady")
            channel.confirm_delivery()
            while not self.stop.is_set():
                started = time.monotonic()
                channel.basic_publish("", "steady", b"steady")
                self.worst = max(self.worst, time.monotonic() - started)
                self.confirmed += 1
                time.sleep(0.01)
            connection.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


async def fuzz_connection(port: int, seed: int, frames: int) -> int:
    rng = random.Random(seed)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(PROTOCOL_HEADER + (HANDSHAKE if rng.random() < 0.8 else b"")
                     + fuzzed_frames(rng, frames))
        await writer.drain()
        # Read the broker's answers for a moment, then hang up (a broker waits 3 s for
        # the close-ok a fuzzer never sends).
        while await asyncio.wait_for(reader.read(65536), 0.3):
            pass
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()
    return frames


def assert_healthy(server: ServerProcess, bystander: Bystander) -> None:
    bystander.stop.set()
    bystander.join(30)
    assert bystander.error is None and bystander.confirmed > 0
    assert bystander.worst < 2.0, f"a confirm took {bystander.worst:.2f} s"
    assert server.proc.poll() is None
    log = server.log_path.read_text()
    assert "internal error" not in log and "Traceback" not in log


@pytest.fixture
def server(tmp_path: Path):
    process = ServerProcess(tmp_path / "data")
    yield process
    process.kill()


def test_a_million_fuzzed_frames_crash_nothing_and_disturb_no_one(server):
    bystander = Bystander(server.url)
    bystander.start()

    async def flood() -> int:
        sent = 0
        for wave in range(10):  # 10 waves of 50 connections of 2,000 frames
            counts = await asyncio.gather(
                *(fuzz_connection(server.port, wave * 50 + i, 2000) for i in range(50)))
            sent += sum(counts)
        return sent

    started = time.monotonic()
    assert asyncio.run(flood()) == 1_000_000
    assert time.monotonic() - started < 300
    assert_healthy(server, bystander)


def test_ten_thousand_connections_are_held_and_others_still_served(server):
    bystander = Bystander(server.url)
    bystander.start()

    async def hold() -> int:
        async def one() -> asyncio.StreamWriter:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(PROTOCOL_HEADER)
            head = await reader.readexactly(7)  # connection.start
            await reader.readexactly(struct.unpack(">I", head[3:7])[0] + 1)
            writer.write(HANDSHAKE)
            head = await reader.readexactly(7)  # connection.tune
            await reader.readexactly(struct.unpack(">I", head[3:7])[0] + 1)
            head = await reader.readexactly(7)  # connection.open-ok
            body = await reader.readexactly(struct.unpack(">I", head[3:7])[0] + 1)
            assert body[:4] == b"\x00\x0a\x00\x29"
            return writer

        writers = []
        for _ in range(20):  # 20 waves of 500
            writers += await asyncio.gather(*(one() for _ in range(500)))
        held = len(writers)
        await asyncio.sleep(2)  # all held at once, while the bystander publishes
        for writer in writers:
            writer.close()
        return held

    assert asyncio.run(hold()) == 10_000
    assert_healthy(server, bystander)
