"""``leveret server`` as a subprocess, for tests that need a real process (signals,
restarts, kill -9)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

#: LEVERET_TEST_WORKERS=N: the tests' in-process brokers run N connection workers
#: (``leveret server --workers N``), so the suite checks that mode too.
TEST_WORKERS = int(os.environ.get("LEVERET_TEST_WORKERS", "0"))

class ServerProcess:
    """A ``leveret server`` subprocess; ``port`` parsed from its ready line."""

    def __init__(self, data_dir: Path, *args: str, new_session: bool = False) -> None:
        # The log goes to a file: an unread pipe would block a chatty broker.
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        # The child keeps its own copy of the descriptor: ours is closed at once.
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "leveret", "server", "--amqp-port", "0", "--stomp-port", "0",
                 "--web-stomp-port", "0", "--web-mqtt-port", "0",
                 "--mqtt-port", "0", "--prometheus-port", "0", "--data-dir", str(data_dir), *args],
                stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=new_session)
        line = self.proc.stdout.readline()
        match = re.match(
            r"leveret ready: amqp://([\d.]+):(\d+)(?: stomp://[\d.]+:(\d+))?(?: mqtt://[\d.]+:(\d+))?", line
        )
        if not match:
            self.proc.kill()
            raise RuntimeError(f"no ready line: {line!r} {self.log_path.read_text()}")
        self.host, self.port = match.group(1), int(match.group(2))
        self.stomp_port = int(match.group(3)) if match.group(3) else None
        self.mqtt_port = int(match.group(4)) if match.group(4) else None
        self.url = f"amqp://guest:guest@{self.host}:{self.port}/%2F"
        self.http_url = None
        if "--http-port" in args:  # the management API's line follows the ready line
            line = self.proc.stdout.readline()
            self.http_url = line.split()[-1].removesuffix("/api/")

    def terminate(self, timeout: float = 10) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def ctl_rows(data_dir: Path, *args: str) -> list[list[str]]:
    """``leveret ctl -q ARGS`` on the server of ``data_dir``, in a subprocess (30 s at the
    most); a listing's rows under its header, split at tabs. It must exit 0."""
    command = [sys.executable, "-m", "leveret", "ctl", "--data-dir", str(data_dir), "-q", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    return [line.split("\t") for line in result.stdout.splitlines()[1:]]
