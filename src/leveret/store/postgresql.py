"""The shared store: PostgreSQL (psycopg 3), for a master and standbys.

Everything the SQLite store keeps, kept the same way (:class:`~.batched.BatchedStore`:
group commit, one transaction per batch, background chunked range deletions), in the
tables of one PostgreSQL schema per cluster (``cluster`` names it, default
``leveret``). A confirm or commit-ok goes out only after PostgreSQL has committed
(``synchronous_commit`` as the server is configured: ``on`` by default, ``remote_apply``
to wait for a replica as well).

Master and standbys: the broker whose writer session holds the session-level advisory
lock ``pg_advisory_lock(hashtext('leveret'), hashtext(cluster))`` is the master; every
write goes through that same session, so a broker that lost the lock cannot write
either. Others wait in :meth:`PostgreSQLStore.wait_for_master`. The lock goes with the
session: a master killed or cut off from the database lets a standby in as soon as
PostgreSQL sees the session end, and the old master, finding its session gone (a failed
write or the writer's ping every :data:`PING_EVERY` s), is fenced (``on_fenced``).
Unlike ActiveMQ's JDBC lock table there is no lease to renew and no row to poll. Both
ends of the writer's session use short TCP keepalives (:data:`KEEPALIVES`,
:data:`SERVER_KEEPALIVES`), so a master whose machine vanished loses the lock in about
5 s, not after the server's default two hours.

The schema is created and migrated by leveret (table ``schema_version``), under the
master lock, never by hand.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .base import StoreError
from .batched import BatchedStore, Connection

log = logging.getLogger("leveret.store")

PING_EVERY = 0.5  # seconds between the idle writer's checks that its session lives
RETRY_CONNECT = 1.0  # seconds between a standby's attempts to reach the database
POLL_LOCK = 0.1  # seconds between a standby's attempts to take the master lock
#: libpq keepalives: a master cut off from the database notices within ~5 s.
KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": 5000,
    "connect_timeout": 5,
}

#: The same on PostgreSQL's side of the writer's session (seconds; ms for the timeout):
#: the server ends a dead master's session, and frees the lock, within about 5 s.
SERVER_KEEPALIVES = {
    "tcp_keepalives_idle": 2,
    "tcp_keepalives_interval": 1,
    "tcp_keepalives_count": 3,
    "tcp_user_timeout": 5000,
}

#: Migrations, in order: the schema is at version ``len(MIGRATIONS)``. Never edit one
#: that has shipped; append.
MIGRATIONS = [
    """
    CREATE TABLE definitions (
        ord BIGINT GENERATED ALWAYS AS IDENTITY, kind TEXT NOT NULL, vhost TEXT NOT NULL,
        name TEXT NOT NULL, data BYTEA NOT NULL, PRIMARY KEY (kind, vhost, name));
    CREATE TABLE messages (
        id BIGINT PRIMARY KEY, queue_id BIGINT NOT NULL, seq BIGINT NOT NULL,
        delivery_count INTEGER NOT NULL, exchange TEXT NOT NULL, routing_key TEXT NOT NULL,
        header BYTEA NOT NULL, body BYTEA NOT NULL, transient SMALLINT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL, published_at DOUBLE PRECISION NOT NULL,
        size BIGINT NOT NULL, meta TEXT, available_at DOUBLE PRECISION NOT NULL DEFAULT 0);
    -- bodies are stored as they came: compressing them costs CPU on every publish
    ALTER TABLE messages ALTER COLUMN body SET STORAGE EXTERNAL;
    CREATE INDEX messages_by_queue ON messages (queue_id, seq) INCLUDE (size);
    CREATE INDEX messages_transient ON messages (id) WHERE transient=1;
    CREATE INDEX messages_expiring ON messages (queue_id, expires_at) WHERE expires_at > 0;
    CREATE TABLE pending_deletes (
        ord BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, queue_id BIGINT NOT NULL,
        low BIGINT NOT NULL, high BIGINT NOT NULL);
    CREATE TABLE meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL);
    CREATE TABLE dedup (
        ord BIGINT GENERATED ALWAYS AS IDENTITY, queue_id BIGINT NOT NULL, key TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (queue_id, key));
    CREATE TABLE scheduled (
        id BIGINT PRIMARY KEY, vhost TEXT NOT NULL, job_id TEXT NOT NULL,
        due_at DOUBLE PRECISION NOT NULL, exchange TEXT NOT NULL, routing_key TEXT NOT NULL,
        header BYTEA NOT NULL, body BYTEA NOT NULL, meta TEXT, schedule TEXT NOT NULL,
        transient SMALLINT NOT NULL);
    CREATE INDEX scheduled_by_due ON scheduled (due_at, id);
    CREATE INDEX scheduled_by_job ON scheduled (job_id);
    """,
    # 2: failed deliveries counted apart from deliveries (RabbitMQ 4.3's delivery-count)
    """
    ALTER TABLE messages ADD COLUMN failed_count INTEGER NOT NULL DEFAULT 0;
    """,
]


def redact(url: str) -> str:
    """``url`` without its password, for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


_ESCAPED = re.compile(r"\\(.)", re.DOTALL)


def escape_text(text: str) -> str:
    """A string PostgreSQL's ``text`` can hold: NUL (legal in AMQP names and routing
    keys, refused by PostgreSQL) as ``\\0``, a backslash doubled."""
    if "\\" in text or "\x00" in text:
        return text.replace("\\", "\\\\").replace("\x00", "\\0")
    return text


def unescape_text(text: str) -> str:
    """The inverse of :func:`escape_text`."""
    if "\\" not in text:
        return text
    return _ESCAPED.sub(lambda m: "\x00" if m.group(1) == "0" else m.group(1), text)


def _text_adapters(conn: Any) -> None:
    """Every string in and out of ``conn`` goes through escape_text / unescape_text."""
    from psycopg.types.string import StrDumperUnknown, TextLoader

    class Dumper(StrDumperUnknown):
        def dump(self, obj: str) -> Any:
            return super().dump(escape_text(obj))

    class Loader(TextLoader):
        def load(self, data: Any) -> str:
            return unescape_text(str(super().load(data)))

    conn.adapters.register_dumper(str, Dumper)
    conn.adapters.register_loader("text", Loader)


class PgConnection:
    """A psycopg connection in autocommit mode that takes ``?`` placeholders (the SQL
    of :class:`BatchedStore` is written once, for both stores)."""

    def __init__(self, conn: Any, reopen: Callable[[], Any] | None = None) -> None:
        self.conn = conn
        #: makes a new session when this one broke (the reader's: reads may go on)
        self.reopen = reopen
        self._sql: dict[str, str] = {}

    def _q(self, sql: str) -> str:
        text = self._sql.get(sql)
        if text is None:
            text = self._sql[sql] = sql.replace("?", "%s")
        return text

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Any:
        try:
            return self.conn.execute(self._q(sql), params or None)
        except Exception:
            if self.reopen is None or not self.conn.broken:
                raise
            self.conn = self.reopen()  # once: a second failure is the caller's
            return self.conn.execute(self._q(sql), params or None)

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> Any:
        with self.conn.cursor() as cursor:
            cursor.executemany(self._q(sql), params)

    def close(self) -> None:
        self.conn.close()


class PostgreSQLStore(BatchedStore):
    """The store in PostgreSQL at ``url`` (``postgresql://user:pass@host:port/db``),
    schema ``cluster``. StoreError (naming the URL, without its password) when the
    database cannot be reached or read."""

    _order = "ord"
    _idle_every = PING_EVERY

    def __init__(self, url: str, cluster: str = "leveret") -> None:
        super().__init__(redact(url))
        import psycopg  # only a broker that uses PostgreSQL loads the driver

        self._psycopg = psycopg
        self._errors = (psycopg.Error,)
        self.url = url
        self.cluster = cluster
        #: when the master lock was taken (monotonic seconds), None while standby
        self.master_since: float | None = None
        #: why the last attempt to reach the database failed (None: it did not)
        self.unreachable: str | None = None

    def _open(self, role: str) -> PgConnection:
        return PgConnection(self._session(role), (lambda: self._session(role)) if role == "reader" else None)

    def _session(self, role: str) -> Any:
        conn = self._psycopg.connect(
            self.url, autocommit=True, application_name=f"leveret-{role}", **KEEPALIVES
        )
        _text_adapters(conn)
        if role == "writer":
            # The lock lives as long as PostgreSQL's end of this session: a master whose
            # machine died must not hold it for the server's default 2 h of keepalive.
            for setting, value in SERVER_KEEPALIVES.items():
                try:
                    conn.execute(f"SET {setting} = {value}")
                except self._psycopg.Error as exc:  # an old server, a pooler: still usable
                    log.warning("store %s: cannot SET %s: %s", self.name, setting, exc)
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self._schema()}"')
        conn.execute(f'SET search_path TO "{self._schema()}"')
        return conn

    def _schema(self) -> str:
        return self.cluster.replace('"', "")

    # -- the master lock ---------------------------------------------------------------
    def try_master(self) -> bool:
        """One attempt to become the master: connect the writer's session if needed and
        try the lock. OSError-free: a database that cannot be reached is False."""
        try:
            if self._db is None:
                self._db = self._open("writer")
            row = self._db.execute(
                "SELECT pg_try_advisory_lock(hashtext('leveret'), hashtext(?))", (self.cluster,)
            ).fetchone()
        except self._psycopg.Error as exc:
            log.debug("store %s: cannot take the master lock: %s", self.name, exc)
            self.unreachable = str(exc).strip()
            self._drop_writer()
            return False
        self.unreachable = None
        if row[0]:
            self.master_since = time.monotonic()
            return True
        return False

    def wait_for_master(self, cancel: threading.Event, first_after: float = 0.0) -> bool:
        """Block until this broker holds the master lock (True) or ``cancel`` is set
        (False), trying first after ``first_after`` seconds. Logs once that it is a
        standby, and why while it cannot connect."""
        said: str | None = None  # what was last logged
        if cancel.wait(first_after):
            return False
        while not cancel.is_set():
            if self.try_master():
                return True
            if self._db is None:  # cannot connect
                if said != "unreachable":
                    log.warning("store %s: standby: the database cannot be reached, retrying", self.name)
                    said = "unreachable"
                cancel.wait(RETRY_CONNECT)
                continue
            if said != "standby":
                log.info("store %s: standby: cluster %r has another master", self.name, self.cluster)
                said = "standby"
            cancel.wait(POLL_LOCK)
        return False

    def _drop_writer(self) -> None:
        if self._db is not None:
            try:
                self._db.close()
            except self._psycopg.Error:
                pass
            self._db = None

    # -- BatchedStore's hooks ---------------------------------------------------------------
    def _connect(self) -> Connection:
        """The writer's session, which must hold the master lock (StoreError if it
        cannot get it now), with the schema migrated to the latest version."""
        if self.master_since is None and not self.try_master():
            if self.unreachable is not None:
                raise StoreError(f"cannot open store {self.name}: {self.unreachable}")
            raise StoreError(f"store {self.name}: not the master of cluster {self.cluster!r}")
        db = self._db
        assert db is not None
        try:
            self._migrate(db)
        except self._psycopg.Error as exc:
            raise StoreError(f"cannot open store {self.name}: {exc}") from None
        return db

    def _migrate(self, db: Connection) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = db.execute("SELECT max(version) FROM schema_version").fetchone()
        version = row[0] or 0
        if version > len(MIGRATIONS):
            raise StoreError(
                f"store {self.name}: schema version {version} is newer than this leveret "
                f"knows ({len(MIGRATIONS)}): upgrade leveret"
            )
        for number in range(version + 1, len(MIGRATIONS) + 1):
            db.execute("BEGIN")
            db.execute(MIGRATIONS[number - 1])
            db.execute("INSERT INTO schema_version VALUES (?)", (number,))
            db.execute("COMMIT")
            log.info("store %s: schema migrated to version %d", self.name, number)

    def _connect_reader(self) -> Connection:
        return self._open("reader")

    def _idle(self, db: Connection) -> None:
        db.execute("SELECT 1")

    def _lost_session(self, exc: BaseException) -> bool:
        db = self._db
        return isinstance(exc, self._psycopg.OperationalError) and (
            db is None or (isinstance(db, PgConnection) and db.conn.broken)
        )

    def _out_of_room(self, exc: BaseException) -> bool:
        return isinstance(exc, self._psycopg.errors.DiskFull)
