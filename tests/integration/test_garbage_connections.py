"""A real broker hit with garbage on many sockets: every other client carries on."""

from __future__ import annotations

import random
import socket
import time

import pika
from pamqp import commands
from sans_io import method_frame

from leveret.amqp.frames import PROTOCOL_HEADER, encode_frame


def garbage_payloads(count: int, seed: int = 20240501) -> list[bytes]:
    rng = random.Random(seed)
    valid_start = (PROTOCOL_HEADER + method_frame(0, commands.Connection.StartOk(
        mechanism="PLAIN", response="\x00guest\x00guest", locale="en_US")))
    payloads = []
    for i in range(count):
        noise = rng.randbytes(rng.randint(0, 300))
        kind = i % 4
        if kind == 0:
            payloads.append(noise)
        elif kind == 1:
            payloads.append(PROTOCOL_HEADER + noise)
        elif kind == 2:
            payloads.append(valid_start + noise)
        else:
            payloads.append(valid_start
                            + method_frame(0, commands.Connection.TuneOk(channel_max=0, frame_max=0,
                                                                         heartbeat=0))
                            + method_frame(0, commands.Connection.Open(virtual_host="/"))
                            + encode_frame(rng.randint(0, 9), rng.randint(0, 3), noise))
    return payloads


def test_broker_survives_garbage_connections(leveret_broker):
    url = leveret_broker.amqp_url
    bystander = pika.BlockingConnection(pika.URLParameters(url))
    channel = bystander.channel()
    channel.queue_declare("steady")
    channel.confirm_delivery()
    for i, payload in enumerate(garbage_payloads(200)):
        with socket.create_connection(("127.0.0.1", leveret_broker.amqp_port), timeout=2) as sock:
            sock.sendall(payload)
            if i % 10 == 0:  # now and then, wait for the broker's answer
                try:
                    while sock.recv(65536):
                        pass
                except (TimeoutError, ConnectionResetError):
                    pass
        if i % 50 == 0:
            channel.basic_publish("", "steady", b"%d" % i)
    # the bystander kept working all along, and a new client works too
    assert channel.queue_declare("steady", passive=True).method.message_count == 4
    client = pika.BlockingConnection(pika.URLParameters(url))
    fresh = client.channel()
    fresh.basic_publish("", "steady", b"fresh")
    deadline = time.monotonic() + 5
    bodies = []
    while len(bodies) < 5 and time.monotonic() < deadline:
        method, _, body = fresh.basic_get("steady", auto_ack=True)
        if method is not None:
            bodies.append(body)
    assert bodies == [b"0", b"50", b"100", b"150", b"fresh"]
    client.close()
    bystander.close()
