"""A full disk loses nothing confirmed: on a small tmpfs data directory, filled by the
broker's own messages and by another file, publishers are blocked and their confirms
wait instead of being sent for what is not on disk; when room returns, everything
confirmed is there, after a restart too. Needs permission to mount a tmpfs (root);
skipped otherwise."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from pathlib import Path

import pika
import pytest
from eventually import eventually
from servers import ServerProcess

DISK_MB = 64
RESERVE = 8 * 1024 * 1024


@pytest.fixture
def small_disk(tmp_path: Path):
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(mount)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(path: Path, leave: int) -> None:
    """Write ``path`` until only about ``leave`` bytes are free (or the disk is full)."""
    chunk = b"\0" * (1024 * 1024)
    with open(path, "wb") as filler, contextlib.suppress(OSError):
        while os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize > leave + len(chunk):
            filler.write(chunk)
            filler.flush()


def start(disk: Path, config: Path) -> ServerProcess:
    return ServerProcess(disk / "data", "--config", str(config))


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "leveret.toml"
    path.write_text(f"[server]\ndisk_free_limit = 1000000\ndisk_reserve = {RESERVE}\n")
    return path


class Publisher(threading.Thread):
    """Publishes id-numbered persistent messages with confirms until told to stop;
    ``confirmed`` holds the ids the broker confirmed."""

    def __init__(self, url: str, queue: str, size: int, properties: pika.BasicProperties) -> None:
        super().__init__(daemon=True)
        self.url, self.queue, self.size, self.properties = url, queue, size, properties
        self.confirmed: list[int] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self.url))
            channel = connection.channel()
            channel.confirm_delivery()
            number = 0
            while not self.stop.is_set():
                body = number.to_bytes(8, "big") + os.urandom(self.size - 8)  # incompressible
                channel.basic_publish("", self.queue, body, self.properties)
                self.confirmed.append(number)
                number += 1
            connection.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def drain(url: str, queue: str) -> set[int]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    ids = set()
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        ids.add(int.from_bytes(body[:8], "big"))
    connection.close()
    return ids


@pytest.mark.parametrize("kind", ["persistent", "paged-transient"])
def test_confirmed_messages_survive_a_full_disk(small_disk, config, kind):
    server = start(small_disk, config)
    try:
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        channel = connection.channel()
        arguments = {"x-max-in-memory-length": 10} if kind == "paged-transient" else {}
        channel.queue_declare("q", durable=True, arguments=arguments)
        connection.close()
        mode = 2 if kind == "persistent" else 1
        publisher = Publisher(server.url, "q", 16 * 1024, pika.BasicProperties(delivery_mode=mode))
        publisher.start()
        assert eventually(lambda: len(publisher.confirmed) > 200, 30, 0.05)
        fill(small_disk / "filler", leave=RESERVE // 2)  # another program takes the rest
        time.sleep(2)  # the publisher runs into the full disk: blocked, confirms wait
        stuck = len(publisher.confirmed)
        time.sleep(1)
        assert len(publisher.confirmed) <= stuck + 1  # nothing more is confirmed meanwhile
        assert server.proc.poll() is None
        (small_disk / "filler").unlink()  # room returns
        resumed = eventually(lambda: len(publisher.confirmed) > stuck + 50, 30, 0.05)
        assert resumed, "publishing did not resume: " + server.log_path.read_text()[-3000:]
        publisher.stop.set()
        publisher.join(30)
        assert publisher.error is None
        confirmed = set(publisher.confirmed)
        if kind == "persistent":  # and after a restart
            server.terminate()
            server = start(small_disk, config)
        assert confirmed <= drain(server.url, "q")
    finally:
        server.kill()


def test_a_durable_declare_ok_waits_until_the_queue_is_on_disk(small_disk, config):
    """While the store cannot write (here: a persistent message that does not fit in
    what the reserve leaves), a durable queue.declare gets its -ok only once the queue
    is on disk, and it survives a restart."""
    server = start(small_disk, config)
    try:
        setup = pika.BlockingConnection(pika.URLParameters(server.url))
        setup.channel().queue_declare("q", durable=True)
        setup.close()
        fill(small_disk / "filler", leave=RESERVE // 2)
        publisher = Publisher(server.url, "q", 16 * 1024, pika.BasicProperties(delivery_mode=2))
        publisher.start()  # its first message cannot be written: the store waits for room
        time.sleep(1)
        assert publisher.confirmed == []
        answers: list[str] = []

        def declare() -> None:
            connection = pika.BlockingConnection(pika.URLParameters(server.url))
            connection.channel().queue_declare("kept", durable=True)
            answers.append("declare-ok")
            connection.close()

        declarer = threading.Thread(target=declare, daemon=True)
        declarer.start()
        time.sleep(2)
        assert answers == []  # not on disk yet: no declare-ok
        (small_disk / "filler").unlink()
        declarer.join(30)
        assert answers == ["declare-ok"]
        publisher.stop.set()
        publisher.join(30)
        server.terminate()
        server = start(small_disk, config)
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        connection.channel().queue_declare("kept", passive=True)  # it survived the restart
        connection.close()
    finally:
        server.kill()
