"""A WebSocket client on a raw socket, for what a well-behaved client library will not
send (one frame announcing more than it sends, a frame of any size)."""

from __future__ import annotations

import base64
import os
import socket
import struct


def upgraded(url: str, subprotocol: str) -> socket.socket:
    """A socket to ``url`` (``ws://host:port/path``) after a 101 answer to an upgrade
    asking for ``subprotocol``; its timeout is 5 s."""
    address, _, path = url.split("//", 1)[1].partition("/")
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        f"GET /{path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n".encode()
        + b"Sec-WebSocket-Key: " + base64.b64encode(os.urandom(16)) + b"\r\n"
        + f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {subprotocol}\r\n\r\n".encode()
    )
    sock.settimeout(5)
    response = b""
    while b"\r\n\r\n" not in response:
        response += sock.recv(4096)
    assert response.startswith(b"HTTP/1.1 101"), response
    return sock


def frame_head(opcode: int, length: int) -> bytes:
    """The head of a final client frame of ``length`` bytes (0x81 text, 0x82 binary),
    masked with a zero key: the payload follows as it is."""
    return bytes([0x80 | opcode, 0xFF]) + struct.pack(">Q", length) + b"\0\0\0\0"


def read_until_closed(sock: socket.socket) -> tuple[bool, bytes]:
    """What the broker sends on ``sock`` until it closes the connection (True) or goes
    quiet for the socket's timeout (False), and whether it closed."""
    answer = b""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True, answer
            answer += data
    except ConnectionResetError:
        return True, answer
    except TimeoutError:
        return False, answer
