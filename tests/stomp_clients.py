"""stomp.py clients for the STOMP tests: a connection of a given version whose
listener collects what the broker sends, so tests wait for a MESSAGE, a RECEIPT or an
ERROR instead of sleeping."""

from __future__ import annotations

import queue
import socket
import time
from typing import Any

import stomp
from eventually import eventually
from stomp.utils import Frame

CLASSES = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}


class Collector(stomp.ConnectionListener):
    """Every MESSAGE, RECEIPT and ERROR, in order of arrival."""

    def __init__(self) -> None:
        self.messages: queue.Queue[Frame] = queue.Queue()
        self.receipts: queue.Queue[str] = queue.Queue()
        self.errors: queue.Queue[Frame] = queue.Queue()
        self.disconnected = False

    def on_message(self, frame: Frame) -> None:
        self.messages.put(frame)

    def on_receipt(self, frame: Frame) -> None:
        self.receipts.put(frame.headers["receipt-id"])

    def on_error(self, frame: Frame) -> None:
        self.errors.put(frame)

    def on_disconnected(self) -> None:
        self.disconnected = True


class Client:
    """One stomp.py connection of ``version`` to ``port``, logged in as ``login``."""

    def __init__(self, port: int, version: str = "1.2", login: str = "guest", passcode: str = "guest",
                 wait: bool = True, **connect_headers: Any) -> None:
        self.version = version
        self.conn = CLASSES[version]([("127.0.0.1", port)], auto_decode=False)
        self.events = Collector()
        self.conn.set_listener("collector", self.events)
        self.conn.connect(login, passcode, wait=wait, **connect_headers)
        self._ids = 0

    # -- sending --------------------------------------------------------------------
    def subscribe(self, destination: str, ack: str = "auto", **headers: Any) -> str:
        """SUBSCRIBE and wait for its receipt (so no MESSAGE is missed); the id."""
        self._ids += 1
        sub_id = headers.pop("id", str(self._ids))
        receipt = f"sub-{sub_id}"
        if self.version == "1.0":
            self.conn.subscribe(destination, id=sub_id, ack=ack, receipt=receipt, **headers)
        else:
            self.conn.subscribe(destination, sub_id, ack=ack, receipt=receipt, **headers)
        self.wait_receipt(receipt)
        return sub_id

    def send(self, destination: str, body: bytes | str, receipt: bool = True, **headers: Any) -> None:
        """SEND (with a receipt waited for, unless ``receipt`` is false)."""
        if receipt:
            self._ids += 1
            headers["receipt"] = f"send-{self._ids}"
        self.conn.send(destination, body, headers=headers)
        if receipt:
            self.wait_receipt(headers["receipt"])

    def ack(self, frame: Frame, **headers: Any) -> None:
        if self.version == "1.2":
            self.conn.ack(frame.headers["ack"], **headers)
        elif self.version == "1.1":
            self.conn.ack(frame.headers["message-id"], frame.headers["subscription"], **headers)
        else:
            self.conn.ack(frame.headers["message-id"], **headers)

    def nack(self, frame: Frame, **headers: Any) -> None:
        if self.version == "1.2":
            self.conn.nack(frame.headers["ack"], **headers)
        else:
            self.conn.nack(frame.headers["message-id"], frame.headers["subscription"], **headers)

    # -- waiting --------------------------------------------------------------------
    def message(self, timeout: float = 5.0) -> Frame:
        """The next MESSAGE (AssertionError after ``timeout`` seconds)."""
        try:
            return self.events.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no MESSAGE within {timeout} s") from None

    def no_message(self, within: float = 0.3) -> None:
        try:
            frame = self.events.messages.get(timeout=within)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected MESSAGE {frame.headers} {frame.body!r}")

    def wait_receipt(self, receipt: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.events.receipts.get(timeout=0.05) == receipt:
                    return
            except queue.Empty:
                if not self.events.errors.empty():
                    raise AssertionError(
                        f"ERROR instead of receipt: {self.events.errors.queue[0].headers}") from None
        raise AssertionError(f"no RECEIPT {receipt} within {timeout} s")

    def error(self, timeout: float = 5.0) -> Frame:
        try:
            return self.events.errors.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no ERROR within {timeout} s") from None

    def wait_disconnected(self, timeout: float = 5.0) -> None:
        closed = eventually(lambda: not self.conn.is_connected(), timeout)
        assert closed, "the broker did not close the connection"

    def close(self) -> None:
        if self.conn.is_connected():
            try:
                self.conn.disconnect()
            except (OSError, stomp.exception.NotConnectedException):
                pass  # the broker closed it meanwhile (after an ERROR): stomp.py's socket is gone

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_raw_frame(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """The bytes a raw socket receives up to the end of one frame (its NUL), or up to
    the end of the stream; ``timeout`` seconds for each read."""
    sock.settimeout(timeout)
    data = b""
    while b"\x00" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data
